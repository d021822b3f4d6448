"""The oracle runs curation judges a task by: the reference solution and the untouched workspace,
each verified N times in fresh sandboxes, plus runs with the tests in another order.

In-order runs go through `tasks_lib.verify` itself (fresh sandbox, guard, hidden tests, hardened
pytest), so curation sees exactly what training will. Reordered runs need the test ids on the
command line in a chosen order (pytest keeps command-line order), which `verify` does not take,
so they run here with the same environment, ini and flags.
"""

from __future__ import annotations

import dataclasses
import os
import random
import secrets
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandboxes import WORKSPACE_MOUNT, SandboxError, open_sandbox
from tasks_lib.candidate import CandidateChanges
from tasks_lib.guard import guard_changes
from tasks_lib.junit import Outcome, ReportError, parse_junit
from tasks_lib.model import VERIFIER_DIR, Task
from tasks_lib.verify import VERIFY_ENV, VerifyResult, verify

_RUNNER = (
    "import sys, pytest\nsys.path.insert(0, {workspace!r})\nsys.exit(int(pytest.main({args!r})))\n"
)
_INI = "[pytest]\njunit_family = xunit1\njunit_logging = no\n"


@dataclasses.dataclass(frozen=True, slots=True)
class OrderRun:
    """One run with the tests in `order`; `tests` is None when the run produced no report."""

    order: tuple[str, ...]
    tests: Mapping[str, Outcome] | None
    detail: str


@dataclasses.dataclass(frozen=True, slots=True)
class OracleRuns:
    """Every oracle run of one task."""

    solution: tuple[VerifyResult, ...]
    untouched: tuple[VerifyResult, ...]
    solution_orders: tuple[OrderRun, ...]
    untouched_orders: tuple[OrderRun, ...]


def shuffled_orders(test_ids: Sequence[str], count: int, seed: int) -> list[tuple[str, ...]]:
    """`count` orders of `test_ids`: the reversed order first (it swaps every pair, so any
    dependence between two tests shows), then seeded shuffles."""
    ids = list(test_ids)
    orders: list[tuple[str, ...]] = []
    if count >= 1:
        orders.append(tuple(reversed(ids)))
    rng = random.Random(seed)
    for _ in range(count - 1):
        shuffled = ids[:]
        rng.shuffle(shuffled)
        orders.append(tuple(shuffled))
    return orders


def run_oracle(
    task: Task,
    solution: CandidateChanges,
    *,
    runs: int,
    order_runs: int,
    order_seed: int = 0,
    backend: str = "bwrap",
) -> OracleRuns:
    """Verify the solution and the untouched workspace `runs` times each (fresh sandboxes), and
    run both `order_runs` times with the expected tests reordered (rollyard tasks only)."""
    untouched = CandidateChanges.empty()
    solved = tuple(verify(task, solution, backend=backend) for _ in range(runs))
    plain = tuple(verify(task, untouched, backend=backend) for _ in range(runs))
    orders = shuffled_orders(task.expected_tests, order_runs, order_seed)
    if not task.has_rollyard_table or not task.expected_tests:
        orders = []
    return OracleRuns(
        solution=solved,
        untouched=plain,
        solution_orders=tuple(run_in_order(task, solution, o, backend=backend) for o in orders),
        untouched_orders=tuple(run_in_order(task, untouched, o, backend=backend) for o in orders),
    )


def run_in_order(
    task: Task, changes: CandidateChanges, order: Sequence[str], *, backend: str = "bwrap"
) -> OrderRun:
    """Run the expected tests of `task` over `changes` in `order`, in a fresh sandbox."""
    guarded = guard_changes(changes, task.snapshot_dir, task_protected=task.protected)
    report_dir = f"{VERIFIER_DIR}/{secrets.token_hex(12)}"
    try:
        with open_sandbox(task.snapshot_dir, backend=backend, limits=task.limits) as sandbox:
            for path, data in guarded.files.items():
                sandbox.write_file(path, data)
            if guarded.deleted:
                sandbox.execute(["rm", "-f", "--", *guarded.deleted], timeout_s=30)
            if task.hidden_dir is not None:
                for dirpath, _dirs, files in os.walk(task.hidden_dir):
                    for name in files:
                        full = Path(dirpath) / name
                        rel = full.relative_to(task.hidden_dir).as_posix()
                        sandbox.write_file(rel, full.read_bytes())
            sandbox.write_file(f"{report_dir}/pytest.ini", _INI)
            report = f"{WORKSPACE_MOUNT}/{report_dir}/junit.xml"
            args = [
                *order,
                "-c", f"{WORKSPACE_MOUNT}/{report_dir}/pytest.ini",
                "--rootdir", WORKSPACE_MOUNT,
                "--confcutdir", WORKSPACE_MOUNT,
                "-p", "no:cacheprovider",
                "--junitxml", report,
                "-q", "--no-header", "-rN",
            ]  # fmt: skip
            program = _RUNNER.format(workspace=WORKSPACE_MOUNT, args=args)
            executed = sandbox.execute(
                ["python", "-B", "-s", "-P", "-c", program],
                timeout_s=task.verify_timeout_s,
                env=VERIFY_ENV,
            )
            if executed.timed_out or executed.oom_killed:
                return OrderRun(tuple(order), None, "the reordered run hit a limit")
            raw = sandbox.read_file(f"{report_dir}/junit.xml")
    except (SandboxError, OSError) as error:
        return OrderRun(tuple(order), None, f"no report: {type(error).__name__}: {error}")
    try:
        outcomes = parse_junit(raw)
    except ReportError as error:
        return OrderRun(tuple(order), None, f"unreadable report: {error}")
    tests = {test_id: outcomes.get(test_id, "missing") for test_id in order}
    return OrderRun(tuple(order), tests, f"pytest exit {executed.exit_code}")
