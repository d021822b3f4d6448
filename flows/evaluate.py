"""The `evaluate` flow: evaluate the newest checkpoints of a run (or of every run) that have no
evaluation yet on held-out tasks, record each summary in the store's metrics and publish them as
a table artifact. Scheduled by `rollyard serve`; a run with nothing new to evaluate does nothing.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from storage import CheckpointInfo, TrajectoryStore
from training.evaluation import EvaluationResult, checkpoints_to_evaluate, evaluate_checkpoint
from training.iteration import task_dirs_in


@dataclasses.dataclass(frozen=True, slots=True)
class EvaluateParams:
    """Parameters of one evaluation (the CLI and deployments fill these)."""

    store: str
    """Store root holding the checkpoints; the summaries are written there too."""
    tasks_dir: str
    """Directory of held-out task directories (never trained on)."""
    run_id: str | None = None
    """Evaluate this run's checkpoints; None: every run in the store."""
    latest: int = 1
    """Per run, how many of the newest checkpoints to consider."""
    samples_per_task: int = 2
    max_steps: int = 8
    seed: int = 0


# -- tasks: each one library call ---------------------------------------------------------------


@task(name="evaluate_checkpoint", cache_policy=NO_CACHE)
def evaluate_one(
    store: TrajectoryStore,
    checkpoint: CheckpointInfo,
    task_dirs: list[Path],
    params: EvaluateParams,
) -> EvaluationResult:
    return evaluate_checkpoint(
        store,
        checkpoint,
        task_dirs,
        samples_per_task=params.samples_per_task,
        max_steps=params.max_steps,
        seed=params.seed,
    )


# -- the flow -----------------------------------------------------------------------------------


@flow(name="evaluate", log_prints=False)
def evaluate(params: EvaluateParams) -> list[dict[str, Any]]:
    logger = get_run_logger()
    store = TrajectoryStore(params.store)
    pending = checkpoints_to_evaluate(store, run_id=params.run_id, latest=params.latest)
    if not pending:
        logger.info("no new checkpoints to evaluate in %s", params.store)
        return []
    task_dirs = task_dirs_in(params.tasks_dir)
    logger.info(
        "evaluating %d checkpoint(s) on %d held-out tasks x %d samples",
        len(pending),
        len(task_dirs),
        params.samples_per_task,
    )
    results = [evaluate_one(store, c, task_dirs, params) for c in pending]
    for r in results:
        logger.info(
            "run %s iteration %d (%s): mean reward %s, pass rate %s, %d infra errors",
            r.run_id,
            r.iteration,
            r.policy_version,
            "n/a" if r.reward_mean is None else f"{r.reward_mean:.3f}",
            "n/a" if r.pass_rate is None else f"{r.pass_rate:.2f}",
            r.infra_errors,
        )
    rows = [dataclasses.asdict(r) for r in results]
    create_table_artifact(
        key=re.sub(r"[^a-z0-9-]+", "-", f"evaluation-{params.run_id or 'all-runs'}".lower()),
        table=rows,
        description=f"Held-out evaluation on {len(task_dirs)} tasks from {params.tasks_dir}",
    )
    return rows


def run_evaluation(params: EvaluateParams) -> list[dict[str, Any]]:
    """Run the flow on embedded defaults (a local Prefect API unless `PREFECT_API_URL` is set)."""
    from flows.runtime import prefect_api, prefect_home_for

    with prefect_api(prefect_home_for(params.store)):
        return evaluate(params)
