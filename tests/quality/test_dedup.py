"""What makes two tasks one: fingerprints of the instruction, the change, the failing and hidden
tests (normalised for renames, formatting and order), the decision rule over them, the
decontamination policies, duplicates against earlier admitted batches read from a real store,
and `rollyard curate --explain`."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tiny_tasks import BUGGY, CLEAN_TESTS, FIXED, write_task

from flows.cli import main as cli_main
from storage import TrajectoryStore
from tasks_lib import CandidateChanges, generate_demo_tasks, load_task
from tasks_lib.curate import (
    POLICIES,
    CurationSettings,
    Fingerprint,
    TaskChecks,
    TaskVerdict,
    decide,
    earlier_admitted,
    task_fingerprint,
    verdict_rows,
)
from tasks_lib.curate.fingerprint import code_lines, instruction_words, line_tokens, numbered
from tasks_lib.curate.similarity import build_eval_set

SETTINGS = CurationSettings(reruns=1)

MODULE = '''\
"""Inventory helpers."""

import math


def restock(levels, minimum, batch_size=10):
    """Levels raised to at least minimum, in whole batches."""
    result = {}
    for item_name, count in levels.items():
        missing = max(0, minimum - count)
        result[item_name] = count + math.ceil(missing / batch_size) * batch_size
    return result


class Shelf:
    def __init__(self, capacity):
        self.capacity = capacity
        self.items = []

    def put(self, label):
        if len(self.items) >= self.capacity:
            raise ValueError(f"shelf full: {label}")
        self.items.append(label)
        return len(self.items)
'''
DEFINED = ("restock", "levels", "minimum", "batch_size", "result", "item_name", "count",
           "missing", "Shelf", "capacity", "put", "label")  # fmt: skip


def _reformatted(source: str) -> str:
    """Another layout of the same code: 2-space indents, a comment per line, blank lines."""
    out = []
    for line in source.splitlines():
        stripped = line.lstrip(" ")
        indent = "  " * ((len(line) - len(stripped)) // 4)
        comment = (
            "  # noted" if stripped and not stripped.startswith(('"""', "class", "def")) else ""
        )
        out += [indent + stripped + comment, ""]
    return "\n".join(out)


@settings(max_examples=40, deadline=None)
@given(st.permutations(["alpha", "beta_2", "gamma", "Delta", "eps", "zeta_v", "eta", "theta",
                        "iota", "kappa", "lam", "mu_x", "nu", "xi"]))  # fmt: skip
def test_code_normalisation_ignores_renames_and_formatting(new_names: list[str]) -> None:
    mapping = dict(zip(DEFINED, new_names, strict=False))
    renamed = re.sub(r"\b(" + "|".join(DEFINED) + r")\b", lambda m: mapping[m.group(1)], MODULE)
    original = numbered(line_tokens(code_lines(MODULE, python=True)))
    assert numbered(line_tokens(code_lines(_reformatted(renamed), python=True))) == original
    # Literals still count: an expected value or a constant that changes is a change.
    changed = numbered(line_tokens(code_lines(MODULE.replace("10", "12"), python=True)))
    assert changed != original


def test_instruction_words_drop_phrasing_and_inflection() -> None:
    first = instruction_words("The tests are failing: please fix the function `calc.add`.")
    second = instruction_words("Fix failing test for functions in calc; add!")
    assert set(first) == set(second) == {"test", "fail", "fix", "function", "calc", "add"}


@pytest.fixture()
def root() -> Iterator[Path]:
    # Task files are read by the unprivileged sandbox user, so not under pytest's 0700 tmp dirs.
    path = Path(tempfile.mkdtemp(prefix="rollyard-dedup-", dir="/var/tmp"))
    path.chmod(0o755)
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _checks(task_dir: Path) -> TaskChecks:
    """The map step's fingerprint without the oracle runs: the solution is the file solve.sh
    copies into the workspace, read directly."""
    task = load_task(task_dir)
    fixed = [p for p in (task_dir / "solution").iterdir() if p.suffix == ".py"]
    solution = CandidateChanges(files={p.name: p.read_bytes() for p in fixed})
    return TaskChecks(
        task_dir=str(task_dir), task_id=task.id, task_version=task.version, family=task.family,
        source=task.source, declared_difficulty=None, n_fail_to_pass=len(task.fail_to_pass),
        n_pass_to_pass=len(task.pass_to_pass), reasons=(), flip_rates={}, runs=0,
        solution_passes=True, fingerprint=task_fingerprint(task, solution, SETTINGS),
        difficulty=None,
    )  # fmt: skip


def _renamed_copy(task_dir: Path, dest: Path, task_id: str) -> Path:
    """`calc`, `add`, `scale` and their arguments renamed everywhere, under a new id."""
    shutil.copytree(task_dir, dest)
    names = {"calc": "arith", "add": "plus", "scale": "stretch", "values": "items",
             "factor": "times", "value": "item"}  # fmt: skip
    pattern = re.compile(r"\b(" + "|".join(names) + r")\b")
    for path in dest.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".md", ".sh"):
            path.write_text(pattern.sub(lambda m: names[m.group(1)], path.read_text()))
    for path in sorted(dest.rglob("calc.py")):
        path.rename(path.with_name("arith.py"))
    toml = dest / "task.toml"
    toml.write_text(toml.read_text().replace(f'"{task_dir.name}"', f'"{task_id}"'))
    return dest


# The rest of the calc code base, shared by its tasks (as a repository's tasks share it).
CALC_REST = """

def mean(values):
    \"\"\"Arithmetic mean; 0.0 for no values.\"\"\"
    if not values:
        return 0.0
    return sum(values) / len(values)


def clamp(value, low, high):
    if low > high:
        raise ValueError("low must not exceed high")
    return max(low, min(value, high))


def running_total(values):
    totals, current = [], 0
    for value in values:
        current += value
        totals.append(current)
    return totals


def percent(part, whole, digits=1):
    if whole == 0:
        raise ZeroDivisionError("whole is zero")
    return round(100 * part / whole, digits)
"""
CALC = dict(buggy=BUGGY + CALC_REST, fixed=FIXED + CALC_REST)
SCALE_BUGGY = FIXED.replace("value * factor", "value + factor")
SCALE_TESTS = CLEAN_TESTS + "\n\ndef test_scale_twice():\n    assert scale([5], 2) == [10]\n"
SCALE_ONLY = dict(
    buggy=SCALE_BUGGY + CALC_REST,
    fixed=FIXED + CALC_REST,
    tests=SCALE_TESTS,
    instruction="# Scale in calc\n\n`calc.scale` multiplies wrongly; mend it.\n",
    fail_to_pass=("tests/test_calc.py::test_scale", "tests/test_calc.py::test_scale_twice"),
    pass_to_pass=("tests/test_calc.py::test_add_small",),
)
OTHER_CODE_BASE = '''\
"""Text helpers."""


def shout(text):
    """Upper-case text with an exclamation mark."""
    return text.lower() + "!"


def whisper(text):
    return text.lower() + "..."
'''


def _library(root: Path) -> dict[str, Path]:
    """Tasks of one code base (calc) that are distinct, a task of another code base, and a
    renamed copy of the first."""
    lib = root / "lib"
    dirs = {
        "a-add": write_task(lib, "a-add", **CALC),
        # Same failing tests and instruction, another bug: a distinct task.
        "b-add-times": write_task(
            lib,
            "b-add-times",
            buggy=BUGGY.replace("a - b", "a * b") + CALC_REST,
            fixed=FIXED + CALC_REST,
        ),
        "c-scale": write_task(lib, "c-scale", **SCALE_ONLY),  # type: ignore[arg-type]
        "d-shout": write_task(
            lib,
            "d-shout",
            buggy=OTHER_CODE_BASE,
            fixed=OTHER_CODE_BASE.replace('text.lower() + "!"', 'text.upper() + "!"'),
            tests="from calc import shout\n\n\ndef test_shout():\n    assert shout('hi') == 'HI!'\n",
            instruction="# Shouting\n\n`shout` must upper-case its text.\n",
            fail_to_pass=("tests/test_calc.py::test_shout",),
            pass_to_pass=(),
        ),
    }
    dirs["e-add-renamed"] = _renamed_copy(dirs["a-add"], lib / "e-add-renamed", "e-add-renamed")
    return dirs


def _rules(verdict: TaskVerdict) -> set[str]:
    return {r.rule for r in verdict.reasons}


def test_one_task_needs_its_change_and_one_more_part(root: Path) -> None:
    dirs = _library(root)
    verdicts = {v.task_id: v for v in decide([_checks(d) for d in dirs.values()], SETTINGS)}
    assert [k for k, v in verdicts.items() if not v.admitted] == ["e-add-renamed"]
    reason = verdicts["e-add-renamed"].reasons[0]
    assert reason.rule == "near_duplicate" and reason.other == "a-add"
    evidence = dict(reason.evidence)
    assert evidence["change"] == evidence["failing_tests"] == 1.0
    # One code base: reported as context, never a reason on its own.
    assert evidence["environment"] >= SETTINGS.repository_overlap
    assert "context only" in reason.detail
    # b-add-times fails the same tests as a-add: the tests alone do not make it a duplicate.
    print_a, print_b = (verdicts[k].checks.fingerprint for k in ("a-add", "b-add-times"))
    assert print_a and print_b
    assert print_a.parts["failing_tests"].exact == print_b.parts["failing_tests"].exact
    assert (
        print_a.parts["change"].jaccard(print_b.parts["change"]) < SETTINGS.near_duplicate_threshold
    )

    # Reordered tests and test ids: the failing tests read the same.
    reordered = write_task(
        root / "lib", "f-reordered", tests=_reversed_tests(CLEAN_TESTS),
        fail_to_pass=("tests/test_calc.py::test_add_negative", "tests/test_calc.py::test_add_small"),
    )  # fmt: skip
    again = decide([_checks(dirs["a-add"]), _checks(reordered)], SETTINGS)
    assert again[1].reasons[0].rule == "exact_duplicate", again[1].to_json()


def _reversed_tests(source: str) -> str:
    header, *functions = source.split("\n\n\n")
    return "\n\n\n".join([header, *reversed([f.rstrip("\n") for f in functions])]) + "\n"


def test_decontamination_policies(root: Path) -> None:
    dirs = _library(root)
    library = [_checks(d) for k, d in dirs.items() if k != "e-add-renamed"]
    eval_copy = _renamed_copy(dirs["c-scale"], root / "eval-scale", "eval-scale")
    eval_set = build_eval_set([_checks(eval_copy).fingerprint])  # type: ignore[list-item]

    instance = {v.task_id: v for v in decide(library, SETTINGS, eval_set)}
    assert {k for k, v in instance.items() if not v.admitted} == {"c-scale"}
    reason = instance["c-scale"].reasons[0]
    assert reason.rule == "contaminated" and reason.other == "eval-scale"
    assert "policy instance" in reason.detail

    repository = {
        v.task_id: v for v in decide(library, SETTINGS, eval_set, decontamination="repository")
    }
    # Every task of the evaluation task's code base, none of the other one.
    assert {k for k, v in repository.items() if not v.admitted} == {
        "a-add",
        "b-add-times",
        "c-scale",
    }
    assert all("eval_repository" in _rules(repository[k]) for k in ("a-add", "b-add-times"))
    assert repository["a-add"].reasons[0].other == "eval-scale"
    assert repository["d-shout"].admitted
    off = decide(library, SETTINGS, eval_set, decontamination="off")
    assert all(v.admitted for v in off)
    rows = verdict_rows([*instance.values(), *off])
    assert {json.loads(r["reason"])["decontamination"] for r in rows} == {"instance", "off"}
    with pytest.raises(ValueError, match="use one of instance, repository, off"):
        decide(library, SETTINGS, eval_set, decontamination="strict")


def test_duplicates_of_earlier_batches_from_the_store(root: Path, tmp_path: Path) -> None:
    dirs = _library(root)
    store = TrajectoryStore(tmp_path / "store")
    first = decide([_checks(dirs["a-add"]), _checks(dirs["c-scale"])], SETTINGS)
    store.tasks.record(verdict_rows(first), batch_id="b1")
    rows = store.query("SELECT task_id, status, reason, batch_id FROM tasks_latest").to_pylist()
    earlier, unreadable = earlier_admitted(rows)
    assert unreadable == [] and sorted(a.fingerprint.task_id for a in earlier) == [
        "a-add",
        "c-scale",
    ]

    # Batch 2: a renamed copy of a-add, a new task, and c-scale itself curated again (its new
    # verdict replaces the earlier one: it is no duplicate of itself).
    second = decide(
        [_checks(dirs[k]) for k in ("e-add-renamed", "d-shout", "c-scale")],
        SETTINGS,
        earlier=earlier,
    )
    by_id = {v.task_id: v for v in second}
    assert by_id["d-shout"].admitted and by_id["c-scale"].admitted
    reason = by_id["e-add-renamed"].reasons[0]
    assert reason.rule == "near_duplicate" and reason.other == "a-add"
    assert "a-add (admitted in batch b1)" in reason.detail
    store.tasks.record(verdict_rows(second), batch_id="b2")

    # --explain prints the rule, the other task and the evidence from the store.
    assert (
        cli_main(["curate", "--explain", "e-add-renamed", "--store", str(tmp_path / "store")]) == 0
    )


def test_explain_output_and_bad_input(
    root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dirs = _library(root)
    store_root = str(tmp_path / "store")
    verdicts = decide([_checks(d) for d in dirs.values()], SETTINGS)
    TrajectoryStore(store_root).tasks.record(verdict_rows(verdicts), batch_id="b1")
    capsys.readouterr()

    assert cli_main(["curate", "--explain", "e-add-renamed", "--store", store_root]) == 0
    out = capsys.readouterr().out
    assert "e-add-renamed (version 1): rejected in batch b1, decontamination instance" in out
    assert "near_duplicate: matches a-add on change 1.00, failing_tests 1.00" in out
    assert "other task: a-add" in out
    assert re.search(r"similarity by part: change 1\.000, environment 0\.\d+ \(context only\)", out)
    assert cli_main(["curate", "--explain", "a-add", "--store", store_root]) == 0
    assert "no rule rejected it" in capsys.readouterr().out
    assert cli_main(["curate", "--explain", "e-add-renamed", "--store", store_root,
                     "--format", "json"]) == 0  # fmt: skip
    explained = json.loads(capsys.readouterr().out)
    assert explained["reasons"][0]["evidence"]["change"] == 1.0
    assert explained["reasons"][0]["other"] == "a-add"

    assert cli_main(["curate", "--explain", "nope", "--store", store_root]) == 2
    assert "no curation verdict for task 'nope'" in capsys.readouterr().err
    assert cli_main(["curate", "--store", store_root]) == 2
    assert "--explain TASK_ID" in capsys.readouterr().err
    with pytest.raises(SystemExit) as usage:
        cli_main(["curate", str(dirs["a-add"]), "--decontamination", "strict"])
    assert usage.value.code == 2
    from flows.commands.curate import POLICIES as CLI_POLICIES

    assert CLI_POLICIES == POLICIES


def test_fingerprints_round_trip_and_refuse_another_version(root: Path) -> None:
    print_ = _checks(_library(root)["a-add"]).fingerprint
    assert print_ is not None
    again = Fingerprint.from_json(json.loads(json.dumps(print_.to_json())))
    assert again.exact == print_.exact and again.instruction == print_.instruction
    for part, sketch in print_.parts.items():
        assert again.parts[part].jaccard(sketch) == 1.0
        assert again.parts[part].sketch.jaccard(sketch.sketch) == 1.0
    with pytest.raises(ValueError, match="curate the task again"):
        Fingerprint.from_json({**print_.to_json(), "version": 0})
    admitted, unreadable = earlier_admitted(
        [{"task_id": "old", "status": "admitted", "reason": '{"reasons": []}', "batch_id": "b0"},
         {"task_id": "gone", "status": "rejected", "reason": None, "batch_id": "b0"}]
    )  # fmt: skip
    assert admitted == [] and unreadable == ["old"]


def test_demo_siblings_and_a_renamed_copy_in_the_evaluation_set(root: Path) -> None:
    # The reported case (there with six): demo tasks, the evaluation set holding one of them with
    # its package renamed. Only that one is contaminated; its siblings share the family's code,
    # not the task.
    dirs = generate_demo_tasks(root / "demo", 4, seed=5)
    copy = shutil.copytree(dirs[2], root / "eval" / "demo-5-0002-eval")
    package = load_task(dirs[2]).instruction.split("`")[1]
    for path in copy.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".md", ".patch", ".toml"):
            path.write_text(path.read_text().replace(package, "renamedpkg"))
    (copy / "environment" / "workspace" / package).rename(copy / "environment/workspace/renamedpkg")
    toml = copy / "task.toml"
    toml.write_text(toml.read_text().replace('"demo-5-0002"', '"demo-5-0002-eval"'))

    def checks(task_dir: Path) -> TaskChecks:
        # The reference fix applied with `patch` on this host (these are tasks the test just
        # generated), as solve.sh applies it in a sandbox.
        task = load_task(task_dir)
        solved = root / "solved" / task.id
        shutil.copytree(task.snapshot_dir, solved)
        patch = (task_dir / "solution" / "fix.patch").read_text()
        subprocess.run(["patch", "-p1", "--quiet"], cwd=solved, input=patch, text=True, check=True)
        solution = CandidateChanges.from_directory(solved, task.snapshot_dir)
        print_ = task_fingerprint(task, solution, SETTINGS)
        return TaskChecks(
            task_dir=str(task_dir), task_id=task.id, task_version="1", family=task.family,
            source=None, declared_difficulty=None, n_fail_to_pass=1, n_pass_to_pass=1, reasons=(),
            flip_rates={}, runs=0, solution_passes=True, fingerprint=print_, difficulty=None,
        )  # fmt: skip

    eval_set = build_eval_set([checks(copy).fingerprint])  # type: ignore[list-item]
    verdicts = decide([checks(d) for d in dirs], SETTINGS, eval_set)
    assert [v.task_id for v in verdicts if not v.admitted] == ["demo-5-0002"]
    reason = verdicts[2].reasons[0]
    assert reason.rule == "contaminated" and reason.other == "demo-5-0002-eval"
    assert dict(reason.evidence)["change"] == 1.0
    assert dict(reason.evidence)["hidden_tests"] == 1.0
