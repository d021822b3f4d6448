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

The trainer's path is update after update: while step s's update runs (on a thread of its own),
the flow takes the next full batch, commits it as step s+1 and gates it, so the update of s+1
waits only for whatever of that gate is left when s's update ends (`_GatedStep`,
`_TrainingStep`).
"""

from __future__ import annotations

import contextvars
import dataclasses
import pickle
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, cast

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
from storage.gates import GateReport, GateSettings
from training.episode import EpisodeConfig
from training.iteration import IterationSummary, finish_iteration
from training.policy import Policy
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
    """Submitted groups not yet finished, each setting `wake` when it finishes (any task
    runner)."""

    def __init__(self, wake: threading.Event) -> None:
        self.futures: list[Any] = []
        self.wake = wake

    def add(self, future: Any) -> None:
        self.futures.append(future)
        future.wrapped_future.add_done_callback(lambda _: self.wake.set())

    def take_done(self) -> list[Any]:
        # Asked once per future: a group finishing between two looks would be in neither list.
        finished = {id(f): f.wrapped_future.done() for f in self.futures}
        done = [f for f in self.futures if finished[id(f)]]
        self.futures = [f for f in self.futures if not finished[id(f)]]
        return done


@dataclasses.dataclass(slots=True)
class _GatedStep:
    """A step committed and gated, waiting for the trainer."""

    step: int
    batch: StreamBatch
    every: list[Trajectory]
    """Every trajectory the step committed (stale groups included)."""
    trained: list[Trajectory]
    """The part within the staleness bound."""
    gate: GateReport
    metrics: dict[str, float]
    """The step's own metrics so far: its batch wait, commit and gate."""


@dataclasses.dataclass(frozen=True, slots=True)
class _TrainingStep:
    """A gated step being trained on, checkpointed and marked done on the trainer's thread."""

    step: int
    done: Future[tuple[IterationSummary, float]]
    """The step's summary and when (monotonic s) the trainer thread finished it."""
    updates_after: int
    """The trainer's update count once this step is done, at most: what the next batch's lags
    are measured against (an update adds at most one)."""


def train_streaming(
    settings: TrainSettings,
    store: TrajectoryStore,
    trainer: Trainer,
    task_dirs: list[Path],
    first_step: int,
    recovery: RecoveryPolicy,
) -> list[IterationSummary]:
    """The streaming loop of the `train` flow (see the module docstring).

    One loop on the flow's thread admits finished groups, plans new ones, and commits and
    gates the next batch; the update, checkpoint and completion marker of the step before it
    run meanwhile on a single trainer thread. The guarantees hold as in a loop without the
    overlap:

    - a gated-out batch is never trained on: a step reaches the trainer thread only after its
      gate's verdict is in, and a quarantined one goes there with nothing to train on (or,
      under `gate_on_failure=stop`, stops the run before it goes there at all);
    - exactly once: each step is committed once, on this thread, in step order, and steps are
      marked done in step order (one trainer thread, and a step starts there only after the
      one before it finished); a resumed run closes every step committed but not marked done
      (`_close_interrupted_step`: up to two, the one training and the one gated);
    - staleness: a batch is taken while the step before it may still be updating, so its lags
      are measured against the update count that step ends with (`_TrainingStep.updates_after`,
      an upper bound: a lag is never understated);
    - new groups are planned with a copy of the policy taken when no update runs (after each
      step, before the next one starts on the trainer thread): an update may change the
      trainer's policy in place (the built-in one does), and planning pickles it.
    """
    logger = get_run_logger()
    run_id = settings.run_id
    batch_groups = settings.tasks_per_iteration
    buffer = StreamBuffer(batch_groups=batch_groups, max_policy_lag=settings.max_policy_lag)
    wake = threading.Event()
    outstanding = _Outstanding(wake)
    watch = HungShardWatch(
        lambda _future: shard_deadline_s(settings.group_size, settings.episode_deadline_s)
    )
    summaries: list[IterationSummary] = []
    step = first_step
    while step < settings.iterations and store.is_committed(run_id, step, STREAM_SHARD):
        summaries.append(_close_interrupted_step(store, trainer, settings, step))
        report_progress("iteration_done", summary=summaries[-1])
        step += 1
    wave = step * WAVES_PER_RUN_STEP
    gated: _GatedStep | None = None
    training: _TrainingStep | None = None
    rollout_policy, rollout_policy_updates = _policy_copy(trainer), trainer.updates
    batch_wanted_since = time.monotonic()
    """When the loop last had room for a batch (the trainer thread took the gated one)."""
    trainer_free_since = time.monotonic()
    """When the trainer thread last finished a step (its idle time starts there)."""
    idle_since: float | None = None

    def fill() -> None:
        nonlocal wave
        while (
            len(outstanding.futures)
            + len(buffer)
            + (len(gated.batch.groups) if gated else 0)
            + batch_groups
            <= (settings.max_policy_lag + 1) * batch_groups
        ):
            requests = plan_iteration(
                task_dirs,
                run_id=run_id,
                iteration=wave,
                policy=rollout_policy,
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
                outstanding.add(rollout_group.submit(request, rollout_policy_updates))
            report_progress(
                "iteration_start",
                iteration=step,
                episodes=sum(len(r.episodes) for r in requests),
            )
            wave += 1

    trainer_thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="rollyard-trainer")
    try:
        while training is not None or gated is not None or step < settings.iterations:
            wake.clear()  # before looking: a finish from now on wakes the wait below
            if training is not None and training.done.done():
                summary, trainer_free_since = training.done.result()  # or its error, raised
                summaries.append(summary)
                report_progress("iteration_done", summary=summary)
                training = None
                rollout_policy, rollout_policy_updates = _policy_copy(trainer), trainer.updates
            if training is None and gated is not None:
                if gated.gate.should_stop:
                    raise GateStoppedRun(
                        f"step {gated.step} failed its quality gate and gate_on_failure=stop: "
                        f"{gated.gate.reason}"
                    )
                trains = bool(gated.trained) and not gated.gate.quarantined
                updates_after = trainer.updates + (1 if trains else 0)  # read before it runs
                gated.metrics["trainer_wait_s"] = time.monotonic() - trainer_free_since
                done = trainer_thread.submit(
                    contextvars.copy_context().run,  # the flow run's Prefect context
                    _train_step,
                    store,
                    trainer,
                    settings,
                    gated,
                )
                done.add_done_callback(lambda _: wake.set())
                training = _TrainingStep(gated.step, done, updates_after)
                gated, batch_wanted_since = None, time.monotonic()
            fill()  # after the trainer thread got its step: planning is not on its path
            finished = outstanding.take_done()
            if finished:
                idle_since = None
            for future in finished:
                group: CompletedGroup = future.result()
                buffer.add(group)
                report_progress(
                    "shard_done",
                    iteration=step,
                    episodes=len(group.trajectories),
                    rewards=[t.reward for t in group.trajectories],
                    queued_shards=len(outstanding.futures),
                )
            if gated is None and step < settings.iterations:
                batch = buffer.take_batch(training.updates_after if training else trainer.updates)
                if batch is not None:
                    waited_s = time.monotonic() - batch_wanted_since
                    gated = _commit_and_gate(store, settings, step, batch, waited_s, len(buffer))
                    step += 1
                    continue
            if not wake.wait(WORKER_CHECK_INTERVAL_S) and outstanding.futures:
                watch(outstanding.futures)
                idle_since = no_worker_clock(
                    idle_since, settings.no_worker_timeout_s, len(outstanding.futures)
                )
    finally:
        # A step on the trainer thread finishes (or fails) whole before the flow goes on.
        trainer_thread.shutdown(wait=True)
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


def _policy_copy(trainer: Trainer) -> Policy:
    """The trainer's policy as it is now, apart from it (a pickle round trip: planning pickles
    a policy anyway, so every policy survives one)."""
    return cast(Policy, pickle.loads(pickle.dumps(trainer.policy)))


def _commit_and_gate(
    store: TrajectoryStore,
    settings: TrainSettings,
    step: int,
    batch: StreamBatch,
    waited_s: float,
    carried_over_groups: int,
) -> _GatedStep:
    """Commit the batch as iteration `step` and gate it (on the flow's thread, while the step
    before it may be training)."""
    commit_started = time.monotonic()
    every, trained, _ = commit_step(store, batch, run_id=settings.run_id, step=step)
    gate_started, gate_started_epoch_s = time.monotonic(), time.time()
    gate = gate_iteration(
        store,
        settings.run_id,
        step,
        GateSettings.from_env(on_failure=settings.gate_on_failure),
        len(every),
    )
    if gate.quarantined:
        get_run_logger().warning("step %d quarantined by its quality gate: %s", step, gate.reason)
    metrics = {
        "stream_wait_s": waited_s,
        "commit_s": gate_started - commit_started,
        "gate_s": time.monotonic() - gate_started,
        "gate_started_epoch_s": gate_started_epoch_s,
        "gate_ended_epoch_s": time.time(),
        "carried_over_groups": float(carried_over_groups),
        "stale_dropped_groups": float(len(batch.stale)),
    }
    return _GatedStep(step, batch, every, trained, gate, metrics)


def _train_step(
    store: TrajectoryStore, trainer: Trainer, settings: TrainSettings, gated: _GatedStep
) -> tuple[IterationSummary, float]:
    """Update on a gated step unless quarantined, checkpoint it and mark it done (on the
    trainer's thread); the summary, and when (monotonic s) it was done."""
    # Filled while the update runs, read by finish_iteration after it.
    extra = dict(gated.metrics)

    def timed_update(trainer: Trainer, trajectories: list[Trajectory]) -> TrainerMetrics:
        started, extra["update_started_epoch_s"] = time.monotonic(), time.time()
        metrics = run_update(trainer, trajectories, stand_in_s=settings.update_stand_in_s)
        extra["update_s"], extra["update_ended_epoch_s"] = time.monotonic() - started, time.time()
        return metrics

    batch, waited_s = gated.batch, gated.metrics["stream_wait_s"]
    summary = finish_iteration(
        store,
        trainer,
        run_id=settings.run_id,
        iteration=gated.step,
        batch=gated.every,
        trainable=[] if gated.gate.quarantined else gated.trained,
        quarantined=gated.gate.quarantined,
        gate_reason=gated.gate.reason,
        wall_s=waited_s,
        extra_metrics=extra,
        update=timed_update,
        policy_lag=batch.max_policy_lag,
        stale_dropped=batch.stale_episodes,
    )
    get_run_logger().info(
        "step %d: %d episodes (%d stale dropped), mean reward %.3f, max policy lag %d, "
        "waited %.1f s for the batch, %d group(s) carried over",
        gated.step,
        summary.episodes,
        batch.stale_episodes,
        summary.reward_mean,
        batch.max_policy_lag,
        waited_s,
        int(gated.metrics["carried_over_groups"]),
    )
    return summary, time.monotonic()


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
