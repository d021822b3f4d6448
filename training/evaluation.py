"""Evaluate stored checkpoints on held-out tasks and record the result in the store's metrics.

Evaluation episodes are not training data: they are run here, summarised, and only the summary
is written (table `metrics`, source `evaluation`, at the checkpoint's iteration), once per
checkpoint, so a scheduled evaluation can run as often as it likes:

    for checkpoint in checkpoints_to_evaluate(store, run_id="run-0", latest=1):
        result = evaluate_checkpoint(store, checkpoint, held_out_task_dirs, samples_per_task=2)
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path

from sandboxes import Limits, SandboxPool
from storage import CheckpointInfo, StoreError, TrajectoryStore
from tasks_lib.format.loader import load_task
from training.episode import EpisodeConfig
from training.errors import TrainingSettingsError
from training.iteration import load_trainer
from training.recovery import RecoveryPolicy, run_episode_with_recovery
from training.trajectory import EpisodeKey, Trajectory

EVALUATION_SOURCE = "evaluation"
"""The `metrics.source` of evaluation summaries."""


@dataclasses.dataclass(frozen=True, slots=True)
class EvaluationResult:
    """What one checkpoint scored on the held-out tasks."""

    run_id: str
    policy_version: str
    iteration: int
    """The training iteration that produced the checkpoint (where the metrics are recorded)."""
    tasks: int
    episodes: int
    reward_mean: float | None
    """Mean reward over episodes that got a verdict; None when none did."""
    pass_rate: float | None
    infra_errors: int
    """Episodes without a verdict (kept apart from failures, never scored 0)."""
    wall_s: float
    recorded: bool
    """False when the store already held an evaluation of this checkpoint (nothing written)."""

    def metrics(self) -> dict[str, float | None]:
        return {
            "eval_reward_mean": self.reward_mean,
            "eval_pass_rate": self.pass_rate,
            "eval_episodes": float(self.episodes),
            "eval_tasks": float(self.tasks),
            "eval_infra_errors": float(self.infra_errors),
            "eval_wall_s": self.wall_s,
        }


def evaluated_iterations(store: TrajectoryStore, run_id: str) -> set[int]:
    """Iterations of `run_id` whose checkpoint has an evaluation recorded."""
    try:
        rows = store.query(
            "SELECT DISTINCT iteration FROM metrics WHERE run_id = ? AND source = ?",
            [run_id, EVALUATION_SOURCE],
        ).to_pylist()
    except StoreError:
        return set()
    return {int(row["iteration"]) for row in rows}


def checkpoints_to_evaluate(
    store: TrajectoryStore, *, run_id: str | None = None, latest: int = 1
) -> list[CheckpointInfo]:
    """The newest `latest` checkpoints of each run (or of `run_id`) not evaluated yet, oldest
    first."""
    if latest < 1:
        raise TrainingSettingsError(f"latest must be >= 1, got {latest}")
    by_run: dict[str, list[CheckpointInfo]] = {}
    for checkpoint in store.checkpoints.recorded(run_id):
        by_run.setdefault(checkpoint.run_id, []).append(checkpoint)
    pending: list[CheckpointInfo] = []
    for run, checkpoints in sorted(by_run.items()):
        done = evaluated_iterations(store, run)
        newest = sorted(checkpoints, key=lambda c: (c.iteration, c.created_at))[-latest:]
        pending += [c for c in newest if c.iteration not in done]
    return pending


def evaluate_checkpoint(
    store: TrajectoryStore,
    checkpoint: CheckpointInfo,
    task_dirs: Sequence[str | Path],
    *,
    samples_per_task: int = 2,
    max_steps: int = 8,
    seed: int = 0,
    pool: SandboxPool | None = None,
) -> EvaluationResult:
    """Run `samples_per_task` episodes of the checkpoint's policy on each task and record the
    summary under (run, checkpoint iteration, source `evaluation`)."""
    if not task_dirs:
        raise TrainingSettingsError(
            "no held-out tasks to evaluate on: give at least one task directory"
        )
    if samples_per_task < 1:
        raise TrainingSettingsError(f"samples_per_task must be >= 1, got {samples_per_task}")
    started = time.monotonic()
    policy = load_trainer(store, checkpoint.run_id, checkpoint.policy_version, seed=seed).policy
    config = EpisodeConfig(max_steps=max_steps, seed=seed)
    own_pool = pool is None
    pool = pool or SandboxPool(limits=Limits(), max_idle_per_snapshot=1)
    trajectories: list[Trajectory] = []
    try:
        for group, task_dir in enumerate(sorted(Path(d) for d in task_dirs)):
            task = load_task(task_dir)
            for sample in range(samples_per_task):
                key = EpisodeKey(
                    f"{checkpoint.run_id}-eval-{checkpoint.policy_version}",
                    checkpoint.iteration,
                    group_index=group,
                    sample_index=sample,
                )
                trajectories.append(
                    run_episode_with_recovery(
                        task, policy, pool, key=key, config=config, recovery=RecoveryPolicy()
                    )
                )
    finally:
        if own_pool:
            pool.close()
    rewards = [t.reward for t in trajectories if t.trainable and t.reward is not None]
    result = EvaluationResult(
        run_id=checkpoint.run_id,
        policy_version=checkpoint.policy_version,
        iteration=checkpoint.iteration,
        tasks=len(task_dirs),
        episodes=len(trajectories),
        reward_mean=sum(rewards) / len(rewards) if rewards else None,
        pass_rate=sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else None,
        infra_errors=len(trajectories) - len(rewards),
        wall_s=time.monotonic() - started,
        recorded=False,
    )
    recorded = store.metrics.record(
        checkpoint.run_id, checkpoint.iteration, result.metrics(), source=EVALUATION_SOURCE
    )
    return dataclasses.replace(result, recorded=recorded)
