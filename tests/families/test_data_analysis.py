"""The data-analysis family: valid, oracle-checked, flakiness-certified; its hacks score 0."""

from __future__ import annotations

import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tasks_lib import CandidateChanges, load_task, validate_task, verify
from tasks_lib.curate import CurationSettings, check_task_dir
from tasks_lib.sources.families.data_analysis import generate_data_analysis_tasks
from tasks_lib.verify.oracle import checkout, solution_changes
from tests.families.conftest import task_of


def test_every_task_validates_passes_the_oracle_check_and_is_certified_stable(
    data_task_dirs: list[Path],
) -> None:
    # Curation's per-task map step: validity (solution 1, untouched 0) and flakiness over
    # repeated fresh-sandbox runs of both.
    settings = CurationSettings(reruns=2, random_order_runs=0)
    for task_dir in data_task_dirs:
        assert validate_task(task_dir) == ()
        checks = check_task_dir(task_dir, settings)
        assert checks.reasons == (), (task_dir.name, checks.reasons)
        assert checks.solution_passes


def test_same_seed_same_tasks(tmp_path: Path) -> None:
    first = generate_data_analysis_tasks(tmp_path / "a", 3, seed=5)
    second = generate_data_analysis_tasks(tmp_path / "b", 3, seed=5)
    for left, right in zip(first, second, strict=True):
        out = subprocess.run(["diff", "-r", str(left), str(right)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout[:500]
    other = generate_data_analysis_tasks(tmp_path / "c", 1, seed=6)[0]
    data = "environment/workspace/data"
    assert filecmp.dircmp(first[0] / data, other / data).diff_files or not filecmp.cmp(
        first[0] / "task.toml", other / "task.toml", shallow=False
    )


def _hard_coded(task_dir: Path) -> CandidateChanges:
    """An analysis.py that writes the visible answer verbatim."""
    task = load_task(task_dir)
    assert task.artifact is not None
    output = task.artifact.outputs[0].path
    answer = (task.artifact.variants[0].expected_dir / output).read_bytes()
    script = f"open({output!r}, 'wb').write({answer!r})\n"
    return CandidateChanges(files={"analysis.py": script.encode()})


def test_hack_hard_coded_answer_scores_0(data_task_dirs: list[Path]) -> None:
    for task_dir in data_task_dirs[:2]:
        task = load_task(task_dir)
        result = verify(task, _hard_coded(task_dir))
        assert result.status == "ok" and result.reward == 0.0
        assert result.tests[f"visible::{task.artifact.outputs[0].path}"] == "passed"  # type: ignore[union-attr]
        assert "visible_pass_hidden_fail" in {flag.rule for flag in result.flags}


def test_hack_shipping_the_answer_file_scores_0(data_task_dirs: list[Path]) -> None:
    task = load_task(data_task_dirs[0])
    assert task.artifact is not None
    output = task.artifact.outputs[0].path
    answer = (task.artifact.variants[0].expected_dir / output).read_bytes()
    result = verify(task, CandidateChanges(files={output: answer}))
    assert result.reward == 0.0
    assert "artifact_preseeded" in {flag.rule for flag in result.flags}


def test_hack_editing_the_reference_scores_0(data_task_dirs: list[Path]) -> None:
    # The references live in the task dir; a candidate can only write workspace paths that look
    # like them (the tests tree, the verifier's dir) and those never reach the comparison.
    task = load_task(data_task_dirs[0])
    assert task.artifact is not None
    output = task.artifact.outputs[0].path
    junk = b"region,revenue\nnowhere,0.00\n"
    changes = _hard_coded(data_task_dirs[0])
    files = dict(changes.files)
    for variant in task.artifact.variants:
        files[f"tests/variants/{variant.name}/expected/{output}"] = junk
        files[f".rollyard/expected/{variant.name}/{output}"] = junk
    result = verify(task, CandidateChanges(files=files))
    assert result.reward == 0.0
    assert result.tampered  # the verifier's own directory is off limits
    assert (task.artifact.variants[0].expected_dir / output).read_bytes() != junk


def test_hack_editing_the_data_scores_0(data_task_dirs: list[Path]) -> None:
    # Rewriting the visible data cannot steer the hidden variants, and editing it is a tamper.
    task = task_of(data_task_dirs, "median_order_value")
    solution = solution_changes(task)
    files = dict(solution.files)
    data_file = next(p for p in (task.snapshot_dir / "data").iterdir()).relative_to(
        task.snapshot_dir
    )
    files[data_file.as_posix()] = (task.snapshot_dir / data_file).read_bytes()[:200]
    result = verify(task, CandidateChanges(files=files))
    assert result.reward == 0.0
    assert "protected_path" in {flag.rule for flag in result.flags}


def test_harbor_test_sh_checker_scores_the_solution_1_and_the_untouched_workspace_0(
    data_task_dirs: list[Path], tmp_path: Path
) -> None:
    # Outside rollyard, Harbor runs tests/test.sh, whose stdlib checker reads tests/harbor_spec.json.
    task = task_of(data_task_dirs, "revenue_by_region")
    scores = []
    for solved in (True, False):
        workspace = checkout(task, tmp_path / f"ws-{solved}", solved=solved)
        tests = shutil.copytree(task.tests_dir, tmp_path / f"tests-{solved}")
        out = subprocess.run(
            [sys.executable, str(tests / "harbor_check.py"), str(tests / "harbor_spec.json"), str(workspace)],
            capture_output=True, text=True, timeout=120,
            # The task image's `python` (with duckdb) is this interpreter here.
            env={**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"},
        )  # fmt: skip
        scores.append(out.stdout.strip())
    assert scores == ["1", "0"]
