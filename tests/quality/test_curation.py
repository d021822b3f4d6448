"""Curation on real bwrap sandboxes: tasks built to be flaky (random, clock and order-dependent
tests), duplicates (renamed copies, near copies, copies of evaluation tasks) and contaminated
tasks are rejected with their reasons; clean tasks are admitted."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from tiny_tasks import BUGGY, CLEAN_TESTS, FIXED, INSTRUCTION, flaky_task, write_task

from tasks_lib.curate import (
    ALL_FAIL,
    ALL_PASS,
    CurationSettings,
    CurationSettingsError,
    bucket_for,
    curate_tasks,
    reruns_for,
    stratified_sample,
    verdict_rows,
)


@pytest.fixture()
def task_root() -> Iterator[Path]:
    # Task files are read by the unprivileged sandbox user, so not under pytest's 0700 tmp dirs.
    root = Path(tempfile.mkdtemp(prefix="rollyard-curate-", dir="/var/tmp"))
    root.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _parallel(function, items):  # type: ignore[no-untyped-def]
    # Sandboxes are processes: threads overlap their waits, as a Dask map would.
    with ThreadPoolExecutor(4) as pool:
        return list(pool.map(function, items))


def _rules(verdict) -> set[str]:  # type: ignore[no-untyped-def]
    return {reason.rule for reason in verdict.reasons}


EVAL_TESTS = """\
from calc import add


def test_add_big():
    assert add(10**12, 10**12) == 2 * 10**12


def test_add_zero_and_negatives_in_one_check():
    assert add(0, -7) == -7 and add(-7, 0) == -7
"""


def test_rerun_count_follows_flake_rate_and_confidence() -> None:
    assert [reruns_for(p, 0.95) for p in (0.2, 0.1, 0.05, 0.01)] == [14, 29, 59, 299]
    assert CurationSettings().runs == 59
    assert CurationSettings(flake_rate=0.1, confidence=0.99).runs == 44
    assert CurationSettings(reruns=3).runs == 3
    assert CurationSettings.from_env({"reruns": "7"}).runs == 7
    with pytest.raises(CurationSettingsError, match="flake_rate = 0"):
        CurationSettings(flake_rate=0)
    with pytest.raises(CurationSettingsError, match="ROLLYARD_CURATE_FLAKE_RATE = 'often'"):
        CurationSettings.from_env({"flake_rate": "often"})
    with pytest.raises(CurationSettingsError, match="difficulty_edges"):
        CurationSettings(difficulty_edges=(0.5, 0.25))


def test_flaky_tasks_are_rejected_and_the_clean_one_admitted(task_root: Path) -> None:
    settings = CurationSettings(reruns=2, random_order_runs=1)
    dirs = [write_task(task_root, "tiny-clean")] + [
        flaky_task(task_root, f"tiny-{kind}", kind) for kind in ("random", "clock", "order")
    ]
    verdicts = {v.task_id: v for v in curate_tasks(dirs, settings, map_fn=_parallel)}
    clean = verdicts["tiny-clean"]
    assert clean.admitted and clean.reasons == () and clean.checks.runs == 3
    assert clean.checks.flip_rates and not any(clean.checks.flip_rates.values())
    for kind in ("random", "clock", "order"):
        verdict = verdicts[f"tiny-{kind}"]
        assert not verdict.admitted and "flaky_test" in _rules(verdict), verdict.to_json()
        flipping = {t for t, rate in verdict.checks.flip_rates.items() if rate > 0}
        assert flipping and all(("setup" if kind == "order" else kind) in t for t in flipping)
    # Order dependence shows only when the order changes: the reversed run catches it.
    order = verdicts["tiny-order"]
    assert set(order.checks.flip_rates) >= {"tests/test_calc.py::test_scale_uses_setup"}
    rows = {row["task_id"]: row for row in verdict_rows(list(verdicts.values()))}
    assert rows["tiny-clean"]["status"] == "admitted"
    assert '"flip_rates"' in rows["tiny-order"]["reason"]
    assert "test_scale_uses_setup" in rows["tiny-order"]["reason"]


def test_duplicates_contamination_and_invalid_tasks(task_root: Path) -> None:
    settings = CurationSettings(reruns=1, random_order_runs=0)
    library = task_root / "library"
    evaluation = task_root / "eval"
    library.mkdir()
    evaluation.mkdir()
    clean = write_task(library, "a-clean")
    # A renamed copy: every identifier renamed, the same task otherwise.
    renamed = shutil.copytree(clean, library / "b-renamed")
    for path in renamed.rglob("*"):
        if path.is_file() and path.suffix in (".py", ".md", ".toml", ".sh"):
            text = path.read_text().replace("a-clean", "b-renamed")
            for old, new in (("calc", "arith"), ("add", "plus"), ("scale", "stretch")):
                text = text.replace(old, new)
            path.write_text(text)
    for path in sorted(renamed.rglob("calc.py")):
        path.rename(path.with_name("arith.py"))
    (renamed / "environment/workspace/tests/test_calc.py").rename(
        renamed / "environment/workspace/tests/test_arith.py"
    )
    toml = renamed / "task.toml"
    toml.write_text(toml.read_text().replace("test_calc.py", "test_arith.py"))
    near = write_task(library, "c-near", instruction=INSTRUCTION + "\nPlease be quick.\n")
    quoted = write_task(
        library,
        "d-fix-quoted",
        instruction=INSTRUCTION.replace(
            "Mind the", "Hint: write `return a + b  # the sum, not the difference`. Mind the"
        ),
        buggy=BUGGY.replace("sum of a and b", "total of a and b"),
        fixed=FIXED.replace("sum of a and b", "total of a and b"),
    )
    broken = write_task(library, "f-broken")
    (broken / "solution" / "calc.py").write_text(BUGGY)  # the solution fixes nothing
    # The id names a function pytest does not collect (it opts out with __test__ = False).
    uncollected = CLEAN_TESTS + "\n\ndef test_add_absent():\n    assert add(1, 1) == 2\n\n\n"
    uncollected += "test_add_absent.__test__ = False\n"
    missing = write_task(
        library,
        "g-missing-id",
        tests=uncollected,
        instruction="# Missing id\n\nAdd numbers correctly in calc.\n",
        fail_to_pass=("tests/test_calc.py::test_add_small", "tests/test_calc.py::test_add_absent"),
    )
    # The evaluation set: a task whose test code and instruction a library task copies.
    eval_text = (
        "# Evaluate `mul` in `ops`\n\nThe function `ops.mul(a, b)` returns the product of two "
        "integers and it must handle zero, negative operands and very large operands alike "
        "without overflow checks of any kind.\n"
    )
    write_task(
        evaluation,
        "eval-0",
        instruction=eval_text,
        tests=EVAL_TESTS,
        fail_to_pass=("tests/test_calc.py::test_add_big",),
        pass_to_pass=(),
    )
    leaked = write_task(library, "h-leaked", instruction="# Fix add\n\n" + eval_text)
    dirs = [clean, renamed, near, quoted, broken, missing, leaked]

    verdicts = {
        v.task_id: v
        for v in curate_tasks(dirs, settings, eval_dirs=[evaluation / "eval-0"], map_fn=_parallel)
    }
    assert verdicts["a-clean"].admitted, verdicts["a-clean"].to_json()
    # The renamed copy: its change and its tests are the original's once names are numbered.
    renamed_reason = next(r for r in verdicts["b-renamed"].reasons if r.rule == "near_duplicate")
    assert renamed_reason.other == "a-clean"
    assert dict(renamed_reason.evidence)["change"] == 1.0
    assert dict(renamed_reason.evidence)["failing_tests"] == 1.0
    assert "near_duplicate" in _rules(verdicts["c-near"])
    assert "fix_in_instruction" in _rules(verdicts["d-fix-quoted"])
    assert "solution_fails" in _rules(verdicts["f-broken"])
    assert "exact_duplicate" not in _rules(verdicts["f-broken"])  # the solution differs
    assert "fail_to_pass_not_collected" in _rules(verdicts["g-missing-id"])
    # The evaluation task's instruction over its fix: contaminated. Every other library task
    # shares that fix too (one workspace, one bug), but neither its tests nor its instruction.
    leaked = next(r for r in verdicts["h-leaked"].reasons if r.rule == "contaminated")
    assert leaked.other == "eval-0" and {"change", "instruction"} <= set(dict(leaked.evidence))
    assert not any(
        _rules(v) & {"contaminated", "eval_repository"}
        for k, v in verdicts.items()
        if k != "h-leaked"
    )
    assert {v.decontamination for v in verdicts.values()} == {"instance"}

    # An exact copy under another id, and the evaluation task itself submitted for training.
    copy = shutil.copytree(clean, library / "i-copy")
    toml = copy / "task.toml"
    toml.write_text(toml.read_text().replace('"a-clean"', '"i-copy"'))
    again = curate_tasks(
        [clean, copy, evaluation / "eval-0"],
        settings,
        eval_dirs=[evaluation / "eval-0"],
        map_fn=_parallel,
    )
    by_id = {v.task_id: v for v in again}
    assert by_id["a-clean"].admitted
    assert "exact_duplicate" in _rules(by_id["i-copy"])
    assert "contaminated" in _rules(by_id["eval-0"])
    assert "identical after normalising eval-0" in str(by_id["eval-0"].reasons)


def test_difficulty_buckets_and_stratified_sampling() -> None:
    edges = (0.25, 0.5, 0.75)
    assert bucket_for(0.0, edges) == ALL_FAIL and bucket_for(1.0, edges) == ALL_PASS
    assert bucket_for(0.125, edges) == "0.00-0.25" and bucket_for(0.5, edges) == "0.25-0.50"
    assert bucket_for(0.875, edges) == "0.75-1.00"
    buckets = {
        f"t{i}": b
        for i, b in enumerate(
            [ALL_PASS, ALL_FAIL, "0.00-0.25", "0.00-0.25", "0.00-0.25", "0.00-0.25", "0.75-1.00"]
        )
    }
    chosen = stratified_sample(buckets, 4, seed=1)
    assert len(chosen) == 4 and "t0" not in chosen and "t1" not in chosen
    assert "t6" in chosen  # the rare bucket gets its turn
    assert chosen == stratified_sample(buckets, 4, seed=1)
    assert len(stratified_sample(buckets, 100)) == 5
