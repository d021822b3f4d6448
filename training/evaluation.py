"""Evaluate stored checkpoints on held-out tasks and record the result in the store's metrics.

Evaluation episodes are not training data: they are run here, summarised, and only the summary
is written (table `metrics`, source `evaluation`, at the checkpoint's iteration), once per
checkpoint, so a scheduled evaluation can run as often as it likes:

    for checkpoint in checkpoints_to_evaluate(store, run_id="run-0", latest=1):
        result = evaluate_checkpoint(store, checkpoint, held_out_task_dirs, samples_per_task=2)

A policy of any kind is evaluated by rolling it out as a run of its own (the `evaluate_policy`
flow): its episodes are committed and gated like a training iteration's, and pass@k per task,
per family and overall is computed from the store and recorded (`pass_at_k_from_store`,
`record_pass_at_k`, source `pass_at_k`).
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from pathlib import Path

from rollyard.status import is_trainable
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


# -- pass@k of a policy on a set of tasks ---------------------------------------------------------

PASS_AT_K_SOURCE = "pass_at_k"
"""The `metrics.source` of a policy evaluation's pass@k rows (`record_pass_at_k`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class PassAtK:
    """pass@k over one scope of an evaluation: every task, one family, or one task."""

    scope: str
    """`all`, `family` or `task`."""
    key: str
    """The family or task id (empty for `all`)."""
    k: int
    value: float | None
    """The mean over the scope's tasks of the unbiased pass@k estimate; None when no task of
    the scope has k scored samples."""
    tasks: int
    """Tasks of the scope with at least k scored samples (the mean's terms)."""
    episodes: int
    """Committed episodes of the scope, scored or not."""
    infra_errors: int
    """Episodes without a verdict: left out of n, never counted as failures."""

    @property
    def metric_name(self) -> str:
        """The name in the `metrics` table: `pass@k`, `pass@k/family/F` or `pass@k/task/T`."""
        return f"pass@{self.k}" if self.scope == "all" else f"pass@{self.k}/{self.scope}/{self.key}"


def pass_at_k(samples: int, passed: int, k: int) -> float:
    """The unbiased estimate of pass@k from `samples` scored samples of which `passed` passed:
    1 - C(n-c, k) / C(n, k), the chance that at least one of k samples drawn without
    replacement passes (Chen et al., 2021)."""
    if not 0 <= passed <= samples or not 1 <= k <= samples:
        raise TrainingSettingsError(
            f"pass@k needs 0 <= passed <= samples and 1 <= k <= samples; got "
            f"samples={samples}, passed={passed}, k={k}"
        )
    if samples - passed < k:
        return 1.0
    return 1.0 - math.comb(samples - passed, k) / math.comb(samples, k)


def default_ks(samples: int) -> tuple[int, ...]:
    """The k reported for `samples` samples per task: 1, the powers of two below, and all."""
    ks = {1, samples}
    power = 2
    while power < samples:
        ks.add(power)
        power *= 2
    return tuple(sorted(ks))


def pass_at_k_from_store(
    store: TrajectoryStore, run_id: str, iteration: int = 0, *, ks: Sequence[int]
) -> list[PassAtK]:
    """pass@k for every k of `ks` over all tasks, per family and per task, from the committed
    episodes of (run_id, iteration) in the store (quarantined ones too: an evaluation reports
    what the policy did; the gate's verdict is reported beside it)."""
    table = store.read_episodes(
        run_id,
        iteration,
        include_quarantined=True,
        columns=["task_id", "task_family", "status", "passed"],
    )
    per_task: dict[str, list[int]] = {}  # task -> [episodes, scored, passed]
    family_of: dict[str, str] = {}
    for row in table.to_pylist():
        counts = per_task.setdefault(row["task_id"], [0, 0, 0])
        counts[0] += 1
        family_of[row["task_id"]] = row["task_family"] or "unknown"
        if is_trainable(row["status"]):
            counts[1] += 1
            counts[2] += bool(row["passed"])
    scopes: dict[tuple[str, str], list[str]] = {("all", ""): sorted(per_task)}
    for task_id in sorted(per_task):
        scopes.setdefault(("family", family_of[task_id]), []).append(task_id)
        scopes[("task", task_id)] = [task_id]
    results = []
    for (scope, key), task_ids in scopes.items():
        episodes = sum(per_task[t][0] for t in task_ids)
        infra_errors = episodes - sum(per_task[t][1] for t in task_ids)
        for k in ks:
            estimates = [
                pass_at_k(per_task[t][1], per_task[t][2], k)
                for t in task_ids
                if per_task[t][1] >= k
            ]
            value = sum(estimates) / len(estimates) if estimates else None
            results.append(PassAtK(scope, key, k, value, len(estimates), episodes, infra_errors))
    return results


def record_pass_at_k(
    store: TrajectoryStore, run_id: str, iteration: int, results: Sequence[PassAtK]
) -> bool:
    """Write the results to the `metrics` table (source `pass_at_k`), once: a replay writes
    nothing and returns False. Read them back with the named query `pass_at_k`."""
    return store.metrics.record(
        run_id, iteration, {r.metric_name: r.value for r in results}, source=PASS_AT_K_SOURCE
    )
