"""The `audit` flow: replay and re-verify the top-reward trajectories of each iteration of a run,
review their diffs, record the verdicts (suite `audit` in the gates table) and publish a table."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from storage import TrajectoryStore
from training.audit import AuditFinding, audit_iteration, task_index


@dataclasses.dataclass(frozen=True, slots=True)
class AuditParams:
    store: str
    tasks_dir: str
    run_id: str
    iterations: tuple[int, ...] = ()
    """Iterations to audit; empty: every iteration of the run."""
    top_k: int = 5


@task(name="audit_iteration", cache_policy=NO_CACHE)
def audit_one_iteration(params: AuditParams, iteration: int) -> list[AuditFinding]:
    store = TrajectoryStore(params.store)
    return audit_iteration(
        store,
        Path(params.tasks_dir),
        params.run_id,
        iteration,
        top_k=params.top_k,
        tasks=task_index(Path(params.tasks_dir)),
    )


@flow(name="audit")
def audit(params: AuditParams) -> list[AuditFinding]:
    logger = get_run_logger()
    store = TrajectoryStore(params.store)
    iterations = list(params.iterations) or [
        int(r["iteration"])
        for r in store.query(
            "SELECT DISTINCT iteration FROM episodes WHERE run_id = ? ORDER BY 1",
            [params.run_id],
        ).to_pylist()
    ]
    futures = [audit_one_iteration.submit(params, i) for i in iterations]
    findings = [f for future in futures for f in future.result()]
    not_confirmed = [f for f in findings if f.verdict != "confirmed"]
    logger.info(
        "audited %d episodes of %d iterations: %d not confirmed",
        len(findings),
        len(iterations),
        len(not_confirmed),
    )
    if findings:
        create_table_artifact(
            key=re.sub(r"[^a-z0-9-]+", "-", f"audit-{params.run_id}".lower()),
            table=[f.as_row() for f in findings],
            description=f"Audit of run {params.run_id}: {len(not_confirmed)} of "
            f"{len(findings)} top-reward episodes not confirmed",
        )
    return findings
