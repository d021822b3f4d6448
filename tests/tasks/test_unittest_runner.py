"""Tasks whose suite is unittest-based (Django's `tests/runtests.py`, `python -m unittest`), with
SWE-bench's `test_name (module.Class)` ids: outcomes per test from the runner's own result hooks,
not from a log the code under test can print into."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks_lib import check_task, load_task, verify
from tasks_lib.errors import TaskValidationError
from tasks_lib.sources.authoring import TaskFiles, write_task
from tasks_lib.verify import CandidateChanges

BUGGY = "def area(width, height):\n    return width + height\n"
FIXED = "def area(width, height):\n    return width * height\n"
UNIT_TESTS = (
    "import unittest\nfrom geometry import area\n\n\nclass AreaTests(unittest.TestCase):\n"
    "    def test_square(self):\n        self.assertEqual(area(2, 2), 4)\n\n"
    "    def test_rectangle(self):\n        self.assertEqual(area(2, 5), 10)\n\n"
    "    def test_parts(self):\n"
    "        for width in (1, 3):\n"
    "            with self.subTest(width=width):\n"
    "                self.assertEqual(area(width, 1), width)\n"
)
RUNTESTS = (
    "import os, sys, unittest\n"
    "sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))\n"
    "labels = [a for a in sys.argv[1:] if not a.startswith('-')]\n"
    "result = unittest.TextTestRunner(verbosity=2).run(\n"
    "    unittest.defaultTestLoader.loadTestsFromNames(labels))\n"
    "sys.exit(len(result.failures) + len(result.errors))  # Django exits with the count\n"
)
F2P = [
    "test_rectangle (geometry_tests.tests.AreaTests)",
    "test_parts (geometry_tests.tests.AreaTests)",
]
P2P = ["test_square (geometry_tests.tests.AreaTests)"]


def _task(out: Path, test_command: str, package: str = "") -> Path:
    """The task; `package` prefixes the test modules (`tests.` when unittest's own loader
    resolves them from the workspace root, tests/ then being a package)."""
    workspace = {
        "geometry.py": BUGGY,
        "tests/runtests.py": RUNTESTS,
        "tests/geometry_tests/__init__.py": "",
        "tests/geometry_tests/tests.py": UNIT_TESTS,
    }
    if package:
        workspace["tests/__init__.py"] = ""

    def ids(names: list[str]) -> list[str]:
        return [name.replace(" (", f" ({package}") for name in names]

    files = TaskFiles(
        task_id="unit-geometry",
        instruction="Fix area().\n",
        workspace=workspace,
        rollyard={
            "test_runner": "unittest",
            "test_command": test_command,
            "fail_to_pass": ids(F2P),
            "pass_to_pass": ids(P2P),
        },
        solve_sh=f"#!/bin/bash\ncat > geometry.py <<'EOF'\n{FIXED}EOF\n",
    )
    return write_task(files, out / "unit-geometry")


@pytest.mark.parametrize(
    ("command", "package"),
    [("tests/runtests.py --verbosity 2", ""), ("python -m unittest --buffer", "tests.")],
)
def test_django_style_ids_are_scored_per_test(tmp_path: Path, command: str, package: str) -> None:
    task = load_task(_task(tmp_path, command, package))
    assert task.test_runner == "unittest" and len(task.fail_to_pass) == 2
    untouched = verify(task)
    assert untouched.status == "ok" and untouched.reward == 0.0
    assert untouched.tests[task.pass_to_pass[0]] == "passed"
    assert all(untouched.tests[t] == "failed" for t in task.fail_to_pass)  # a subtest failing too
    fixed = verify(task, CandidateChanges(files={"geometry.py": FIXED.encode()}))
    assert (fixed.status, fixed.reward) == ("ok", 1.0), fixed.detail


def test_oracle_check_and_a_spoofed_log_scores_zero(tmp_path: Path) -> None:
    task = load_task(_task(tmp_path, "tests/runtests.py --verbosity 2"))
    assert check_task(task).ok
    # The candidate prints what a verbose unittest log says for passing tests, then dies before
    # any test runs: a log parser would count them; the recorder saw none.
    spoof = (
        "import os, sys\n"
        + "".join(f"sys.stderr.write({f'{t} ... ok' + chr(10)!r})\n" for t in (*F2P, *P2P))
        + "sys.stderr.flush()\nos._exit(0)\n"
    )
    result = verify(task, CandidateChanges(files={"geometry.py": spoof.encode()}))
    assert result.reward == 0.0
    assert set(result.tests.values()) <= {"missing", "error", "failed"}


def test_unittest_ids_and_command_are_validated(tmp_path: Path) -> None:
    files = TaskFiles(
        task_id="bad-unit", instruction="x\n", workspace={"a.py": ""},
        rollyard={"test_runner": "unittest", "test_command": "pytest -q",
                  "fail_to_pass": ["tests/test_a.py::test_x"]},
        solve_sh="#!/bin/bash\ntrue\n",
    )  # fmt: skip
    with pytest.raises(TaskValidationError) as raised:
        load_task(write_task(files, tmp_path / "bad-unit"))
    text = str(raised.value)
    assert "is not a unittest test id" in text
    assert "must run 'python -m unittest' or a runner script" in text
