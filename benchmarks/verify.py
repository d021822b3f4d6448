"""Verification cost against running the same tests bare with pytest.

For each demo task: `verify(task, solution)` (fresh sandbox, guard, hidden tests, hardened pytest,
JUnit parsing) against `python -m pytest tests` on a host copy of the same files (solved workspace
plus hidden tests). Runs alternate so machine load hits both alike; the ratio is of medians.

    python benchmarks/verify.py [--tasks 8] [--rounds 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sandboxes.snapshot import TreeBounds, check_tree, check_workspace_root, tree_size
from tasks_lib import CandidateChanges, generate_demo_tasks, load_task, solution_changes, verify
from tasks_lib.verify.oracle import apply_changes


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-verify-") as tmp:
        root = Path(tmp)
        tasks = [load_task(p) for p in generate_demo_tasks(root / "tasks", args.tasks, args.seed)]
        prepared = []
        for task in tasks:
            changes = solution_changes(task)
            bare_dir = root / "bare" / task.id
            shutil.copytree(task.snapshot_dir, bare_dir)
            apply_changes(changes, bare_dir)
            assert task.hidden_dir is not None
            shutil.copytree(task.hidden_dir, bare_dir, dirs_exist_ok=True)
            prepared.append((task, changes, bare_dir))
        env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
        verify_s: list[float] = []
        # What the bounds cost on their own: the stat walk and root check each sandbox open runs
        # before it reads a file (a verification opens one), and the candidate's path checks.
        checks_s: list[float] = []
        # The task's own rules, checked when it is loaded (links, special files, bounds).
        task_checks_s: list[float] = []
        bare_s: list[float] = []
        # The same run without third-party plugins, as the verifier runs it: the fair floor.
        bare_noplug_s: list[float] = []
        noplug_env = {**env, "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
        for _ in range(args.rounds):
            for task, changes, bare_dir in prepared:
                started = time.perf_counter()
                check_workspace_root(task.snapshot_dir)
                tree_size(task.snapshot_dir, TreeBounds.of(task.limits))
                CandidateChanges(
                    files=changes.files, deleted=changes.deleted, symlinks=changes.symlinks
                )
                checks_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                check_tree(task.path)
                check_tree(task.snapshot_dir, TreeBounds.of(task.limits))
                task_checks_s.append(time.perf_counter() - started)
                started = time.perf_counter()
                result = verify(task, changes)
                verify_s.append(time.perf_counter() - started)
                assert result.reward == 1.0, result.detail
                started = time.perf_counter()
                bare = subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                    cwd=bare_dir,
                    env=env,
                    capture_output=True,
                    check=False,
                )
                bare_s.append(time.perf_counter() - started)
                assert bare.returncode == 0, bare.stdout[-500:]
                started = time.perf_counter()
                subprocess.run(
                    [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
                    cwd=bare_dir,
                    env=noplug_env,
                    capture_output=True,
                    check=True,
                )
                bare_noplug_s.append(time.perf_counter() - started)
    tests = statistics.median(len(task.expected_tests) for task, _, _ in prepared)
    verify_med, bare_med = statistics.median(verify_s), statistics.median(bare_s)
    print(
        f"tasks={args.tasks} rounds={args.rounds} median tests/task={tests:.0f} "
        f"load={os.getloadavg()[0]:.2f}"
    )
    print(f"bare pytest   p50 {bare_med * 1000:7.1f} ms  p90 {_p90(bare_s) * 1000:7.1f} ms")
    noplug_med = statistics.median(bare_noplug_s)
    print(
        f"bare, no plugin autoload p50 {noplug_med * 1000:7.1f} ms  "
        f"p90 {_p90(bare_noplug_s) * 1000:7.1f} ms"
    )
    print(f"verify        p50 {verify_med * 1000:7.1f} ms  p90 {_p90(verify_s) * 1000:7.1f} ms")
    checks_med = statistics.median(checks_s)
    print(
        f"size checks   p50 {checks_med * 1000:7.2f} ms  p90 {_p90(checks_s) * 1000:7.2f} ms  "
        f"({checks_med / verify_med:.2%} of verify)"
    )
    print(
        f"task checks p50 {statistics.median(task_checks_s) * 1000:7.2f} ms  "
        f"p90 {_p90(task_checks_s) * 1000:7.2f} ms  (once per task load, not per verify)"
    )
    print(
        f"ratio (p50)   {verify_med / bare_med:.2f}x vs bare, "
        f"{verify_med / noplug_med:.2f}x vs bare without plugins   target <= 1.30x"
    )
    return 0


def _p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


if __name__ == "__main__":
    sys.exit(main())
