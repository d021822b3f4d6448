"""The oracle runs curation judges a task by: the reference solution and the untouched workspace,
each verified N times in fresh sandboxes, plus runs with the tests in another order.

In-order runs go through `tasks_lib.verify` itself (fresh sandbox, guard, hidden tests, hardened
pytest), so curation sees exactly what training will. Reordered runs need the test ids on the
command line in a chosen order (pytest keeps command-line order), which `verify` does not take, so
they open the verifier's run context and call its hardened pytest run with that order.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping, Sequence

from sandboxes import SandboxError
from tasks_lib.format.model import Task
from tasks_lib.verify import CandidateChanges, VerifyResult, VerifyRun, run_task_tests, verify
from tasks_lib.verify.junit import Outcome


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
    run = VerifyRun.start(task, changes, backend=backend)
    try:
        with run.sandbox() as sandbox:
            pytest_run = run_task_tests(run, sandbox, order)
    except (SandboxError, OSError) as error:
        return OrderRun(tuple(order), None, f"no report: {type(error).__name__}: {error}")
    if pytest_run.limit is not None:
        return OrderRun(tuple(order), None, "the reordered run hit a limit")
    if pytest_run.report is None:
        return OrderRun(tuple(order), None, pytest_run.broken)
    outcomes = pytest_run.report.outcomes
    tests = {test_id: outcomes.get(test_id, "missing") for test_id in order}
    return OrderRun(tuple(order), tests, f"pytest exit {pytest_run.executed.exit_code}")
