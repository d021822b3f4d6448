"""What a training iteration is, shared by the Prefect flow (`flows.train`) and in-process
training (`training.local`): where a run stands, and how an iteration's committed batch is
turned into an update, a checkpoint and a completion marker.

An iteration is done when its marker — a metrics row with source `train_flow`, written last,
after the checkpoint — is in the store. Resume starts after the last done iteration, from the
newest checkpoint at or before it; either entry point can continue a run the other started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from storage import CommitError, StoreError, TrajectoryStore
from tasks_lib.errors import TaskError, TaskRefusedError
from tasks_lib.format.finder import tasks_in
from tasks_lib.format.loader import load_task
from training.builtin.scorer_policy import CandidateScorerPolicy
from training.errors import TrainingSettingsError
from training.grpo import GRPOConfig, GRPOTrainer, UpdateMetrics, load_checkpoint, save_checkpoint
from training.lm.spec import PolicySpec, check_policy_spec, parse_policy_spec
from training.trajectory import Trajectory

LOGGER = logging.getLogger(__name__)
ITERATION_DONE_SOURCE = "train_flow"
"""The `metrics.source` whose row marks an iteration as done."""


@dataclasses.dataclass(frozen=True, slots=True)
class IterationSummary:
    """What one iteration did."""

    iteration: int
    episodes: int
    """Committed episodes of the iteration (quarantined ones included)."""
    reward_mean: float
    pass_rate: float
    infra_errors: int
    policy_version: str
    """The policy after this iteration's update."""
    quarantined: bool
    wall_s: float
    gate_reason: str | None = None
    max_policy_lag: int = 0
    stale_dropped: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class RefusedTask:
    """A task directory left out of a run: no backend here runs it faithfully."""

    path: Path
    reason: str
    """The first reason, with its fix (`TaskRefusedError`'s issues)."""


def split_refused(task_dirs: Sequence[Path]) -> tuple[list[Path], list[RefusedTask]]:
    """The task directories a run may use, and the refused ones with their reason. Other load
    problems are not decided here: they surface where the task is used, as before."""
    runnable: list[Path] = []
    refused: list[RefusedTask] = []
    for path in task_dirs:
        try:
            load_task(path)
        except TaskRefusedError as error:
            first = error.issues[0] if error.issues else None
            reason = f"{first.field}: {first.message}; {first.fix}" if first else str(error)
            refused.append(RefusedTask(path, reason))
            continue
        except TaskError:
            pass
        runnable.append(path)
    return runnable, refused


def task_dirs_in(tasks_dir: str | Path) -> list[Path]:
    """The task directories (those holding a task.toml) directly under `tasks_dir`, refused ones
    left out (each logged with its reason)."""
    root = Path(tasks_dir)
    dirs = tasks_in(root)
    if not dirs:
        raise TrainingSettingsError(
            f"no task directories (with a task.toml) in {root}; generate some first "
            "(rollyard tasks demo --out DIR)"
        )
    runnable, refused = split_refused(dirs)
    for task in refused:
        LOGGER.warning("refused task %s: %s", task.path.name, task.reason)
    if not runnable:
        raise TrainingSettingsError(
            f"every task in {root} is refused ({refused[0].path.name}: {refused[0].reason}); "
            "run tasks a backend here can run faithfully (rollyard tasks check DIR says why)"
        )
    return runnable


def completed_iterations(store: TrajectoryStore, run_id: str) -> list[int]:
    try:
        rows = store.query(
            "SELECT DISTINCT iteration FROM metrics WHERE run_id = ? AND source = ? ORDER BY 1",
            [run_id, ITERATION_DONE_SOURCE],
        ).to_pylist()
    except StoreError:
        return []  # a new store: nothing done yet
    return [int(row["iteration"]) for row in rows]


def check_trainer_for(spec: PolicySpec) -> None:
    """Raise `TrainingSettingsError` (exit 2) unless a trainer here can update the policy `spec`
    names. The GRPO trainer of `training.grpo` updates the built-in policy; a language-model
    policy needs a token-level trainer, which `restore_trainer` would choose here from the spec.
    """
    if spec.kind != "builtin":
        raise TrainingSettingsError(
            f"training policy {spec} needs the language-model trainer, which this version does "
            f"not have; only --policy builtin trains (roll the model out with `rollyard evaluate "
            f"--policy {spec}`)"
        )


def check_training_policy(policy: str | PolicySpec) -> PolicySpec:
    """Before a run starts, and before anything is written: the spec parses (exit 2), a trainer
    can update it (exit 2), and the policy can act (`check_policy_spec`: a server that does not
    answer exits 3, one that does not serve the model or call tools exits 2)."""
    spec = parse_policy_spec(policy) if isinstance(policy, str) else policy
    check_trainer_for(spec)
    check_policy_spec(spec)
    return spec


def restore_trainer(
    store: TrajectoryStore,
    run_id: str,
    *,
    seed: int,
    resume: bool,
    policy: str | PolicySpec = "builtin",
) -> tuple[GRPOTrainer, int]:
    """The trainer for `policy` to continue with and the first iteration still to run."""
    check_trainer_for(parse_policy_spec(policy) if isinstance(policy, str) else policy)
    done = completed_iterations(store, run_id)
    if done and not resume:
        raise TrainingSettingsError(
            f"run {run_id!r} already has {len(done)} completed iteration(s) in {store.root}; "
            "resume it (`--resume`, or `resume=True` from Python) or choose another run id"
        )
    checkpoints = [
        c for c in store.checkpoints.recorded(run_id) if done and c.iteration <= done[-1]
    ]
    if not checkpoints:
        return GRPOTrainer(CandidateScorerPolicy(seed=seed), GRPOConfig(seed=seed)), 0
    # The newest checkpoint holds the policy after the last done iteration (an iteration that
    # changed nothing stores no new version).
    latest = max(checkpoints, key=lambda c: (c.iteration, c.created_at))
    return load_checkpoint(store, run_id, latest.policy_version, seed=seed), done[-1] + 1


def finish_iteration(
    store: TrajectoryStore,
    trainer: GRPOTrainer,
    *,
    run_id: str,
    iteration: int,
    batch: Sequence[Trajectory],
    trainable: Sequence[Trajectory],
    quarantined: bool,
    wall_s: float,
    gate_reason: str | None = None,
    extra_metrics: Mapping[str, float] | None = None,
    update: Callable[[GRPOTrainer, list[Trajectory]], UpdateMetrics] | None = None,
    policy_lag: int = 0,
    stale_dropped: int = 0,
) -> IterationSummary:
    """Update on `trainable` (the committed, non-quarantined part of `batch`), checkpoint, and
    write the completion marker with the metrics. `update` lets a caller wrap the update (the
    flow runs it as a Prefect task)."""
    version_before = trainer.policy.version
    values: dict[str, float | None] = {}
    if trainable:
        metrics = (update or GRPOTrainer.update)(trainer, list(trainable))
        values.update(metrics.as_dict())
    values.update(extra_metrics or {})
    values.update(
        policy_lag=float(policy_lag), stale_dropped=float(stale_dropped), rollout_wall_s=wall_s
    )
    save_checkpoint(
        trainer,
        store,
        run_id=run_id,
        iteration=iteration,
        trained_on_iterations=[iteration] if trainable else [],
        n_episodes=len(trainable),
        parent_policy_version=version_before,
    )
    store.metrics.record(run_id, iteration, values, source=ITERATION_DONE_SOURCE)
    # Every shard of the iteration is in by now: one steps file for it instead of one per shard
    # keeps later commits and reads from paying for each. A concurrent compaction or vacuum of
    # the same files wins the race harmlessly (the rows are unchanged either way).
    with contextlib.suppress(CommitError):
        store.compact(run_id=run_id, iteration=iteration)
    rewards = [t.reward for t in batch if t.trainable and t.reward is not None]
    return IterationSummary(
        iteration=iteration,
        episodes=len(batch),
        reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
        pass_rate=sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0,
        infra_errors=sum(1 for t in batch if not t.trainable),
        policy_version=trainer.policy.version,
        quarantined=quarantined,
        wall_s=wall_s,
        gate_reason=gate_reason,
        max_policy_lag=policy_lag,
        stale_dropped=stale_dropped,
    )
