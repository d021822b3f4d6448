"""Curation end to end: a per-task check (the map step: load, reference solution, fingerprint,
fix lines, oracle runs, validity, flakiness, difficulty) and a library-wide decision (the reduce
step: duplicates within the batch and against earlier admitted batches, and decontamination
against the evaluation set, need every task's fingerprint). Each task gets `admitted` or
`rejected` with every reason and the decontamination policy it was judged under;
`verdict_rows` turns the verdicts into rows of the store's `tasks` table (fingerprints included,
so a later batch compares against them: `earlier_admitted`).

    settings = CurationSettings.from_env(reruns=5)
    eval_set = load_eval_set(eval_dirs, settings)
    checks = [check_task_dir(d, settings) for d in task_dirs]   # or a Dask map
    verdicts = decide(checks, settings, eval_set, decontamination="instance")
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
from tasks_lib.curate.fingerprint import Fingerprint, fingerprint
from tasks_lib.curate.reasons import Reason
from tasks_lib.curate.runs import run_oracle
from tasks_lib.curate.settings import CurationSettings
from tasks_lib.curate.similarity import (
    DEFAULT_POLICY,
    Decontamination,
    EvalSet,
    FingerprintIndex,
    build_eval_set,
    check_policy,
    contamination_reasons,
    duplicate_reason,
    fix_in_instruction_reasons,
    instruction_templates,
)
from tasks_lib.errors import CurationError, SolutionError, TaskError, TaskValidationError
from tasks_lib.format.loader import load_task
from tasks_lib.format.model import Task
from tasks_lib.verify.candidate import CandidateChanges
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
    decontamination: Decontamination = DEFAULT_POLICY
    """The policy the task was judged under against the evaluation set."""

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
            "decontamination": self.decontamination,
            "runs": checks.runs,
            "flip_rates": {t: round(r, 4) for t, r in checks.flip_rates.items() if r > 0},
            "difficulty": self.difficulty_bucket,
            "pass_rate": checks.difficulty.pass_rate if checks.difficulty else None,
        }


def load_eval_set(
    eval_dirs: Iterable[str | Path], settings: CurationSettings, *, backend: str = "bwrap"
) -> EvalSet:
    """Fingerprints of the evaluation tasks (their reference solutions run in a sandbox for the
    change); a task that does not load is an error, one whose solution fails is compared
    without its change."""
    prints = []
    for path in eval_dirs:
        try:
            task = load_task(path)
        except TaskError as error:
            raise CurationError(f"evaluation task {path} does not load: {error}") from error
        try:
            solution: CandidateChanges | None = solution_changes(task, backend=backend)
        except (SolutionError, SandboxError):
            solution = None
        prints.append(task_fingerprint(task, solution, settings))
    return build_eval_set(prints)


def task_fingerprint(
    task: Task, solution: CandidateChanges | None, settings: CurationSettings
) -> Fingerprint:
    """`fingerprint` with the settings' shingle size and permutations."""
    return fingerprint(
        task, solution, shingle_tokens=settings.shingle_tokens, num_perm=settings.num_perm
    )


def check_task_dir(
    task_dir: str | Path,
    settings: CurationSettings,
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
    base = dict(
        task_dir=path, task_id=task.id, task_version=task.version, family=task.family or None,
        source=task.source or None, declared_difficulty=task.difficulty or None,
        n_fail_to_pass=len(task.fail_to_pass), n_pass_to_pass=len(task.pass_to_pass),
    )  # fmt: skip
    try:
        solution = solution_changes(task, backend=backend)
    except (SolutionError, SandboxError) as error:
        # Still fingerprinted (without the change): a broken copy of a task is still a copy.
        return TaskChecks(**base, reasons=(Reason("solution_error", str(error)[:300]),),  # type: ignore[arg-type]
                          flip_rates={}, runs=0, solution_passes=False,
                          fingerprint=task_fingerprint(task, None, settings), difficulty=None)  # fmt: skip
    reasons = fix_in_instruction_reasons(task, solution, settings)
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
        fingerprint=task_fingerprint(task, solution, settings),
        difficulty=difficulty,
    )


def _unloadable(path: str, detail: str) -> TaskChecks:
    return TaskChecks(
        task_dir=path, task_id=Path(path).name, task_version="?", family=None, source=None,
        declared_difficulty=None, n_fail_to_pass=0, n_pass_to_pass=0,
        reasons=(Reason("invalid_task", detail[:500]),), flip_rates={}, runs=0,
        solution_passes=None, fingerprint=None, difficulty=None,
    )  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class AdmittedTask:
    """A task an earlier batch admitted, as the store's `tasks` table recorded it."""

    fingerprint: Fingerprint
    batch_id: str


def earlier_admitted(rows: Iterable[Mapping[str, Any]]) -> tuple[list[AdmittedTask], list[str]]:
    """Admitted tasks of earlier batches from `tasks` rows (`task_id`, `status`, `reason`,
    `batch_id`), and the ids of admitted tasks that carry no readable fingerprint (recorded
    before fingerprints were stored, or by another fingerprint version): curate those again to
    compare against them."""
    admitted, unreadable = [], []
    for row in rows:
        if row.get("status") != "admitted":
            continue
        try:
            detail = json.loads(row.get("reason") or "{}")
            print_ = Fingerprint.from_json(detail["fingerprint"])
        except (ValueError, KeyError, TypeError):
            unreadable.append(str(row.get("task_id")))
            continue
        admitted.append(AdmittedTask(print_, str(row.get("batch_id") or "?")))
    return admitted, unreadable


def decide(
    checks: Sequence[TaskChecks],
    settings: CurationSettings,
    eval_set: EvalSet | None = None,
    *,
    decontamination: str = DEFAULT_POLICY,
    earlier: Sequence[AdmittedTask] = (),
) -> list[TaskVerdict]:
    """Add duplicate and contamination reasons, and decide. Tasks admitted by `earlier` batches
    come first (a task of this batch with the same id replaces its earlier entry); then this
    batch's tasks in task-id order, the first of a group of duplicates keeping its place and the
    later ones rejected naming it."""
    policy = check_policy(decontamination)
    batch_ids = {item.task_id for item in checks}
    earlier = [a for a in earlier if a.fingerprint.task_id not in batch_ids]
    eval_prints = eval_set.prints if eval_set is not None else ()
    for stored in (*(a.fingerprint for a in earlier), *eval_prints):
        if stored.num_perm not in (None, settings.num_perm):
            raise CurationError(
                f"task {stored.task_id} was fingerprinted with {stored.num_perm} MinHash "
                f"permutations, these settings use {settings.num_perm}; set "
                f"ROLLYARD_CURATE_NUM_PERM={stored.num_perm} or curate it again"
            )
    templates = instruction_templates(
        [c.fingerprint for c in checks if c.fingerprint is not None]
        + [a.fingerprint for a in earlier]
        + list(eval_prints),
        settings,
    )
    library = FingerprintIndex(settings, templates)
    labels: dict[str, str] = {}
    for admitted in earlier:
        task_id = admitted.fingerprint.task_id
        if task_id in library:
            continue  # another version of one task: the first one read stands for it
        library.add(task_id, admitted.fingerprint)
        labels[task_id] = f"{task_id} (admitted in batch {admitted.batch_id})"
    evaluation = FingerprintIndex(settings, templates)
    for print_ in eval_prints:
        key = print_.task_id
        evaluation.add(key if key not in evaluation else f"{key}#{len(evaluation)}", print_)
    verdicts: dict[int, TaskVerdict] = {}
    order = sorted(range(len(checks)), key=lambda i: (checks[i].task_id, checks[i].task_dir))
    for position in order:
        item = checks[position]
        reasons = list(item.reasons)
        if item.fingerprint is not None:
            duplicate = duplicate_reason(library.matches(item.fingerprint), labels)
            reasons += [duplicate] if duplicate else []
            if eval_set is not None:
                reasons += contamination_reasons(
                    item.fingerprint, evaluation, eval_set, policy, settings
                )
            key = item.task_id if item.task_id not in library else f"{item.task_id}@{item.task_dir}"
            library.add(key, item.fingerprint)
        verdict: Verdict = "rejected" if reasons else "admitted"
        verdicts[position] = TaskVerdict(item, verdict, tuple(reasons), policy)
    return [verdicts[i] for i in range(len(checks))]


def curate_tasks(
    task_dirs: Sequence[str | Path],
    settings: CurationSettings | None = None,
    *,
    eval_dirs: Sequence[str | Path] = (),
    decontamination: str = DEFAULT_POLICY,
    earlier: Sequence[AdmittedTask] = (),
    sampler: Sampler | None = None,
    map_fn: Callable[..., Iterable[TaskChecks]] | None = None,
) -> list[TaskVerdict]:
    """Curate `task_dirs` in this process (`map_fn`, e.g. a Dask client's map, spreads the
    per-task checks)."""
    settings = settings or CurationSettings.from_env()
    check_policy(decontamination)
    eval_set = load_eval_set(eval_dirs, settings) if eval_dirs else None

    def one(task_dir: str | Path) -> TaskChecks:
        return check_task_dir(task_dir, settings, sampler=sampler)

    checks = list((map_fn or map)(one, task_dirs))
    return decide(checks, settings, eval_set, decontamination=decontamination, earlier=earlier)


def verdict_rows(verdicts: Sequence[TaskVerdict]) -> list[dict[str, Any]]:
    """Rows for `TrajectoryStore.tasks.record`: `status` is the verdict; `reason` holds JSON with
    every reason (rule, detail, other task, evidence), the decontamination policy, the task's
    fingerprint, the per-test flip rates and the runs behind them, and the measured pass rate."""
    rows = []
    for verdict in verdicts:
        checks = verdict.checks
        detail = {
            "reasons": [r.to_json() for r in verdict.reasons],
            "decontamination": verdict.decontamination,
            "fingerprint": checks.fingerprint.to_json() if checks.fingerprint else None,
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
