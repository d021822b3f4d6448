"""Curation end to end: a per-task check (the map step: load, oracle runs, validity, flakiness,
contamination, fix lines, difficulty, fingerprint) and a library-wide decision (the reduce step:
duplicates need every task's fingerprint). Each task gets `admitted` or `rejected` with every
reason; `verdict_rows` turns the verdicts into rows of the store's `tasks` table.

    settings = CurationSettings.from_env(reruns=5)
    eval_set = load_eval_set(eval_dirs, settings)
    checks = [check_task_dir(d, settings, eval_set) for d in task_dirs]   # or a Dask map
    verdicts = decide(checks, settings, eval_set)
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from sandboxes import SandboxError
from tasks_lib.curate.checks import flakiness_reasons, flip_rates, validity_reasons
from tasks_lib.curate.difficulty import DifficultyEstimate, Sampler, estimate_difficulty
from tasks_lib.curate.reasons import Reason
from tasks_lib.curate.runs import run_oracle
from tasks_lib.curate.settings import CurationSettings
from tasks_lib.curate.similarity import (
    DuplicateIndex,
    EvalSet,
    Fingerprint,
    build_eval_set,
    contamination_reasons,
    duplicate_reasons,
    fingerprint,
    fix_in_instruction_reasons,
)
from tasks_lib.errors import CurationError, SolutionError, TaskError, TaskValidationError
from tasks_lib.format.loader import load_task
from tasks_lib.verify.oracle import solution_changes

Verdict = Literal["admitted", "rejected"]


@dataclasses.dataclass(frozen=True, slots=True)
class TaskChecks:
    """Everything the map step found about one task directory."""

    task_dir: str
    task_id: str
    task_version: str
    family: str | None
    source: str | None
    declared_difficulty: str | None
    n_fail_to_pass: int
    n_pass_to_pass: int
    reasons: tuple[Reason, ...]
    flip_rates: Mapping[str, float]
    runs: int
    """Runs per candidate behind the flip rates (in order plus reordered)."""
    solution_passes: bool | None
    fingerprint: Fingerprint | None
    difficulty: DifficultyEstimate | None


@dataclasses.dataclass(frozen=True, slots=True)
class TaskVerdict:
    """A task's curation outcome."""

    checks: TaskChecks
    verdict: Verdict
    reasons: tuple[Reason, ...]

    @property
    def task_id(self) -> str:
        return self.checks.task_id

    @property
    def admitted(self) -> bool:
        return self.verdict == "admitted"

    @property
    def difficulty_bucket(self) -> str | None:
        return self.checks.difficulty.bucket if self.checks.difficulty else None

    def to_json(self) -> dict[str, Any]:
        checks = self.checks
        return {
            "task_id": checks.task_id,
            "task_version": checks.task_version,
            "task_dir": checks.task_dir,
            "verdict": self.verdict,
            "reasons": [r.to_json() for r in self.reasons],
            "runs": checks.runs,
            "flip_rates": {t: round(r, 4) for t, r in checks.flip_rates.items() if r > 0},
            "difficulty": self.difficulty_bucket,
            "pass_rate": checks.difficulty.pass_rate if checks.difficulty else None,
        }


def load_eval_set(eval_dirs: Iterable[str | Path], settings: CurationSettings) -> EvalSet:
    """Fingerprints of the evaluation tasks; a task that does not load is an error."""
    tasks = []
    for path in eval_dirs:
        try:
            tasks.append(load_task(path))
        except TaskError as error:
            raise CurationError(f"evaluation task {path} does not load: {error}") from error
    return build_eval_set(tasks, settings)


def check_task_dir(
    task_dir: str | Path,
    settings: CurationSettings,
    eval_set: EvalSet | None = None,
    *,
    sampler: Sampler | None = None,
    backend: str = "bwrap",
) -> TaskChecks:
    """The per-task checks. Never raises for a bad task: its problems become reasons."""
    path = str(task_dir)
    try:
        task = load_task(task_dir)
    except TaskValidationError as error:
        first = str(error.issues[0]) if error.issues else str(error)
        return _unloadable(path, f"{len(error.issues)} problem(s), first: {first}")
    except TaskError as error:
        return _unloadable(path, str(error))
    reasons: list[Reason] = []
    print_ = fingerprint(task, settings)
    base = dict(
        task_dir=path, task_id=task.id, task_version=task.version, family=task.family or None,
        source=task.source or None, declared_difficulty=task.difficulty or None,
        n_fail_to_pass=len(task.fail_to_pass), n_pass_to_pass=len(task.pass_to_pass),
        fingerprint=print_,
    )  # fmt: skip
    if eval_set is not None:
        reasons += contamination_reasons(print_, eval_set, settings)
    try:
        solution = solution_changes(task, backend=backend)
    except (SolutionError, SandboxError) as error:
        reasons.append(Reason("solution_error", str(error)[:300]))
        return TaskChecks(**base, reasons=tuple(reasons), flip_rates={}, runs=0,  # type: ignore[arg-type]
                          solution_passes=False, difficulty=None)  # fmt: skip
    reasons += fix_in_instruction_reasons(task, solution, settings)
    runs = run_oracle(task, solution, runs=settings.runs, order_runs=settings.random_order_runs,
                      order_seed=settings.order_seed, backend=backend)  # fmt: skip
    reasons += validity_reasons(task, runs, settings)
    rates = flip_rates(task, runs)
    reasons += flakiness_reasons(task, rates, runs)
    difficulty = None
    if sampler is not None:
        difficulty = estimate_difficulty(task, sampler, k=settings.difficulty_samples,
                                         edges=settings.difficulty_edges)  # fmt: skip
    return TaskChecks(
        **base,  # type: ignore[arg-type]
        reasons=tuple(reasons),
        flip_rates=rates,
        runs=len(runs.solution) + len(runs.solution_orders),
        solution_passes=runs.solution[0].reward == 1.0,
        difficulty=difficulty,
    )


def _unloadable(path: str, detail: str) -> TaskChecks:
    return TaskChecks(
        task_dir=path, task_id=Path(path).name, task_version="?", family=None, source=None,
        declared_difficulty=None, n_fail_to_pass=0, n_pass_to_pass=0,
        reasons=(Reason("invalid_task", detail[:500]),), flip_rates={}, runs=0,
        solution_passes=None, fingerprint=None, difficulty=None,
    )  # fmt: skip


def decide(
    checks: Sequence[TaskChecks], settings: CurationSettings, eval_set: EvalSet | None = None
) -> list[TaskVerdict]:
    """Add duplicate reasons and decide. Tasks are compared in task-id order; the first of a
    group of duplicates keeps its place, the later ones are rejected naming it."""
    library = DuplicateIndex(settings)
    evaluation = eval_set.index(settings) if eval_set is not None else None
    verdicts: dict[int, TaskVerdict] = {}
    order = sorted(range(len(checks)), key=lambda i: (checks[i].task_id, checks[i].task_dir))
    seen_keys: set[str] = set()
    for position in order:
        item = checks[position]
        reasons = list(item.reasons)
        if item.fingerprint is not None:
            reasons += duplicate_reasons(item.fingerprint, library, evaluation)
            key = (
                item.task_id if item.task_id not in seen_keys else f"{item.task_id}@{item.task_dir}"
            )
            seen_keys.add(key)
            library.add(key, item.fingerprint)
        verdict: Verdict = "rejected" if reasons else "admitted"
        verdicts[position] = TaskVerdict(item, verdict, tuple(reasons))
    return [verdicts[i] for i in range(len(checks))]


def curate_tasks(
    task_dirs: Sequence[str | Path],
    settings: CurationSettings | None = None,
    *,
    eval_dirs: Sequence[str | Path] = (),
    sampler: Sampler | None = None,
    map_fn: Callable[..., Iterable[TaskChecks]] | None = None,
) -> list[TaskVerdict]:
    """Curate `task_dirs` in this process (`map_fn`, e.g. a Dask client's map, spreads the
    per-task checks)."""
    settings = settings or CurationSettings.from_env()
    eval_set = load_eval_set(eval_dirs, settings) if eval_dirs else None

    def one(task_dir: str | Path) -> TaskChecks:
        return check_task_dir(task_dir, settings, eval_set, sampler=sampler)

    checks = list((map_fn or map)(one, task_dirs))
    return decide(checks, settings, eval_set)


def verdict_rows(verdicts: Sequence[TaskVerdict]) -> list[dict[str, Any]]:
    """Rows for `TrajectoryStore.tasks.record`: `status` is the verdict; `reason` holds JSON with
    every reason, the per-test flip rates and the runs behind them, and the measured pass rate."""
    rows = []
    for verdict in verdicts:
        checks = verdict.checks
        detail = {
            "reasons": [r.to_json() for r in verdict.reasons],
            "runs": checks.runs,
            "flip_rates": {t: round(r, 4) for t, r in checks.flip_rates.items()},
            "pass_rate": checks.difficulty.pass_rate if checks.difficulty else None,
            "difficulty_samples": checks.difficulty.samples if checks.difficulty else None,
        }
        rows.append(
            {
                "task_id": checks.task_id,
                "task_version": checks.task_version,
                "family": checks.family,
                "source": checks.source,
                "difficulty": verdict.difficulty_bucket or checks.declared_difficulty,
                "status": verdict.verdict,
                "reason": json.dumps(detail, sort_keys=True),
                "verifier_digest": checks.fingerprint.exact if checks.fingerprint else None,
                "n_fail_to_pass": checks.n_fail_to_pass,
                "n_pass_to_pass": checks.n_pass_to_pass,
                "solution_passes": checks.solution_passes,
            }
        )
    return rows
