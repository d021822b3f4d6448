"""Test ids as real repositories make them: parametrized ids with any characters, data-driven
cases, unittest classes (inherited tests included) and a src/ layout, named in the sandbox exactly
as plain pytest names them; synthesis over such a project, and why an unstable mutant is dropped."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hostile_fixture import make_hostile_project

from sandboxes import Limits, open_sandbox
from tasks_lib import load_task
from tasks_lib.format.node_ids import TEST_ID_PATTERN, checkable_test_ids
from tasks_lib.sources.synthesize import SourceMutation, evaluate_mutants, synthesize_tasks
from tasks_lib.sources.synthesize.mutants import flipped_tests, unstable_reason
from tasks_lib.sources.synthesize.pipeline import stable_passing
from tasks_lib.sources.synthesize.project import add_src_shim, copy_clean
from tasks_lib.verify import run_pytest

HOSTILE_IDS = (
    "tests/test_ids.py::test_format[1985-4-12-%Y-%m-%d-1985-04-12]",
    "tests/test_ids.py::test_format[2024-1-2-+%Y [%m] %d-+2024 [01] 02]",
    "tests/test_ids.py::test_format[7-11-30-%Y:%m:%d-0007:11:30]",
    "tests/test_ids.py::test_format[2000-2-29-100%% %d-100% 29]",
    "tests/test_ids.py::test_pad[with space [x] %s + -1]",
    "tests/test_ids.py::test_pad[a::b]",
    "tests/test_ids.py::test_pad[12:30]",
    "tests/test_ids.py::test_pad[na\\xefve-\\u65e5\\u672c]",
    "tests/test_data.py::test_leap[1900 (century) \\u2014 not leap]",
    "tests/test_data.py::test_leap[2000 [400 rule]]",
    "tests/test_unit.py::TestClamp::test_low",  # inherited from tests/base_cases.py
    "tests/test_unit.py::TestPad::test_negative",
)
VARYING = "tests/test_ids.py::test_varying"


def _plain_pytest_ids(project: Path) -> set[str]:
    """What `pytest --collect-only -q` prints on the host, the package put on the path as an
    editable install would."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=project, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONPATH": str(project / "src"), "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"},
    )  # fmt: skip
    assert collected.returncode == 0, collected.stdout + collected.stderr
    return {line for line in collected.stdout.splitlines() if "::" in line}


@pytest.fixture(scope="module")
def hostile(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_hostile_project(tmp_path_factory.mktemp("hostile") / "dateish")


def test_every_hostile_id_is_a_valid_checkable_test_id(hostile: Path) -> None:
    for test_id in HOSTILE_IDS:
        assert TEST_ID_PATTERN.match(test_id), test_id
    # The inherited unittest method is not defined in its file, so the loader cannot check it.
    assert checkable_test_ids(hostile, HOSTILE_IDS) == HOSTILE_IDS[:-2] + HOSTILE_IDS[-1:]


def test_the_sandbox_run_names_tests_as_plain_pytest_does(hostile: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    copy_clean(hostile, workspace)
    add_src_shim(workspace)
    runs = []
    with open_sandbox(workspace, backend="bwrap", limits=Limits(wall_time_s=120)) as sandbox:
        for _ in range(2):
            runs.append(run_pytest(sandbox, ("tests",), timeout_s=120))
            sandbox.reset()
    plain = _plain_pytest_ids(hostile)
    for run in runs:
        assert run.broken == ""
        assert set(run.outcomes.values()) == {"passed"}
        stable = {i for i in run.outcomes if not i.startswith(VARYING)}
        assert stable == {i for i in plain if not i.startswith(VARYING)}
        assert set(HOSTILE_IDS) <= stable
        assert sum(i.startswith(VARYING) for i in run.outcomes) == 2
    passing, flaky, varying = stable_passing([run.outcomes for run in runs])
    assert (flaky, varying) == ([], [VARYING])
    assert set(passing) == {i for i in plain if not i.startswith(VARYING)}


def test_synthesis_keeps_checked_tasks_on_hostile_ids_same_seed_same_tasks(
    hostile: Path, tmp_path: Path
) -> None:
    # The second run skips the oracle check (the first one's is the check; this one is about
    # choosing the same mutants and tests again).
    reports = [
        synthesize_tasks(
            hostile, tmp_path / f"out{n}", max_tasks=2, max_mutants=8, seed=5, check=n == 0
        )
        for n in range(2)
    ]
    first = reports[0]
    assert first.tasks_kept == 2 and first.check_failures == (), first.to_json()
    assert first.varying_ids == (VARYING,) and first.flaky_baseline == ()
    assert first.baseline_tests == 19  # 21 collected, the 2 varying ones left out
    names = [[Path(p).name for p in report.task_dirs] for report in reports]
    assert names[0] == names[1]
    expected = set()
    for one, two in zip(reports[0].task_dirs, reports[1].task_dirs, strict=True):
        task = load_task(one)
        same = load_task(two)
        assert (task.fail_to_pass, task.pass_to_pass) == (same.fail_to_pass, same.pass_to_pass)
        assert not any(t.startswith(VARYING) for t in task.expected_tests)
        expected |= set(task.expected_tests)
    assert {i for i in HOSTILE_IDS if i != "tests/test_unit.py::TestClamp::test_low"} <= expected


def test_an_unstable_mutant_says_which_tests_flipped_and_why(hostile: Path, tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    copy_clean(hostile, workspace)
    add_src_shim(workspace)
    source = (workspace / "src/dateish/fmt.py").read_bytes()
    # A mutant whose failure message holds a value drawn afresh on every run.
    original = b"text = str(abs(number))"
    start = source.index(original)
    mutation = SourceMutation(
        "return_value", "src/dateish/fmt.py", "pad", 5, start, start + len(original),
        original.decode(), "text = str(abs(number)) + __import__('uuid').uuid4().hex",
    )  # fmt: skip
    baseline = ("tests/test_ids.py::test_pad[12:30]", "tests/test_unit.py::TestClamp::test_low")
    [result] = evaluate_mutants(
        str(workspace), ("tests/test_ids.py", "tests/test_unit.py"), baseline, baseline,
        (mutation,), timeout_s=120,
    )  # fmt: skip
    assert result.verdict == "unstable"
    assert result.why.startswith("message_differs")
    [(test_id, first, later)] = result.flips
    assert test_id == "tests/test_ids.py::test_pad[12:30]"
    assert first.startswith("failed: ") and later.startswith("failed: ") and first != later


@pytest.mark.parametrize(
    ("first", "later", "why"),
    [
        ({"t.py::f[a]": "missing: "}, {}, "ids_vary"),
        ({"t.py::f": "failed: Timeout >5.0s"}, {}, "timing"),
        ({"t.py::f": "failed: assert 1 == 2"}, {}, "outcome_flips"),
        ({"t.py::f": "failed: got 3"}, {"t.py::f": "failed: got 4"}, "message_differs"),
    ],
)
def test_unstable_reasons(first: dict[str, str], later: dict[str, str], why: str) -> None:
    flips = flipped_tests(first, later)
    assert flips and unstable_reason(flips).startswith(why + ":")


def test_report_ids_come_from_the_node_id_property() -> None:
    from tasks_lib.verify.junit import NODEID_PROPERTY, parse_junit

    def case(name: str, *node_ids: str, failed: bool = False) -> str:
        props = "".join(f'<property name="{NODEID_PROPERTY}" value="{i}"/>' for i in node_ids)
        failure = '<failure message="boom"/>' if failed else ""
        return (f'<testcase classname="tests.test_x" name="{name}" file="tests/base.py">'
                f"<properties>{props}</properties>{failure}</testcase>")  # fmt: skip

    report = parse_junit(
        (
            "<testsuites><testsuite>"
            + case("test_a", "tests/test_x.py::T::test_a[12:30 %Y [x]]")
            + case("test_b")  # no property: rebuilt from file, classname and name
            + case("test_c", "tests/test_x.py::test_c", "tests/test_x.py::test_z", failed=True)
            + "</testsuite></testsuites>"
        ).encode()
    )
    assert dict(report.outcomes) == {
        "tests/test_x.py::T::test_a[12:30 %Y [x]]": "passed",
        "tests/base.py::test_b": "passed",
    }


def test_a_test_module_inside_the_library_is_its_own_test_path(
    hostile: Path, tmp_path: Path
) -> None:
    """A library package holding a `test_*.py` helper (markdown's `markdown/test_tools.py`) is not
    a test directory: were it one, it would be protected and a fix inside it dropped."""
    from tasks_lib.sources.synthesize import inspect_project

    workspace = tmp_path / "workspace"
    copy_clean(hostile, workspace)
    (workspace / "src/dateish/test_tools.py").write_text("def helper():\n    return 1\n")
    layout = inspect_project(workspace)
    assert layout.test_paths == ("src/dateish/test_tools.py", "tests")
    assert layout.protected == ("tests/**",)
    assert "src/dateish/fmt.py" in layout.library_files
