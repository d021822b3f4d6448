"""The `curate` flow: check every task directory (a Dask map of Prefect tasks, one per task:
each runs dozens of sandboxed verifications, so Prefect's per-task cost is noise), decide
duplicates within the batch and against the tasks earlier batches admitted, and contamination
under the run's decontamination policy; record every verdict in the store's `tasks` table and
publish the verdicts as a table artifact.
"""

from __future__ import annotations

import dataclasses
import re
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task, unmapped
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from storage import TrajectoryStore
from storage.reviews import blocked_families, review_gate
from tasks_lib.curate import (
    DEFAULT_POLICY,
    AdmittedTask,
    CurationSettings,
    Sampler,
    TaskChecks,
    check_policy,
    check_task_dir,
    decide,
    earlier_admitted,
    load_eval_set,
    verdict_rows,
)
from tasks_lib.curate.review_gate import apply_review_gate
from tasks_lib.format.finder import find_task_dirs
from tasks_lib.format.model import Task


@dataclasses.dataclass(frozen=True, slots=True)
class CurateParams:
    """Parameters of one curation (the CLI and deployments fill these)."""

    task_dirs: tuple[str, ...]
    store: str
    eval_dirs: tuple[str, ...] = ()
    reruns: int | None = None
    """Fresh-sandbox runs per candidate; None derives it from the flake rate and confidence."""
    random_order_runs: int | None = None
    reference_run_id: str | None = None
    """With `reference_policy_version`: the checkpoint whose pass rate sets each task's
    difficulty bucket (k = `CurationSettings.difficulty_samples` samples)."""
    reference_policy_version: str | None = None
    batch_id: str | None = None
    """The `tasks` table batch; a replay of the same batch id writes nothing twice."""
    decontamination: str = DEFAULT_POLICY
    """Against the evaluation set: `instance` (reject the same task), `repository` (also every
    task of a code base found in it) or `off`; recorded with each verdict."""


class PolicySampler:
    """`Sampler` over a checkpoint of the built-in policy in the store (picklable for Dask)."""

    def __init__(self, store: str, run_id: str, policy_version: str, *, max_steps: int = 8):
        self.store, self.run_id, self.policy_version = store, run_id, policy_version
        self.max_steps = max_steps
        self._policy: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_policy": None}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)

    def __call__(self, task: Task, index: int) -> float | None:
        from sandboxes import open_sandbox
        from training.episode import EpisodeConfig, run_episode
        from training.iteration import load_trainer
        from training.trajectory import EpisodeKey

        if self._policy is None:
            trainer = load_trainer(TrajectoryStore(self.store), self.run_id, self.policy_version)
            self._policy = trainer.policy
        key = EpisodeKey(f"curate-{self.policy_version}", 0, sample_index=index)
        with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
            trajectory = run_episode(
                task, self._policy, sandbox, key=key, config=EpisodeConfig(max_steps=self.max_steps)
            )
        return trajectory.reward if trajectory.trainable else None


# -- tasks: each one library call ---------------------------------------------------------------


@task(name="check_task_dir", retries=1, retry_delay_seconds=1, cache_policy=NO_CACHE)
def check_task(task_dir: str, settings: CurationSettings, sampler: Sampler | None) -> TaskChecks:
    return check_task_dir(task_dir, settings, sampler=sampler)


def read_earlier_admitted(store: TrajectoryStore) -> list[AdmittedTask]:
    """The tasks earlier batches admitted, with their fingerprints, from the `tasks` table."""
    logger = get_run_logger()
    rows = store.query(
        "SELECT task_id, status, reason, batch_id FROM tasks_latest "
        "WHERE status = 'admitted' ORDER BY recorded_at, task_id"
    ).to_pylist()
    admitted, unreadable = earlier_admitted(rows)
    if unreadable:
        logger.warning(
            "%d earlier admitted task(s) carry no fingerprint this version reads (e.g. %s); "
            "curate them again to check new tasks against them",
            len(unreadable),
            unreadable[0],
        )
    return admitted


# -- the flow -----------------------------------------------------------------------------------


@flow(name="curate", log_prints=False)
def curate(params: CurateParams) -> list[dict[str, Any]]:
    logger = get_run_logger()
    check_policy(params.decontamination)  # before any sandbox runs
    settings = CurationSettings.from_env(
        reruns=params.reruns, random_order_runs=params.random_order_runs
    )
    eval_set = load_eval_set(params.eval_dirs, settings) if params.eval_dirs else None
    sampler = None
    if params.reference_run_id and params.reference_policy_version:
        sampler = PolicySampler(
            params.store, params.reference_run_id, params.reference_policy_version
        )
    futures = check_task.map(list(params.task_dirs), unmapped(settings), unmapped(sampler))
    checks = [future.result() for future in futures]
    store = TrajectoryStore(params.store)
    earlier = read_earlier_admitted(store)
    # Human spot checks feed back here: a family whose rewards reviewers often disagree with
    # gets no more tasks admitted until its verifier is fixed.
    blocked = blocked_families(review_gate(store))
    if blocked:
        logger.warning("review gate blocks families: %s", ", ".join(sorted(blocked)))
    decided = decide(
        checks, settings, eval_set, decontamination=params.decontamination, earlier=earlier
    )
    verdicts = apply_review_gate(decided, blocked)
    batch_id = params.batch_id or f"curate-{uuid.uuid4().hex[:12]}"
    store.tasks.record(verdict_rows(verdicts), batch_id=batch_id)
    admitted = sum(v.admitted for v in verdicts)
    logger.info(
        "curation %s: %d of %d tasks admitted (%d runs per candidate, decontamination %s, "
        "%d earlier admitted tasks compared)",
        batch_id,
        admitted,
        len(verdicts),
        settings.runs,
        params.decontamination,
        len(earlier),
    )
    create_table_artifact(
        key=re.sub(r"[^a-z0-9-]+", "-", batch_id.lower()),
        table=[
            {
                "task_id": v.task_id,
                "verdict": v.verdict,
                "reasons": "; ".join(str(r) for r in v.reasons),
            }
            for v in verdicts
        ],
        description=f"Curation {batch_id}: {admitted}/{len(verdicts)} admitted",
    )
    return [{**v.to_json(), "batch_id": batch_id} for v in verdicts]


def run_curation(
    params: CurateParams, *, workers: int = 2, dask_address: str | None = None
) -> list[dict[str, Any]]:
    """Run the flow on embedded defaults (a local Prefect API unless `PREFECT_API_URL` is set,
    a Dask LocalCluster of `workers` processes unless `dask_address` names a scheduler)."""
    from flows.runtime import dask_task_runner, prefect_api, prefect_home_for

    runner = dask_task_runner(workers, dask_address)
    with prefect_api(prefect_home_for(params.store)):
        return curate.with_options(task_runner=runner)(params)


def task_dirs_from(paths: Sequence[str | Path]) -> list[str]:
    """Task directories named by `paths`; a directory of tasks stands for every task in it."""
    return [str(path.absolute()) for path in find_task_dirs(paths)]
