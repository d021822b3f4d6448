"""Synthesis over a small generated project (fast), and over real packages from PyPI (slow)."""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from project_fixture import LIBRARY, make_project

from tasks_lib import check_task, load_task
from tasks_lib.curate import CurationSettings, check_task_dir, decide
from tasks_lib.errors import GenerationError
from tasks_lib.sources.synthesize import (
    OPERATORS,
    ModuleMutator,
    copy_clean,
    inspect_project,
    synthesize_tasks,
)

LEAKS = (".git", "__pycache__", ".pyc", ".orig", "~", ".pytest_cache")


def _leaks(root: Path) -> list[str]:
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            if name in (".git", "__pycache__", ".pytest_cache") or name.endswith(LEAKS[3:]):
                found.append(os.path.join(dirpath, name))
    return found


def test_operators_cover_many_kinds_and_edits_reparse() -> None:
    mutator = ModuleMutator("helpers/core.py", LIBRARY.encode())
    kinds = set()
    for site in mutator.sites:
        mutation = mutator.edit(site)
        if mutation is None:
            continue
        kinds.add(mutation.operator)
        mutated = mutation.apply(LIBRARY.encode())
        assert mutated != LIBRARY.encode()
        ast.parse(mutated)  # every edit is valid Python
        # The reverse edit restores the original exactly.
        assert mutated[: mutation.start] == LIBRARY.encode()[: mutation.start]
    assert len(OPERATORS) >= 8
    assert len(kinds) >= 10, kinds
    assert {"identity", "negated_condition", "missing_raise", "break_continue",
            "lost_accumulation", "swapped_arguments"} <= kinds  # fmt: skip


def test_non_ascii_sources_get_byte_exact_edits() -> None:
    source = 'def f(x):\n    label = "ünïcode"\n    return x + 1 if label else x - 1\n'
    mutator = ModuleMutator("m.py", source.encode())
    edits = [e for e in map(mutator.edit, mutator.sites) if e is not None]
    assert edits
    for edit in edits:
        assert "ünïcode" in edit.apply(source.encode()).decode()


def test_clean_copy_drops_history_caches_and_backups(tmp_path: Path) -> None:
    project = make_project(tmp_path / "project")
    copy_clean(project, tmp_path / "clean")
    assert _leaks(tmp_path / "clean") == []
    copy_clean(project, project / "out" / "clean", skip=(project / "out",))  # output inside
    assert not (project / "out" / "clean" / "out").exists()
    layout = inspect_project(tmp_path / "clean")
    assert layout.test_paths == ("tests",)
    assert layout.library_files == ("helpers/__init__.py", "helpers/core.py")


def test_a_project_without_tests_is_refused(tmp_path: Path) -> None:
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "mod.py").write_text("def f():\n    return 1\n")
    with pytest.raises(GenerationError, match="no pytest test files"):
        synthesize_tasks(tmp_path / "p", tmp_path / "out", max_tasks=1)


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("synth")
    project = make_project(root / "project", src_layout=True)
    report = synthesize_tasks(project, root / "out", max_tasks=2, max_mutants=8, seed=3)
    return project, report


def test_synthesized_tasks_are_valid_checked_and_leak_nothing(synthesized: tuple) -> None:
    _, report = synthesized
    assert report.tasks_kept == 2, report.to_json()
    assert report.check_failures == ()  # every kept task passed the oracle check
    assert report.mutants_tried <= 8 and report.baseline_tests == 9
    ids = set()
    for task_dir in map(Path, report.task_dirs):
        task = load_task(task_dir)
        ids.add(task.id)
        assert task.fail_to_pass and task.pass_to_pass
        assert not set(task.fail_to_pass) & set(task.pass_to_pass)
        assert _leaks(task.snapshot_dir) == []
        assert "tests/**" in task.protected or "tests/**" in str(task.protected)
        patch = (task_dir / "solution" / "fix.patch").read_text()
        fixed_lines = [line[1:].strip() for line in patch.splitlines()
                       if line.startswith("+") and not line.startswith("+++")]  # fmt: skip
        # The instruction comes from the failing tests, never from the fix.
        for line in fixed_lines:
            assert line not in task.instruction
        assert task.fail_to_pass[0] in task.instruction
    assert len(ids) == report.tasks_kept


def test_parallel_evaluation_gives_the_same_tasks(synthesized: tuple, tmp_path: Path) -> None:
    project, sequential = synthesized
    with ThreadPoolExecutor(max_workers=2) as executor:
        parallel = synthesize_tasks(project, tmp_path / "b", max_tasks=1, max_mutants=8, seed=3,
                                    executor=executor, batch_size=1, check=False)  # fmt: skip
    # Mutants are decided in a fixed order, so a prefix of the sequential result comes back.
    assert [Path(p).name for p in parallel.task_dirs] == [
        Path(p).name for p in sequential.task_dirs[:1]
    ]


def test_dask_client_evaluates_batches(synthesized: tuple, tmp_path: Path) -> None:
    from distributed import Client, LocalCluster

    project, _ = synthesized
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                      dashboard_address=":0") as cluster, Client(cluster) as client:  # fmt: skip
        report = synthesize_tasks(project, tmp_path / "out", max_tasks=1, max_mutants=2, seed=3,
                                  executor=client, batch_size=1, check=False)  # fmt: skip
    assert report.tasks_kept == 1


def test_cli_synthesize_prints_a_report(synthesized: tuple, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from flows.cli import main

    project, _ = synthesized
    code = main(["tasks", "synthesize", str(project), "--out", str(tmp_path / "out"), "--max", "1",
                 "--max-mutants", "1", "--seed", "3", "--no-check"])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert (code, report["tasks_kept"], report["mutants_tried"]) == (0, 1, 1)
    assert main(["tasks", "synthesize", str(tmp_path / "missing"), "--out", str(tmp_path)]) == 1


# -- real packages ------------------------------------------------------------------------------

REAL_PACKAGES = ("inflection==0.5.1", "cachetools==5.5.2", "toolz==1.0.0")


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("requirement", REAL_PACKAGES)
def test_real_package_from_pypi(requirement: str, tmp_path: Path) -> None:
    """An sdist with its own test suite, fetched at test time (never committed)."""
    fetched = subprocess.run(
        [sys.executable, "-m", "pip", "download", "-q", "--no-binary", ":all:", "--no-deps",
         "-d", str(tmp_path / "sdist"), requirement],
        capture_output=True, text=True, check=False, timeout=300,
    )  # fmt: skip
    if fetched.returncode != 0:
        pytest.skip(f"cannot download {requirement}: {fetched.stderr.strip()[-200:]}")
    archive = next((tmp_path / "sdist").iterdir())
    subprocess.run(["tar", "-xzf", str(archive), "-C", str(tmp_path)], check=True)
    project = next(p for p in tmp_path.iterdir() if p.is_dir() and p.name != "sdist")
    report = synthesize_tasks(project, tmp_path / "tasks", max_tasks=3, max_mutants=30, seed=0)
    print(report.to_json())
    assert report.tasks_kept >= 1, report.to_json()
    assert report.check_failures == ()
    # Curation on every kept task: the per-task checks (validity, flakiness over fresh
    # sandboxes and reordered runs, fix lines in the instruction), then the duplicate step: tasks
    # of one project share its code and test suite, yet each is its own bug and fix.
    settings = CurationSettings(reruns=2, random_order_runs=1)
    all_checks = []
    for task_dir in report.task_dirs:
        assert check_task(load_task(task_dir)).ok
        assert _leaks(Path(task_dir) / "environment" / "workspace") == []
        checks = check_task_dir(task_dir, settings)
        assert checks.reasons == () and checks.solution_passes, checks.reasons
        all_checks.append(checks)
    assert all(v.admitted for v in decide(all_checks, settings)), [
        v.to_json() for v in decide(all_checks, settings) if not v.admitted
    ]
