"""The `train` flow: sample tasks, roll out on Dask, commit, gate, update the policy, checkpoint.

Each iteration reads top to bottom as library calls wrapped in Prefect tasks. A Prefect task is
a shard of episodes (Prefect costs 160-270 ms per task under the Dask runner here, so episodes
are never one task each). Exactly-once lives in the store, not in Prefect's result cache: shards
commit under (run, iteration, shard), and the trainer consumes only what the store says is
committed and not quarantined by the iteration's quality gate. In async mode the next
iterations roll out while the trainer updates, within a policy-lag bound; in streaming mode
(`train_streaming`, at the end) finished groups feed the trainer as they come. Resume starts after
the last iteration whose completion marker (a metrics row written last) is in the store.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, cast

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE
from prefect.futures import wait as wait_for_futures
from prefect.utilities.annotations import opaque

from flows.artifacts import publish_iteration_artifacts
from flows.errors import FlowSettingsError, GateStoppedRun, NoWorkersError, ShardDeadlineError
from flows.limits import sandbox_slots, training_run_slot
from storage import TrajectoryStore
from storage.fsck import check_before_use
from storage.gates import GateReport, GateSettings
from storage.gates import gate_iteration as run_gate
from storage.lease import writer_lease
from training.episode import EpisodeConfig
from training.iteration import (
    IterationSummary,
    check_training_policy,
    finish_iteration,
    restore_trainer,
    task_dirs_in,
)
from training.lm.conversation import ChatSampling
from training.lm.grpo_config import LMTrainerConfig
from training.lm.spec import parse_policy_spec
from training.recovery import FaultPlan, RecoveryPolicy
from training.rollout import (
    Schedule,
    ShardOutcome,
    ShardRequest,
    plan_iteration,
    predict_episode_seconds,
    rollout_shard_and_commit,
    run_shard,
    worker_name,
)
from training.streaming import (
    STREAM_SHARD,
    CompletedGroup,
    StreamBatch,
    StreamBuffer,
    commit_step,
)
from training.trainer import Trainer, TrainerMetrics
from training.trajectory import Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class TrainSettings:
    """Parameters of one training run (the CLI and deployments fill these)."""

    tasks_dir: str
    """Directory holding task directories (one per task)."""
    store: str
    """Store root (local directory or object-storage URI)."""
    run_id: str = "run-0"
    policy: str = "builtin"
    """The policy spec: `builtin`, `openai:BASE_URL#MODEL` or `hf:DIR` (`training.lm.spec`);
    checked before any episode, and it chooses the trainer."""
    max_concurrent_requests: int = 1
    """Episodes a shard keeps in flight at once, so a model server batches their requests."""
    lm_trainer: LMTrainerConfig | None = None
    """Hyper-parameters of the language-model trainer (`hf:` and `openai:` policies); None: the
    defaults."""
    sampling: ChatSampling | None = None
    """How a chat policy samples each turn (None: `ChatSampling()`); the LM trainer divides
    logits by the same temperature."""
    trainer_model: str | None = None
    """`openai:` policies: the served model's weights on this machine; the trainer trains a
    LoRA adapter on them and loads each new one into the server."""
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
    mode: str = "sync"
    """`sync`: roll out iteration i with the policy after update i-1, then update. `async`:
    rollouts of the next `max_policy_lag` iterations are already running while the trainer
    updates, so neither side waits; episodes carry their policy lag. `streaming`: groups roll
    out continuously and the trainer takes a batch of `tasks_per_iteration` groups as soon as
    one has finished (`train_streaming`); each such batch is an iteration of the store."""
    max_policy_lag: int = 1
    """Async and streaming: how many updates behind the trainer a consumed episode's policy
    may be; staler episodes are not trained on (counted in the metrics)."""
    schedule: Schedule = "longest_first"
    """Shard planning: `longest_first` (durations predicted from the store) or `round_robin`."""
    max_attempts: int = 3
    """Attempts per episode after infra failures (sandbox crash, hang, OOM of the host)."""
    recovery_mode: str = "replay"
    """`replay` the recorded actions into a fresh sandbox, or `restart` the episode."""
    faults: FaultPlan | None = None
    """Injected faults, for the fault-injection suite and benchmark only."""
    no_worker_timeout_s: float = 120.0
    """How long the flow waits while the Dask cluster has no worker at all before it fails with
    a `NoWorkersError` (queued shards would otherwise wait without end); the run continues from
    its last finished iteration with `resume`."""
    episode_deadline_s: float = 900.0
    """Orchestration-level deadline of one episode: a shard still running after its episodes'
    deadlines summed (plus `SHARD_START_ALLOWANCE_S`) is treated as hung (a worker that stopped
    answering, a call stuck in the kernel); its worker is restarted, its episodes run again on
    a live one and commit exactly once. Inside, each episode also has its task's own budget."""
    update_stand_in_s: float = 0.0
    """Benchmarks only: seconds each update waits before the real one, standing in for the
    update time of a trainer on an accelerator (`benchmarks/async.py`)."""
    max_concurrent_runs_per_store: int = 2
    """Slots of the store's Prefect limit on training runs (`flows.limits`) when this run
    creates it; a run beyond them waits for a slot. A limit that exists keeps its slots."""
    gate_on_failure: str = "continue"
    """What a failed quality gate does besides quarantining the iteration: `continue` training
    (the quarantined batch is not trained on) or `stop` the run. Thresholds come from
    `ROLLYARD_GATE_*` settings (see storage.gates.GateSettings)."""

    def __post_init__(self) -> None:
        parse_policy_spec(self.policy)  # a malformed spec fails here, before anything runs
        if self.max_concurrent_requests < 1:
            raise FlowSettingsError(
                f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}"
            )
        if self.mode not in ("sync", "async", "streaming"):
            raise FlowSettingsError(
                f"mode must be 'sync', 'async' or 'streaming', got {self.mode!r}"
            )
        if self.max_policy_lag < 1:
            raise FlowSettingsError(f"max_policy_lag must be >= 1, got {self.max_policy_lag}")
        if self.iterations < 1:
            raise FlowSettingsError(f"iterations must be >= 1, got {self.iterations}")
        if self.max_concurrent_runs_per_store < 1:
            raise FlowSettingsError(
                "max_concurrent_runs_per_store must be >= 1, got "
                f"{self.max_concurrent_runs_per_store}"
            )
        if not self.no_worker_timeout_s > 0:
            raise FlowSettingsError(
                f"no_worker_timeout_s must be positive, got {self.no_worker_timeout_s}"
            )
        if not self.episode_deadline_s > 0:
            raise FlowSettingsError(
                f"episode_deadline_s must be positive, got {self.episode_deadline_s}"
            )
        if self.update_stand_in_s < 0:
            raise FlowSettingsError(f"update_stand_in_s must be >= 0, got {self.update_stand_in_s}")
        if self.schedule not in ("longest_first", "round_robin"):
            raise FlowSettingsError(
                f"schedule must be 'longest_first' or 'round_robin', got {self.schedule!r}"
            )
        if self.gate_on_failure not in ("continue", "stop"):
            raise FlowSettingsError(
                f"gate_on_failure must be 'continue' or 'stop', got {self.gate_on_failure!r}"
            )

    @property
    def pipeline_depth(self) -> int:
        """Iterations rolled out ahead of the trainer."""
        return self.max_policy_lag if self.mode == "async" else 0


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
    # Each episode in flight holds a sandbox: take that many of the host's sandbox slots, and
    # keep no more episodes in flight than the slots held (a shard asking for more than the
    # host's limit runs at the limit rather than past it).
    with sandbox_slots(min(request.max_concurrent_requests, len(request.episodes))) as held:
        if held < request.max_concurrent_requests:
            request = dataclasses.replace(request, max_concurrent_requests=held)
        return rollout_shard_and_commit(request, store_root)


# How often the flow looks at the cluster while it waits for shards.
WORKER_CHECK_INTERVAL_S = 5.0


def dask_worker_count() -> int | None:
    """Workers connected to the Dask scheduler of the running flow's task runner; None outside a
    flow, under another task runner, or when the scheduler does not answer."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    try:
        client = getattr(context.task_runner, "client", None) if context else None
        if client is None:
            return None
        return len(client.scheduler_info(n_workers=-1)["workers"])
    except Exception:  # a runner not started, or a scheduler that went away: nothing to tell
        return None


def completed_while_workers_remain(
    futures: list[Any],
    *,
    no_worker_timeout_s: float,
    check_interval_s: float = WORKER_CHECK_INTERVAL_S,
    worker_count: Callable[[], int | None] = dask_worker_count,
    watch: Callable[[list[Any]], None] | None = None,
) -> Iterator[Any]:
    """Yield `futures` as they finish (within `check_interval_s`), and raise `NoWorkersError`
    once the cluster has had no worker for `no_worker_timeout_s` with some still unfinished.

    A scheduler keeps tasks queued while it has no worker (every worker lost, a cluster scaled
    to zero), so waiting for them alone could last forever. Workers that come back (a nanny's
    restart, an autoscaler) reset the clock; a slow shard on a live worker never trips it.
    `watch` sees the unfinished futures after every wait (the hung-shard deadlines).
    """
    pending = list(futures)
    idle_since: float | None = None
    while pending:
        # Prefect's bounded wait, not `as_completed(timeout=...)`: the latter's timeout also
        # covers the caller's code between two yields.
        done, _ = wait_for_futures(pending, timeout=check_interval_s)
        finished = [future for future in pending if future in done]
        pending = [future for future in pending if future not in done]
        if pending and watch is not None:
            watch(pending)
        if finished:
            idle_since = None
        elif worker_count() == 0:
            now = time.monotonic()
            idle_since = idle_since if idle_since is not None else now
            if now - idle_since >= no_worker_timeout_s:
                raise NoWorkersError(
                    f"the Dask cluster has had no worker for {now - idle_since:.0f} s with "
                    f"{len(pending)} shard(s) still queued; start workers (or check why they "
                    "died: memory, the machine) and rerun with --resume"
                )
        else:
            idle_since = None
        yield from finished


SHARD_START_ALLOWANCE_S = 60.0
"""Added to a shard's deadline for what is not an episode: start, sandbox opens, the commit."""
HUNG_SHARD_RESTARTS = 2
"""Worker restarts one shard may cause before the run fails (the same shard hanging on fresh
workers is the task's or the host's fault, not a worker's)."""


def _processing_workers(dask_scheduler: Any, keys: list[str]) -> dict[str, str]:
    """Run on the scheduler: the worker each of `keys` is being processed on."""
    found = {}
    for key in keys:
        state = dask_scheduler.tasks.get(key)
        if state is not None and state.processing_on is not None:
            found[key] = state.processing_on.address
    return found


async def _remove_worker(dask_scheduler: Any, address: str) -> str:
    """Run on the scheduler: forget a worker that does not answer; its tasks are rescheduled."""
    return str(await dask_scheduler.remove_worker(address, stimulus_id="rollyard-shard-deadline"))


class HungShardWatch:
    """Deadlines for running shards. A shard's clock starts when the Dask scheduler is first
    seen to have it processing on a worker (looked up at each wait, so a worker that stopped
    answering cannot hide it); past `deadline_s`, that worker is restarted by its nanny (or,
    without one, removed from the scheduler), which puts the shard back in the queue for a live
    worker. The store commits a shard once, so a replay after a restart, or a hung worker that
    wakes up and commits late, writes nothing twice."""

    def __init__(
        self, deadline_s: Callable[[Any], float], *, max_restarts: int = HUNG_SHARD_RESTARTS
    ) -> None:
        self._deadline_s = deadline_s
        self._max_restarts = max_restarts
        self._restarts: dict[Any, int] = {}
        self._on_worker_since: dict[Any, tuple[str, float]] = {}
        self.restarted_workers: list[str] = []
        """Addresses of the workers restarted or removed, in order."""

    def __call__(self, pending: list[Any]) -> None:
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        client = getattr(context.task_runner, "client", None) if context else None
        if client is None:
            return  # not under the Dask runner: nothing to restart
        workers = client.run_on_scheduler(
            _processing_workers, keys=[future.wrapped_future.key for future in pending]
        )
        now = time.monotonic()
        overdue: dict[str, list[Any]] = {}
        for future in pending:
            address = workers.get(future.wrapped_future.key)
            if address is None:
                self._on_worker_since.pop(future, None)  # queued: no clock
                continue
            seen = self._on_worker_since.get(future)
            if seen is None or seen[0] != address:
                self._on_worker_since[future] = seen = (address, now)
            if now - seen[1] > self._deadline_s(future):
                overdue.setdefault(address, []).append(future)
        for address, futures in overdue.items():
            for future in futures:
                if self._restarts.get(future, 0) >= self._max_restarts:
                    raise ShardDeadlineError(
                        f"a shard (task run {future.task_run_id}) ran past its deadline of "
                        f"{self._deadline_s(future):.0f} s after {self._max_restarts} worker "
                        "restarts; look at the worker's host and the task, then rerun with "
                        "--resume"
                    )
            self._restart(client, address)
            for future in futures:
                self._restarts[future] = self._restarts.get(future, 0) + 1
                self._on_worker_since.pop(future, None)

    def _restart(self, client: Any, address: str) -> None:
        get_run_logger().warning(
            "a shard ran past its deadline on Dask worker %s: restarting that worker, its "
            "shards go back to the queue",
            address,
        )
        self.restarted_workers.append(address)
        try:
            client.restart_workers([address], timeout=20)
            return
        except Exception:  # no nanny, or it did not answer in time: remove the worker instead
            pass
        try:
            client.run_on_scheduler(_remove_worker, address=address)
        except Exception as error:
            raise ShardDeadlineError(
                f"a shard ran past its deadline on Dask worker {address}, which could be "
                f"neither restarted nor removed ({error}); stop that worker and rerun with "
                "--resume"
            ) from error


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


# -- the flow -----------------------------------------------------------------------------------


def committed_trajectories(
    store: TrajectoryStore,
    run_id: str,
    iteration: int,
    outcomes: list[ShardOutcome],
    *,
    include_quarantined: bool = False,
) -> list[Trajectory]:
    """The iteration's trajectories the store holds as committed (and, by default, not
    quarantined): the trainer's input, so it never trains on anything twice or on data a gate
    rejected."""
    committed = set(
        store.read_episodes(
            run_id, iteration, columns=["episode_id"], include_quarantined=include_quarantined
        )
        .column(0)
        .to_pylist()
    )
    seen: set[str] = set()
    kept = []
    for outcome in outcomes:
        for trajectory in outcome.trajectories:
            if trajectory.episode_id in committed and trajectory.episode_id not in seen:
                seen.add(trajectory.episode_id)
                kept.append(trajectory)
    return kept


@dataclasses.dataclass
class _Submitted:
    requests: list[ShardRequest]
    futures: list[Any]
    policy_updates: int
    """The trainer's update count when these rollouts were planned (their policy)."""
    started: float


@flow(name="train", log_prints=False)
def train(settings: TrainSettings) -> list[IterationSummary]:
    # The store's Prefect slot (`flows.limits`), then its writer lease (`storage.lease`: one
    # writer per store). The lease is held already when `run_training` started the flow (then
    # this nests); it is taken here for a flow started any other way (a deployment).
    with (
        training_run_slot(
            settings.store,
            settings.max_concurrent_runs_per_store,
            on_wait=lambda name: get_run_logger().info(
                "waiting for a training slot of this store (Prefect limit %s)", name
            ),
        ),
        writer_lease(settings.store, run_id=settings.run_id),
    ):
        return _train_iterations(settings)


def _train_iterations(settings: TrainSettings) -> list[IterationSummary]:
    from prefect.runtime import flow_run

    logger = get_run_logger()
    if flow_run.id:
        _report("flow_run", id=flow_run.id)
    # Before any episode and any write: the spec, a trainer for it, a server that answers.
    policy = check_training_policy(settings.policy, trainer_model=settings.trainer_model)
    store = TrajectoryStore(settings.store)
    task_dirs = task_dirs_in(Path(settings.tasks_dir))
    trainer, first_iteration = restore_trainer(
        store,
        settings.run_id,
        seed=settings.seed,
        resume=settings.resume,
        policy=policy,
        lm_config=settings.lm_trainer,
        trainer_model=settings.trainer_model,
        sampling=settings.sampling,
    )
    if first_iteration:
        logger.info("resuming run %s at iteration %d", settings.run_id, first_iteration)
    recovery = RecoveryPolicy(settings.max_attempts, settings.recovery_mode)  # type: ignore[arg-type]
    if settings.mode == "streaming":
        streamed = train_streaming(settings, store, trainer, task_dirs, first_iteration, recovery)
        _publish_run_table(settings, streamed)
        return streamed
    in_flight: dict[int, _Submitted] = {}
    shard_episodes: dict[Any, int] = {}
    watch = HungShardWatch(
        lambda future: (
            shard_episodes[future] * settings.episode_deadline_s + SHARD_START_ALLOWANCE_S
        )
    )

    def submit(iteration: int, policy_lag: int) -> None:
        predicted = (
            predict_episode_seconds(store, task_dirs)
            if settings.schedule == "longest_first"
            else None
        )
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
            recovery=recovery,
            faults=settings.faults,
            schedule=settings.schedule,
            predicted_s=predicted,
            policy_lag=policy_lag,
            max_concurrent_requests=settings.max_concurrent_requests,
        )
        futures = [rollout_shard.submit(request, settings.store) for request in requests]
        shard_episodes.update(
            (future, len(request.episodes))
            for future, request in zip(futures, requests, strict=True)
        )
        in_flight[iteration] = _Submitted(requests, futures, trainer.updates, time.monotonic())
        _report(
            "iteration_start", iteration=iteration, episodes=sum(len(r.episodes) for r in requests)
        )

    summaries: list[IterationSummary] = []
    for iteration in range(first_iteration, settings.iterations):
        # Keep the pipeline full: in async mode the next iterations roll out with the current
        # policy while this one is being trained on.
        for ahead in range(
            iteration, min(settings.iterations, iteration + settings.pipeline_depth + 1)
        ):
            if ahead not in in_flight:
                submit(ahead, policy_lag=ahead - iteration)
        submitted = in_flight.pop(iteration)
        outcomes: list[ShardOutcome] = []
        for future in completed_while_workers_remain(
            submitted.futures, no_worker_timeout_s=settings.no_worker_timeout_s, watch=watch
        ):
            outcome = future.result()
            shard_episodes.pop(future, None)
            outcomes.append(outcome)
            _report(
                "shard_done",
                iteration=iteration,
                episodes=len(outcome.trajectories),
                rewards=[t.reward for t in outcome.trajectories],
                queued_shards=len(submitted.futures)
                - len(outcomes)
                + sum(len(later.futures) for later in in_flight.values()),
            )
        summary = _consume(store, trainer, settings, iteration, outcomes, submitted, logger)
        publish_iteration_artifacts(store, settings.run_id, iteration)
        summaries.append(summary)
        _report("iteration_done", summary=summary)
    _publish_run_table(settings, summaries)
    return summaries


def _publish_run_table(settings: TrainSettings, summaries: list[IterationSummary]) -> None:
    if summaries:
        create_table_artifact(
            key=re.sub(r"[^a-z0-9-]+", "-", f"train-{settings.run_id}".lower()),
            table=[dataclasses.asdict(s) for s in summaries],
            description=f"Iterations of run {settings.run_id}",
        )


def _consume(
    store: TrajectoryStore,
    trainer: Trainer,
    settings: TrainSettings,
    iteration: int,
    outcomes: list[ShardOutcome],
    submitted: _Submitted,
    logger: Any,
) -> IterationSummary:
    """Gate one iteration's committed batch, train on it unless quarantined, checkpoint."""
    expected = sum(len(r.episodes) for r in submitted.requests)
    gate_settings = GateSettings.from_env(on_failure=settings.gate_on_failure)
    report = gate_iteration(store, settings.run_id, iteration, gate_settings, expected)
    if report.quarantined:
        logger.warning("iteration %d quarantined by its quality gate: %s", iteration, report.reason)
        create_table_artifact(
            key=re.sub(r"[^a-z0-9-]+", "-", f"gate-{settings.run_id}-{iteration}".lower()),
            table=report.table_rows(),
            description=f"Quality gate of iteration {iteration}: {report.reason}",
        )
        if report.should_stop:
            raise GateStoppedRun(
                f"iteration {iteration} failed its quality gate and gate_on_failure=stop: "
                f"{report.reason}"
            )
    batch = committed_trajectories(
        store, settings.run_id, iteration, outcomes, include_quarantined=True
    )
    # Read after the gate: a quarantined iteration yields nothing to train on.
    trajectories = committed_trajectories(store, settings.run_id, iteration, outcomes)
    policy_lag = trainer.updates - submitted.policy_updates
    stale_dropped = 0
    if policy_lag > max(settings.pipeline_depth, 0):
        # Only reachable when resuming into a pipeline planned with an older policy.
        stale_dropped, trajectories = len(trajectories), []
    summary = finish_iteration(
        store,
        trainer,
        run_id=settings.run_id,
        iteration=iteration,
        batch=batch,
        trainable=trajectories,
        quarantined=report.quarantined,
        gate_reason=report.reason,
        wall_s=time.monotonic() - submitted.started,
        update=functools.partial(run_update, stand_in_s=settings.update_stand_in_s),
        policy_lag=policy_lag,
        stale_dropped=stale_dropped,
    )
    logger.info(
        "iteration %d: %d episodes, mean reward %.3f, pass rate %.2f, %d infra errors, "
        "policy lag %d, %.1f s",
        iteration,
        summary.episodes,
        summary.reward_mean,
        summary.pass_rate,
        summary.infra_errors,
        policy_lag,
        summary.wall_s,
    )
    return summary


WORKER_DEATHS_PER_SHARD = 8


def run_training(
    settings: TrainSettings, *, workers: int = 2, dask_address: str | None = None
) -> list[IterationSummary]:
    """Run the flow on embedded defaults: a local Prefect API unless `PREFECT_API_URL` is set,
    and a Dask LocalCluster of `workers` processes unless `dask_address` names a scheduler."""
    import dask

    from flows.runtime import dask_task_runner, local_cluster, prefect_api, prefect_home_for

    # A shard is rescheduled when its worker dies; Dask gives up after `allowed-failures` deaths
    # of the same task (default 3). Shards are idempotent, so allow more before failing a run.
    dask.config.set({"distributed.scheduler.allowed-failures": WORKER_DEATHS_PER_SHARD})
    preflight(settings)
    # The lease comes before the Prefect server: its database lives under the store, and two
    # servers must not initialise it at once. The cluster comes after it: its worker processes
    # inherit the server's URL.
    with (
        writer_lease(settings.store, run_id=settings.run_id),
        prefect_api(prefect_home_for(settings.store)) as api_url,
        local_cluster(workers, dask_address) as cluster,
    ):
        _report("prefect_ui", url=api_url.removesuffix("/api"))
        if cluster.dashboard_link:
            _report("dask_dashboard", url=cluster.dashboard_link)
        runner = dask_task_runner(workers, cluster.scheduler_address)
        return train.with_options(task_runner=runner)(settings)


# -- the streaming mode ------------------------------------------------------------------
#
# The train flow's streaming mode: groups roll out on Dask continuously, each finished group
# enters the experience buffer at once, and the trainer takes a batch as soon as one is full.
#
# One slow episode holds only its own group, never a step. The rollout side keeps at most
# `(max_policy_lag + 1) * tasks_per_iteration` groups outstanding (running or buffered), planned
# in waves with the policy of the moment, so a group planned now is trained on at most
# `max_policy_lag` updates later unless it straggles; stragglers past the bound are dropped by the
# buffer's rule (`training.streaming`), committed once and counted. Each step is one store
# iteration: committed in one exactly-once shard, gated, trained on through `trainer.update`,
# checkpointed and marked done like a synchronous iteration, so resume, the quality gate and
# every reader work unchanged. The trainer is reached only through `training.iteration`'s
# `finish_iteration` and the `update` callable: any `training.trainer.Trainer` (its `policy`,
# `updates` and `update(batch)`) streams.

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
        lambda _future: settings.group_size * settings.episode_deadline_s + SHARD_START_ALLOWANCE_S
    )
    summaries: list[IterationSummary] = []
    step = first_step
    if step < settings.iterations and store.is_committed(run_id, step, STREAM_SHARD):
        summaries.append(_close_interrupted_step(store, trainer, settings, step))
        _report("iteration_done", summary=summaries[-1])
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
            _report(
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
                idle_since = _check_workers(idle_since, settings, len(outstanding.futures))
            continue
        idle_since = None
        for future in done:
            group: CompletedGroup = future.result()
            buffer.add(group)
            _report(
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
            _report("iteration_done", summary=summary)
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


def _check_workers(idle_since: float | None, settings: TrainSettings, pending: int) -> float | None:
    """The no-worker clock of `flows.train.completed_while_workers_remain`, for a pending set
    that grows while the flow waits."""
    if dask_worker_count() != 0:
        return None
    now = time.monotonic()
    idle_since = idle_since if idle_since is not None else now
    if now - idle_since >= settings.no_worker_timeout_s:
        raise NoWorkersError(
            f"the Dask cluster has had no worker for {now - idle_since:.0f} s with {pending} "
            "group(s) still queued; start workers (or check why they died: memory, the "
            "machine) and rerun with --resume"
        )
    return idle_since


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


def preflight(settings: TrainSettings) -> None:
    """What refuses a run before anything is written or started: a tasks directory without
    tasks, and, to resume, a store the cheap store check finds damaged."""
    task_dirs_in(Path(settings.tasks_dir))
    if settings.resume:
        check_before_use(settings.store)
