"""The train flow's Prefect tasks, each one library call: roll out and commit a shard, gate an
iteration, update the policy."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import cast

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import opaque

from flows.limits import sandbox_slots
from storage import TrajectoryStore
from storage.gates import GateReport, GateSettings
from storage.gates import gate_iteration as run_gate
from training.rollout import ShardOutcome, ShardRequest, rollout_shard_and_commit
from training.trainer import Trainer, TrainerMetrics
from training.trajectory import Trajectory


@task(name="rollout_shard", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def rollout_shard(request: ShardRequest, store_root: str) -> ShardOutcome:
    # Each episode in flight holds a sandbox: take that many of the host's sandbox slots, and
    # keep no more episodes in flight than the slots held (a shard asking for more than the
    # host's limit runs at the limit rather than past it).
    with sandbox_slots(min(request.max_concurrent_requests, len(request.episodes))) as held:
        if held < request.max_concurrent_requests:
            request = dataclasses.replace(request, max_concurrent_requests=held)
        return rollout_shard_and_commit(request, store_root)


@task(name="gate_iteration", cache_policy=NO_CACHE)
def gate_iteration(
    store: TrajectoryStore,
    run_id: str,
    iteration: int,
    settings: GateSettings,
    expected_episodes: int,
) -> GateReport:
    return run_gate(store, run_id, iteration, settings, expected_episodes=expected_episodes)


@task(name="update_policy", cache_policy=NO_CACHE)
def update_policy(
    trainer: Trainer, trajectories: list[Trajectory], stand_in_s: float = 0.0
) -> TrainerMetrics:
    # A benchmark's stand-in for an accelerator's update time: waiting, not computing, since
    # that time is spent on the trainer's device, not on the rollout hosts' CPUs.
    time.sleep(stand_in_s)
    return trainer.update(trajectories)


def run_update(
    trainer: Trainer, trajectories: list[Trajectory], *, stand_in_s: float = 0.0
) -> TrainerMetrics:
    """The `update_policy` task on this batch. The trainer and the batch go in `opaque`: Prefect
    otherwise walks every object inside them, twice, to find upstream futures there are none of
    (every trajectory, step and token list: ~5 s an update of the demo's 32 episodes)."""
    task_run = cast(Callable[..., TrainerMetrics], update_policy)  # the task takes annotations
    return task_run(opaque(trainer), opaque(trajectories), stand_in_s=stand_in_s)
