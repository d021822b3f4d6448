"""The deployments `rollyard serve` runs on a schedule: nightly curation of the task library,
periodic evaluation of new checkpoints on held-out tasks, and training (which resumes its run, so
a scheduled run continues an interrupted one and does nothing once the run is complete). Training
takes the policy spec of `ServeSettings.policy`; `evaluate_policy_on_dask` evaluates any policy
spec on a work pool (`infra/prefect.yaml`).

Served deployments run in the serving process's machine; for a Prefect server with work pools
and a remote Dask cluster, see `infra/prefect.yaml`.
"""

from __future__ import annotations

import dataclasses
import datetime
from typing import Any, cast

from prefect import flow, get_run_logger
from prefect.deployments.runner import RunnerDeployment

from flows.curate import CurateParams, curate, task_dirs_from
from flows.errors import FlowSettingsError
from flows.evaluate import (
    EvaluateParams,
    PolicyEvaluation,
    PolicyEvaluationSettings,
    evaluate,
    evaluate_policy,
)
from flows.runtime import dask_task_runner
from flows.train import train
from flows.train_settings import TrainSettings
from training.iteration import IterationSummary

CURATE_DEPLOYMENT = "nightly-curation"
EVALUATE_DEPLOYMENT = "evaluate-checkpoints"
TRAIN_DEPLOYMENT = "training"


@dataclasses.dataclass(frozen=True, slots=True)
class ServeSettings:
    """What `rollyard serve` serves, and when."""

    store: str
    tasks_dir: str
    """The task library: curated nightly, trained on."""
    eval_tasks_dir: str | None = None
    """Held-out tasks: checkpoints are evaluated on them, curation checks the library against
    them for contamination. None: no evaluation deployment."""
    run_id: str = "run-0"
    """The training run the training deployment continues and evaluation follows."""
    policy: str = "builtin"
    """The policy spec the training deployment trains (`training.lm.spec`)."""
    max_concurrent_requests: int = 1
    """Episodes each training shard keeps in flight against a model server."""
    curate_cron: str = "0 2 * * *"
    evaluate_interval_s: float = 900.0
    train_cron: str = "0 3 * * *"
    timezone: str = "UTC"
    """Time zone of the cron schedules."""
    train_iterations: int = 6
    workers: int = 2
    """Dask worker processes of the LocalCluster each curation or training run starts."""
    dask_address: str | None = None
    """A running Dask scheduler to use instead of a LocalCluster per run."""
    paused: bool = False
    """Register the schedules paused (runs are only started by hand or through the API)."""

    def __post_init__(self) -> None:
        if self.evaluate_interval_s <= 0:
            raise FlowSettingsError(
                f"evaluate_interval_s must be > 0, got {self.evaluate_interval_s}"
            )


@flow(name="curate-library", log_prints=False)
def curate_library(
    tasks_dir: str,
    store: str,
    eval_tasks_dir: str | None = None,
    workers: int = 2,
    dask_address: str | None = None,
) -> list[dict[str, Any]]:
    """Curate every task now in `tasks_dir` (the library grows between runs) as one batch."""
    task_dirs = task_dirs_from([tasks_dir])
    get_run_logger().info("curating %d tasks from %s", len(task_dirs), tasks_dir)
    params = CurateParams(
        task_dirs=tuple(task_dirs),
        store=store,
        eval_dirs=(eval_tasks_dir,) if eval_tasks_dir else (),
    )
    return curate.with_options(task_runner=dask_task_runner(workers, dask_address))(params)


@flow(name="train-on-dask", log_prints=False)
def train_on_dask(
    settings: TrainSettings, workers: int = 2, dask_address: str | None = None
) -> list[IterationSummary]:
    """The train flow on a Dask task runner, for work-pool deployments (`infra/prefect.yaml`):
    a worker loads a flow from its entrypoint, so the runner is chosen inside the flow here."""
    return train.with_options(task_runner=dask_task_runner(workers, dask_address))(settings)


@flow(name="evaluate-policy-on-dask", log_prints=False)
def evaluate_policy_on_dask(
    settings: PolicyEvaluationSettings, workers: int = 2, dask_address: str | None = None
) -> PolicyEvaluation:
    """The evaluate-policy flow on a Dask task runner, for work-pool deployments."""
    runner = dask_task_runner(workers, dask_address)
    return evaluate_policy.with_options(task_runner=runner)(settings)


def build_deployments(settings: ServeSettings) -> list[RunnerDeployment]:
    """The deployments with their schedules and parameters."""
    from prefect.schedules import Cron, Interval

    common: dict[str, Any] = {"paused": settings.paused}
    deployments = [
        curate_library.to_deployment(
            name=CURATE_DEPLOYMENT,
            schedule=Cron(settings.curate_cron, timezone=settings.timezone),
            parameters={
                "tasks_dir": settings.tasks_dir,
                "store": settings.store,
                "eval_tasks_dir": settings.eval_tasks_dir,
                "workers": settings.workers,
                "dask_address": settings.dask_address,
            },
            description="Curate the task library (verify, flake-check, dedup, decontaminate).",
            tags=["rollyard", "curation"],
            **common,
        ),
        train.with_options(
            task_runner=dask_task_runner(settings.workers, settings.dask_address)
        ).to_deployment(
            name=TRAIN_DEPLOYMENT,
            schedule=Cron(settings.train_cron, timezone=settings.timezone),
            parameters={
                "settings": dataclasses.asdict(
                    TrainSettings(
                        tasks_dir=settings.tasks_dir,
                        store=settings.store,
                        run_id=settings.run_id,
                        policy=settings.policy,
                        max_concurrent_requests=settings.max_concurrent_requests,
                        iterations=settings.train_iterations,
                        resume=True,
                    )
                )
            },
            description=f"Train (resuming) run {settings.run_id} to "
            f"{settings.train_iterations} iterations.",
            tags=["rollyard", "training"],
            **common,
        ),
    ]
    if settings.eval_tasks_dir:
        deployments.append(
            evaluate.to_deployment(
                name=EVALUATE_DEPLOYMENT,
                schedule=Interval(
                    datetime.timedelta(seconds=settings.evaluate_interval_s),
                    timezone=settings.timezone,
                ),
                parameters={
                    "params": dataclasses.asdict(
                        EvaluateParams(
                            store=settings.store,
                            tasks_dir=settings.eval_tasks_dir,
                            run_id=settings.run_id,
                        )
                    )
                },
                description="Evaluate new checkpoints on the held-out tasks.",
                tags=["rollyard", "evaluation"],
                **common,
            )
        )
    # sync calls: Prefect's async-or-sync signature says both
    return cast(list[RunnerDeployment], deployments)


def serve(settings: ServeSettings, *, limit: int | None = 1) -> None:
    """Serve the deployments until SIGTERM or Ctrl-C, against `PREFECT_API_URL` or a local
    Prefect server started (and stopped) for the purpose. `limit`: concurrent flow runs (one
    by default: curation and training each fill the machine's cores)."""
    from prefect import serve as prefect_serve

    from flows.runtime import prefect_api, prefect_home_for

    with prefect_api(prefect_home_for(settings.store)):
        prefect_serve(*build_deployments(settings), limit=limit)
