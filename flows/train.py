"""The `train` flow: sample tasks, roll out on Dask, commit, gate, update the policy, checkpoint.

Each iteration reads top to bottom as library calls wrapped in Prefect tasks. A Prefect task is
a shard of episodes (Prefect costs 160-270 ms per task under the Dask runner here, so episodes
are never one task each). Exactly-once lives in the store, not in Prefect's result cache: shards
commit under (run, iteration, shard), and the trainer consumes only what the store says is
committed and not quarantined by the iteration's quality gate. In async mode the next
iterations roll out while the trainer updates, within a policy-lag bound; in streaming mode
(`flows.streaming`) finished groups feed the trainer as they come. Resume starts after
the last iteration whose completion marker (a metrics row written last) is in the store.
"""

import dataclasses
import functools
import re
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from flows.artifacts import publish_iteration_artifacts
from flows.errors import GateStoppedRun
from flows.limits import training_run_slot
from flows.progress import report_progress
from flows.shard_watch import HungShardWatch, completed_while_workers_remain, shard_deadline_s
from flows.streaming import train_streaming
from flows.train_settings import TrainSettings
from flows.train_tasks import gate_iteration, rollout_shard, run_update
from storage import TrajectoryStore
from storage.fsck import check_before_use
from storage.gates import GateSettings
from storage.lease import writer_lease
from training.episode import EpisodeConfig
from training.iteration import (
    IterationSummary,
    check_training_policy,
    finish_iteration,
    restore_trainer,
    task_dirs_in,
)
from training.recovery import RecoveryPolicy
from training.rollout import ShardOutcome, ShardRequest, plan_iteration, predict_episode_seconds
from training.trainer import Trainer
from training.trajectory import Trajectory

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
        report_progress("flow_run", id=flow_run.id)
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
        lambda future: shard_deadline_s(shard_episodes[future], settings.episode_deadline_s)
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
        report_progress(
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
            report_progress(
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
        report_progress("iteration_done", summary=summary)
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
    gate_started = time.monotonic()
    report = gate_iteration(store, settings.run_id, iteration, gate_settings, expected)
    gate_s = time.monotonic() - gate_started
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
        extra_metrics={"gate_s": gate_s},
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

    from flows.run_services import run_services_refused
    from flows.runtime import dask_task_runner, local_cluster, prefect_api, prefect_home_for

    # A shard is rescheduled when its worker dies; Dask gives up after `allowed-failures` deaths
    # of the same task (default 3). Shards are idempotent, so allow more before failing a run.
    dask.config.set({"distributed.scheduler.allowed-failures": WORKER_DEATHS_PER_SHARD})
    preflight(settings)
    # The lease comes before the Prefect server: its database lives under the store, and two
    # servers must not initialise it at once. The cluster comes after it: its worker processes
    # inherit the server's URL. No sandbox of the run reaches the run's own Prefect API or Dask
    # scheduler and dashboard, whatever a task's allowlist names (`flows.run_services`).
    with (
        writer_lease(settings.store, run_id=settings.run_id),
        prefect_api(prefect_home_for(settings.store)) as api_url,
        local_cluster(workers, dask_address) as cluster,
        run_services_refused(api_url, cluster),
    ):
        report_progress("prefect_ui", url=api_url.removesuffix("/api"))
        if cluster.dashboard_link:
            report_progress("dask_dashboard", url=cluster.dashboard_link)
        runner = dask_task_runner(workers, cluster.scheduler_address)
        return train.with_options(task_runner=runner)(settings)


def preflight(settings: TrainSettings) -> None:
    """What refuses a run before anything is written or started: a tasks directory without
    tasks, and, to resume, a store the cheap store check finds damaged."""
    task_dirs_in(Path(settings.tasks_dir))
    if settings.resume:
        check_before_use(settings.store)
