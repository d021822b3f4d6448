"""Training in this process, without Prefect or Dask: for notebooks, scripts and debugging.

The iteration is the train flow's, step for step — plan shards, roll out and commit each shard
to the store, gate the committed batch, train on what the gate lets through, checkpoint, mark
the iteration done — run sequentially over one sandbox pool. A run started here can be
continued by `rollyard train --resume` and the other way round:

    from tasks_lib.sources.families.demo.generate import generate_demo_tasks
    from training.local import train_locally

    generate_demo_tasks("tasks", 8, seed=0)
    for it in train_locally("tasks", "store", run_id="nb-0", iterations=3):
        print(it.iteration, it.reward_mean, it.pass_rate)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sandboxes import Limits, SandboxPool
from storage import TrajectoryStore
from storage.gates import GateSettings, gate_iteration
from storage.lease import writer_lease
from training.episode import EpisodeConfig
from training.errors import TrainingSettingsError
from training.iteration import (
    IterationSummary,
    check_training_policy,
    finish_iteration,
    restore_trainer,
    task_dirs_in,
)
from training.policy import Policy
from training.rollout import plan_iteration, rollout_shard_and_commit
from training.trajectory import Trajectory

if TYPE_CHECKING:
    from training.lm.conversation import ChatSampling
    from training.lm.grpo_config import LMTrainerConfig


def rollout_batch(
    task_dirs: Sequence[str | Path],
    store: TrajectoryStore,
    *,
    policy: Policy,
    run_id: str,
    iteration: int,
    tasks_per_iteration: int = 4,
    group_size: int = 4,
    max_steps: int = 8,
    seed: int = 0,
    pool: SandboxPool | None = None,
    max_concurrent_requests: int = 1,
) -> list[Trajectory]:
    """Roll out one batch (a GRPO group of `group_size` samples on each of
    `tasks_per_iteration` sampled tasks) with any policy (`training.lm.spec.policy_from_spec`)
    and commit it to the store as (run_id, iteration); `max_concurrent_requests` episodes are in
    flight at once (see `ShardRequest`).

    Committing is idempotent: a batch already in the store is run again but written once."""
    requests = plan_iteration(
        [Path(d) for d in task_dirs],
        run_id=run_id,
        iteration=iteration,
        policy=policy,
        tasks_per_iteration=tasks_per_iteration,
        group_size=group_size,
        shard_count=1,
        seed=seed,
        episode_config=EpisodeConfig(max_steps=max_steps, seed=seed),
        max_concurrent_requests=max_concurrent_requests,
    )
    own_pool = pool is None
    pool = pool or SandboxPool(limits=Limits(), max_idle_per_snapshot=1)
    try:
        outcomes = [rollout_shard_and_commit(r, store.root, pool=pool) for r in requests]
    finally:
        if own_pool:
            pool.close()
    return [t for outcome in outcomes for t in outcome.trajectories]


def train_locally(
    tasks_dir: str | Path,
    store: str | Path | TrajectoryStore,
    *,
    run_id: str = "local-0",
    policy: str = "builtin",
    iterations: int = 3,
    tasks_per_iteration: int = 4,
    group_size: int = 4,
    max_steps: int = 8,
    seed: int = 0,
    resume: bool = False,
    lm_config: LMTrainerConfig | None = None,
    sampling: ChatSampling | None = None,
    trainer_model: str | Path | None = None,
    gate_settings: GateSettings | None = None,
    on_iteration: Callable[[IterationSummary], None] | None = None,
) -> list[IterationSummary]:
    """Train the policy `policy` names (a spec, `training.lm.spec`, which also chooses the
    trainer) with GRPO for `iterations` iterations, in this process. The spec and its server are
    checked first (`check_training_policy`), before anything is written.

    Gate thresholds come from `ROLLYARD_GATE_*` unless `gate_settings` is given; a quarantined
    iteration is recorded and skipped by the trainer, as in the flow. `on_iteration` is called
    after each iteration (progress in a notebook)."""
    if iterations < 1:
        raise TrainingSettingsError(f"iterations must be >= 1, got {iterations}")
    spec = check_training_policy(policy, trainer_model=trainer_model)
    store = store if isinstance(store, TrajectoryStore) else TrajectoryStore(store)
    task_dirs = task_dirs_in(tasks_dir)
    trainer, first = restore_trainer(
        store,
        run_id,
        seed=seed,
        resume=resume,
        policy=spec,
        lm_config=lm_config,
        sampling=sampling,
        trainer_model=trainer_model,
    )
    gate_settings = gate_settings or GateSettings.from_env()
    done: list[IterationSummary] = []
    # One writer per store, as for the flow (`storage.lease`).
    with (
        writer_lease(store.root, run_id=run_id),
        SandboxPool(limits=Limits(), max_idle_per_snapshot=1) as pool,
    ):
        for iteration in range(first, iterations):
            started = time.monotonic()
            batch = rollout_batch(
                task_dirs,
                store,
                policy=trainer.policy,
                run_id=run_id,
                iteration=iteration,
                tasks_per_iteration=tasks_per_iteration,
                group_size=group_size,
                max_steps=max_steps,
                seed=seed,
                pool=pool,
            )
            report = gate_iteration(
                store, run_id, iteration, gate_settings, expected_episodes=len(batch)
            )
            # The trainer reads what the store holds as committed and not quarantined.
            kept = set(
                store.read_episodes(run_id, iteration, columns=["episode_id"]).column(0).to_pylist()
            )
            trainable = [t for t in batch if t.episode_id in kept]
            summary = finish_iteration(
                store,
                trainer,
                run_id=run_id,
                iteration=iteration,
                batch=batch,
                trainable=trainable,
                quarantined=report.quarantined,
                gate_reason=report.reason,
                wall_s=time.monotonic() - started,
            )
            done.append(summary)
            if on_iteration is not None:
                on_iteration(summary)
    return done
