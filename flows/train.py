"""The `train` flow: sample tasks, roll out on Dask, commit, gate, update the policy, checkpoint.

Each iteration reads top to bottom as library calls wrapped in Prefect tasks. A Prefect task is
a shard of episodes (Prefect costs 160-270 ms per task under the Dask runner here, so episodes
are never one task each). Exactly-once lives in the store, not in Prefect's result cache: shards
commit under (run, iteration, shard), and the trainer consumes only what the store says is
committed and not quarantined. Resume starts after the last iteration that has a checkpoint.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import as_completed

from storage import TrajectoryStore
from training.episode import EpisodeConfig
from training.grpo import GRPOConfig, GRPOTrainer, UpdateMetrics, load_checkpoint, save_checkpoint
from training.rollout import ShardOutcome, ShardRequest, plan_iteration, rollout_shard_and_commit
from training.scorer_policy import CandidateScorerPolicy
from training.trajectory import Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class TrainSettings:
    """Parameters of one training run (the CLI and deployments fill these)."""

    tasks_dir: str
    """Directory holding task directories (one per task)."""
    store: str
    """Store root (local directory or object-storage URI)."""
    run_id: str = "run-0"
    iterations: int = 6
    tasks_per_iteration: int = 8
    group_size: int = 4
    """Samples per task (the GRPO group)."""
    shards_per_iteration: int = 4
    """Prefect tasks per iteration; each runs its episodes on one Dask worker."""
    max_steps: int = 8
    seed: int = 0
    resume: bool = False
    """Continue a run from its last checkpointed iteration instead of refusing to reuse its id."""


@dataclasses.dataclass(frozen=True, slots=True)
class IterationSummary:
    iteration: int
    episodes: int
    reward_mean: float
    pass_rate: float
    infra_errors: int
    policy_version: str
    quarantined: bool
    wall_s: float


ProgressHook = Callable[[str, dict[str, Any]], None]
_progress_hook: ProgressHook | None = None


def set_progress_hook(hook: ProgressHook | None) -> None:
    """Where the flow reports progress (the CLI's progress bars); None to stop reporting."""
    global _progress_hook
    _progress_hook = hook


def _report(event: str, **values: Any) -> None:
    if _progress_hook is not None:
        _progress_hook(event, values)


# -- tasks: each one library call ---------------------------------------------------------------


@task(name="rollout_shard", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def rollout_shard(request: ShardRequest, store_root: str) -> ShardOutcome:
    return rollout_shard_and_commit(request, store_root)


@task(name="update_policy", cache_policy=NO_CACHE)
def update_policy(trainer: GRPOTrainer, trajectories: list[Trajectory]) -> UpdateMetrics:
    return trainer.update(trajectories)


# -- the flow -----------------------------------------------------------------------------------


def task_dirs_in(tasks_dir: Path) -> list[Path]:
    if not tasks_dir.is_dir():
        raise ValueError(
            f"tasks directory {tasks_dir} does not exist; generate tasks first "
            "(rollyard tasks demo --out DIR)"
        )
    dirs = sorted(p for p in tasks_dir.iterdir() if (p / "task.toml").is_file())
    if not dirs:
        raise ValueError(f"no task directories (with a task.toml) in {tasks_dir}")
    return dirs


def restore_trainer(store: TrajectoryStore, settings: TrainSettings) -> tuple[GRPOTrainer, int]:
    """The trainer to continue with and the first iteration still to run."""
    checkpoints = store.list_checkpoints(settings.run_id)
    if checkpoints and not settings.resume:
        raise ValueError(
            f"run {settings.run_id!r} already has {len(checkpoints)} checkpoint(s) in "
            f"{settings.store}; pass --resume to continue it or choose another --run-id"
        )
    if not checkpoints:
        policy = CandidateScorerPolicy(seed=settings.seed)
        return GRPOTrainer(policy, GRPOConfig(seed=settings.seed)), 0
    latest = max(checkpoints, key=lambda c: c.iteration)
    trainer = load_checkpoint(store, settings.run_id, latest.policy_version, seed=settings.seed)
    return trainer, latest.iteration + 1


def committed_trajectories(
    store: TrajectoryStore, run_id: str, iteration: int, outcomes: list[ShardOutcome]
) -> list[Trajectory]:
    """The iteration's trajectories the store holds as committed and not quarantined: the
    trainer's input, so it never trains on anything twice or on data a gate rejected."""
    committed = set(
        store.read_episodes(run_id, iteration, columns=["episode_id"]).column(0).to_pylist()
    )
    seen: set[str] = set()
    kept = []
    for outcome in outcomes:
        for trajectory in outcome.trajectories:
            if trajectory.episode_id in committed and trajectory.episode_id not in seen:
                seen.add(trajectory.episode_id)
                kept.append(trajectory)
    return kept


@flow(name="train", log_prints=False)
def train(settings: TrainSettings) -> list[IterationSummary]:
    logger = get_run_logger()
    store = TrajectoryStore(settings.store)
    task_dirs = task_dirs_in(Path(settings.tasks_dir))
    trainer, first_iteration = restore_trainer(store, settings)
    if first_iteration:
        logger.info("resuming run %s at iteration %d", settings.run_id, first_iteration)
    summaries: list[IterationSummary] = []
    for iteration in range(first_iteration, settings.iterations):
        started = time.monotonic()
        requests = plan_iteration(
            task_dirs,
            run_id=settings.run_id,
            iteration=iteration,
            policy=trainer.policy,
            tasks_per_iteration=settings.tasks_per_iteration,
            group_size=settings.group_size,
            shard_count=settings.shards_per_iteration,
            seed=settings.seed,
            episode_config=EpisodeConfig(max_steps=settings.max_steps, seed=settings.seed),
        )
        total = sum(len(r.episodes) for r in requests)
        _report("iteration_start", iteration=iteration, episodes=total)
        futures = [rollout_shard.submit(request, settings.store) for request in requests]
        outcomes: list[ShardOutcome] = []
        for future in as_completed(futures):
            outcome = future.result()
            outcomes.append(outcome)
            _report(
                "shard_done",
                iteration=iteration,
                episodes=len(outcome.trajectories),
                rewards=[t.reward for t in outcome.trajectories],
            )
        trajectories = committed_trajectories(store, settings.run_id, iteration, outcomes)
        quarantined = store.iteration_status(settings.run_id, iteration).quarantined
        version_before = trainer.policy.version
        metrics = update_policy(trainer, trajectories) if trajectories else None
        if metrics is not None:
            store.record_metrics(settings.run_id, iteration, metrics.as_dict())
        save_checkpoint(
            trainer,
            store,
            run_id=settings.run_id,
            iteration=iteration,
            trained_on_iterations=[iteration] if trajectories else [],
            n_episodes=len(trajectories),
            parent_policy_version=version_before,
        )
        rewards = [t.reward for t in trajectories if t.trainable and t.reward is not None]
        summary = IterationSummary(
            iteration=iteration,
            episodes=len(trajectories),
            reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
            pass_rate=sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0,
            infra_errors=sum(1 for t in trajectories if not t.trainable),
            policy_version=trainer.policy.version,
            quarantined=quarantined,
            wall_s=time.monotonic() - started,
        )
        summaries.append(summary)
        logger.info(
            "iteration %d: %d episodes, mean reward %.3f, pass rate %.2f, %d infra errors, %.1f s",
            iteration,
            summary.episodes,
            summary.reward_mean,
            summary.pass_rate,
            summary.infra_errors,
            summary.wall_s,
        )
        _report("iteration_done", summary=summary)
    if summaries:
        create_table_artifact(
            key=re.sub(r"[^a-z0-9-]+", "-", f"train-{settings.run_id}".lower()),
            table=[dataclasses.asdict(s) for s in summaries],
            description=f"Iterations of run {settings.run_id}",
        )
    return summaries


def run_training(
    settings: TrainSettings, *, workers: int = 2, dask_address: str | None = None
) -> list[IterationSummary]:
    """Run the flow on embedded defaults: a local Prefect API unless `PREFECT_API_URL` is set,
    and a Dask LocalCluster of `workers` processes unless `dask_address` names a scheduler."""
    from prefect_dask import DaskTaskRunner

    from flows.runtime import prefect_api, prefect_home_for

    if dask_address:
        runner = DaskTaskRunner(address=dask_address)
    else:
        runner = DaskTaskRunner(
            cluster_kwargs={
                "n_workers": workers,
                "threads_per_worker": 1,
                "processes": True,
                "dashboard_address": None,
            }
        )
    with prefect_api(prefect_home_for(settings.store)):
        return train.with_options(task_runner=runner)(settings)
