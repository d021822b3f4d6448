"""The train flow's streaming mode: groups roll out on Dask continuously, each finished group
enters the experience buffer at once, and the trainer takes a batch as soon as one is full.

One slow episode holds only its own group, never a step. The rollout side keeps at most
`(max_policy_lag + 1) * tasks_per_iteration` groups outstanding (running or buffered), planned
in waves with the policy of the moment, so a group planned now is trained on at most
`max_policy_lag` updates later unless it straggles; stragglers past the bound are dropped by the
buffer's rule (`training.streaming`), committed once and counted. Each step is one store
iteration: committed in one exactly-once shard, gated, trained on through `trainer.update`,
checkpointed and marked done like a synchronous iteration, so resume, the quality gate and
every reader work unchanged. The trainer is reached only through `training.iteration`'s
`finish_iteration` and the `update` callable: any `training.trainer.Trainer` (its `policy`,
`updates` and `update(batch)`) streams.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from prefect import get_run_logger, task
from prefect.cache_policies import NO_CACHE

from flows.errors import GateStoppedRun
from flows.progress import report_progress
from flows.shard_watch import (
    WORKER_CHECK_INTERVAL_S,
    HungShardWatch,
    no_worker_clock,
    shard_deadline_s,
)
from flows.train_settings import TrainSettings
from flows.train_tasks import gate_iteration, run_update
from storage import TrajectoryStore
from storage.gates import GateSettings
from training.episode import EpisodeConfig
from training.iteration import IterationSummary, finish_iteration
from training.recovery import RecoveryPolicy
from training.rollout import ShardRequest, plan_iteration, run_shard, worker_name
from training.streaming import (
    STREAM_SHARD,
    CompletedGroup,
    StreamBatch,
    StreamBuffer,
    commit_step,
)
from training.trainer import Trainer, TrainerMetrics
from training.trajectory import Trajectory

WAVES_PER_RUN_STEP = 1000
"""Wave numbers (the rollout keys' iteration before re-keying) start at step x this, so a
resumed run samples fresh task draws instead of repeating the first waves."""


def run_group(request: ShardRequest, planned_at_update: int) -> CompletedGroup:
    """Run one group's episodes (a `by_group` shard) without committing: the step it lands in
    is known only when it finishes, and the step commits it."""
    return CompletedGroup(tuple(run_shard(request)), planned_at_update, worker_name())


@task(name="rollout_group", retries=2, retry_delay_seconds=1, cache_policy=NO_CACHE)
def rollout_group(request: ShardRequest, planned_at_update: int) -> CompletedGroup:
    return run_group(request, planned_at_update)


class _Outstanding:
    """Submitted groups not yet finished, with a wake-up on each finish (any task runner)."""

    def __init__(self) -> None:
        self.futures: list[Any] = []
        self.finished = threading.Event()

    def add(self, future: Any) -> None:
        self.futures.append(future)
        future.wrapped_future.add_done_callback(lambda _: self.finished.set())

    def take_done(self) -> list[Any]:
        done = [f for f in self.futures if f.wrapped_future.done()]
        self.futures = [f for f in self.futures if not f.wrapped_future.done()]
        return done


def train_streaming(
    settings: TrainSettings,
    store: TrajectoryStore,
    trainer: Trainer,
    task_dirs: list[Path],
    first_step: int,
    recovery: RecoveryPolicy,
) -> list[IterationSummary]:
    """The streaming loop of the `train` flow (see the module docstring)."""
    logger = get_run_logger()
    run_id = settings.run_id
    batch_groups = settings.tasks_per_iteration
    buffer = StreamBuffer(batch_groups=batch_groups, max_policy_lag=settings.max_policy_lag)
    outstanding = _Outstanding()
    watch = HungShardWatch(
        lambda _future: shard_deadline_s(settings.group_size, settings.episode_deadline_s)
    )
    summaries: list[IterationSummary] = []
    step = first_step
    if step < settings.iterations and store.is_committed(run_id, step, STREAM_SHARD):
        summaries.append(_close_interrupted_step(store, trainer, settings, step))
        report_progress("iteration_done", summary=summaries[-1])
        step += 1
    wave = step * WAVES_PER_RUN_STEP
    last_step_end = time.monotonic()
    idle_since: float | None = None

    def fill() -> None:
        nonlocal wave
        while (
            len(outstanding.futures) + len(buffer) + batch_groups
            <= (settings.max_policy_lag + 1) * batch_groups
        ):
            requests = plan_iteration(
                task_dirs,
                run_id=run_id,
                iteration=wave,
                policy=trainer.policy,
                tasks_per_iteration=batch_groups,
                group_size=settings.group_size,
                shard_count=batch_groups,
                seed=settings.seed,
                episode_config=EpisodeConfig(max_steps=settings.max_steps, seed=settings.seed),
                recovery=recovery,
                faults=settings.faults,
                schedule="by_group",
                max_concurrent_requests=settings.max_concurrent_requests,
            )
            for request in requests:
                outstanding.add(rollout_group.submit(request, trainer.updates))
            report_progress(
                "iteration_start",
                iteration=step,
                episodes=sum(len(r.episodes) for r in requests),
            )
            wave += 1

    while step < settings.iterations:
        fill()
        outstanding.finished.clear()
        done = outstanding.take_done()
        if not done:
            if not outstanding.finished.wait(WORKER_CHECK_INTERVAL_S):
                watch(outstanding.futures)
                idle_since = no_worker_clock(
                    idle_since, settings.no_worker_timeout_s, len(outstanding.futures)
                )
            continue
        idle_since = None
        for future in done:
            group: CompletedGroup = future.result()
            buffer.add(group)
            report_progress(
                "shard_done",
                iteration=step,
                episodes=len(group.trajectories),
                rewards=[t.reward for t in group.trajectories],
                queued_shards=len(outstanding.futures),
            )
        while step < settings.iterations and (batch := buffer.take_batch(trainer.updates)):
            waited_s = time.monotonic() - last_step_end
            summary = _train_step(store, trainer, settings, step, batch, waited_s, len(buffer))
            last_step_end = time.monotonic()
            summaries.append(summary)
            report_progress("iteration_done", summary=summary)
            step += 1
            fill()  # the new policy's groups start before the next batch is looked at
    for future in outstanding.futures:
        future.wrapped_future.cancel()
    if outstanding.futures or len(buffer):
        logger.info(
            "streaming run %s done: %d group(s) still running and %d finished but not needed "
            "were not committed (rolled out past the last step)",
            run_id,
            len(outstanding.futures),
            len(buffer),
        )
    return summaries


def _train_step(
    store: TrajectoryStore,
    trainer: Trainer,
    settings: TrainSettings,
    step: int,
    batch: StreamBatch,
    waited_s: float,
    carried_over_groups: int,
) -> IterationSummary:
    """Commit the batch as iteration `step`, gate it, update on it unless quarantined,
    checkpoint and mark the step done."""
    logger = get_run_logger()
    every, trained, _ = commit_step(store, batch, run_id=settings.run_id, step=step)
    gate = gate_iteration(
        store,
        settings.run_id,
        step,
        GateSettings.from_env(on_failure=settings.gate_on_failure),
        len(every),
    )
    if gate.quarantined:
        logger.warning("step %d quarantined by its quality gate: %s", step, gate.reason)
        if gate.should_stop:
            raise GateStoppedRun(
                f"step {step} failed its quality gate and gate_on_failure=stop: {gate.reason}"
            )
    # Filled while the update runs, read by finish_iteration after it: the trainer's busy time.
    extra: dict[str, float] = {
        "stream_wait_s": waited_s,
        "carried_over_groups": float(carried_over_groups),
        "stale_dropped_groups": float(len(batch.stale)),
    }

    def timed_update(trainer: Trainer, trajectories: list[Trajectory]) -> TrainerMetrics:
        started = time.monotonic()
        metrics = run_update(trainer, trajectories, stand_in_s=settings.update_stand_in_s)
        extra["update_s"] = time.monotonic() - started
        return metrics

    summary = finish_iteration(
        store,
        trainer,
        run_id=settings.run_id,
        iteration=step,
        batch=every,
        trainable=[] if gate.quarantined else trained,
        quarantined=gate.quarantined,
        gate_reason=gate.reason,
        wall_s=waited_s,
        extra_metrics=extra,
        update=timed_update,
        policy_lag=batch.max_policy_lag,
        stale_dropped=batch.stale_episodes,
    )
    logger.info(
        "step %d: %d episodes (%d stale dropped), mean reward %.3f, max policy lag %d, "
        "waited %.1f s for the batch, %d group(s) carried over",
        step,
        summary.episodes,
        batch.stale_episodes,
        summary.reward_mean,
        batch.max_policy_lag,
        waited_s,
        carried_over_groups,
    )
    return summary


def _close_interrupted_step(
    store: TrajectoryStore, trainer: Trainer, settings: TrainSettings, step: int
) -> IterationSummary:
    """A step committed before the run stopped but never marked done: its groups' rollouts were
    lost with the flow, so it is closed without an update (its episodes stay, once, counted as
    dropped) and streaming resumes at the next step."""
    committed = store.read_episodes(
        settings.run_id, step, columns=["episode_id"], include_quarantined=True
    ).num_rows
    gate = gate_iteration(
        store,
        settings.run_id,
        step,
        GateSettings.from_env(on_failure=settings.gate_on_failure),
        committed,
    )
    get_run_logger().warning(
        "step %d of run %s was committed but not trained on before the run stopped: closing it "
        "without an update (%d episodes kept, not trained on)",
        step,
        settings.run_id,
        committed,
    )
    return finish_iteration(
        store,
        trainer,
        run_id=settings.run_id,
        iteration=step,
        batch=[],
        trainable=[],
        quarantined=gate.quarantined,
        gate_reason=gate.reason,
        wall_s=0.0,
        stale_dropped=committed,
    )
