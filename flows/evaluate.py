"""The evaluation flows.

`evaluate_policy` (`rollyard evaluate --policy SPEC`): roll any policy out on a directory of
tasks, K samples each, as a run of its own — shards of episodes on Dask, each committed once to
the store, the iteration gated — then compute pass@k per task, per family and overall from the
store and record it there. The policy spec is checked before anything runs or is written; a
finished evaluation run again writes nothing and reports what the store holds.

`evaluate`: evaluate the newest checkpoints of a run (or of every run) that have no evaluation
yet on held-out tasks, record each summary in the store's metrics and publish them as a table
artifact. Scheduled by `rollyard serve`; a run with nothing new to evaluate does nothing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_table_artifact
from prefect.cache_policies import NO_CACHE

from flows.errors import FlowSettingsError
from flows.shard_watch import completed_while_workers_remain
from flows.stores import check_store_before_use
from flows.train_tasks import gate_iteration, rollout_shard
from rollyard.status import is_trainable
from storage import CheckpointInfo, StoreError, TrajectoryStore
from storage.gates import GateSettings
from storage.lease import writer_lease
from training.episode import EpisodeConfig
from training.evaluation import (
    PASS_AT_K_SOURCE,
    EvaluationResult,
    PassAtK,
    checkpoints_to_evaluate,
    default_ks,
    evaluate_checkpoint,
    pass_at_k_from_store,
    record_pass_at_k,
)
from training.iteration import task_dirs_in
from training.lm.conversation import ChatSampling
from training.lm.spec import parse_policy_spec, policy_from_spec
from training.policy import Policy
from training.recovery import RecoveryPolicy
from training.rollout import plan_iteration


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
    # A writer like `train`: the store's lease for the whole flow (nested when the caller
    # holds it already, see `run_evaluation`), damage refused first.
    check_store_before_use(params.store)
    with writer_lease(params.store, run_id=params.run_id or "-", purpose="evaluate"):
        return _evaluate_checkpoints(params)


def _evaluate_checkpoints(params: EvaluateParams) -> list[dict[str, Any]]:
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

    # The lease before the Prefect server, whose database lives under the store (as for train).
    check_store_before_use(params.store)
    with (
        writer_lease(params.store, run_id=params.run_id or "-", purpose="evaluate"),
        prefect_api(prefect_home_for(params.store)),
    ):
        return evaluate(params)


# -- a policy on a set of tasks -----------------------------------------------------------------

EVALUATION_ITERATION = 0
"""An evaluation run is one iteration: every task, `samples` times."""


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyEvaluationSettings:
    """Parameters of one policy evaluation (`rollyard evaluate`, the deployments, Python)."""

    tasks_dir: str
    """Directory of task directories; every task is rolled out `samples` times."""
    store: str
    """Store root: the episodes, the gate's verdict and pass@k are written there."""
    policy: str = "builtin"
    """The policy spec: `builtin`, `openai:BASE_URL#MODEL` or `hf:DIR` (`training.lm.spec`)."""
    samples: int = 4
    """K: samples per task (one GRPO-style group per task); pass@k is reported for k up to K."""
    run_id: str | None = None
    """The evaluation's run id; None derives one from what is evaluated (`evaluation_run_id`),
    so evaluating the same policy the same way again finds the finished run."""
    sampling: ChatSampling = dataclasses.field(default_factory=ChatSampling)
    """How a chat policy samples each turn (recorded with every episode)."""
    max_steps: int = 8
    seed: int = 0
    shards: int = 4
    """Prefect tasks (episode shards); each runs on one Dask worker."""
    max_concurrent_requests: int = 1
    """Episodes a shard keeps in flight at once, so a model server batches their requests."""
    max_attempts: int = 3
    """Attempts per episode after infra failures."""
    no_worker_timeout_s: float = 120.0

    def __post_init__(self) -> None:
        parse_policy_spec(self.policy)
        for name in ("samples", "max_steps", "shards", "max_concurrent_requests", "max_attempts"):
            if getattr(self, name) < 1:
                raise FlowSettingsError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not self.no_worker_timeout_s > 0:
            raise FlowSettingsError(
                f"no_worker_timeout_s must be positive, got {self.no_worker_timeout_s}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyEvaluation:
    """What an evaluation found, read from the store."""

    run_id: str
    acted: tuple[dict[str, Any], ...]
    """What acted, one row per (policy kind, model, version, sampling) in the run's episodes."""
    episodes: int
    infra_errors: int
    pass_at_k: tuple[PassAtK, ...]
    quarantined: bool
    gate_reason: str | None
    rolled_out: bool
    """False when the store already held the finished evaluation (nothing was run)."""
    wall_s: float


def evaluation_run_id(settings: PolicyEvaluationSettings, policy: Policy) -> str:
    """`eval-<kind>-<model>-<digest>`: the digest covers the policy's version (an `hf:` model's
    weights digest), the tasks, K, the sampling, the step budget and the seed."""
    identity = policy.identity()
    what = "\x1f".join(
        (
            identity.version,
            str(Path(settings.tasks_dir).resolve()),
            str(settings.samples),
            identity.sampling or "",
            str(settings.max_steps),
            str(settings.seed),
        )
    )
    name = re.sub(r"[^A-Za-z0-9.-]+", "-", identity.model or identity.kind).strip("-")[:40]
    return f"eval-{identity.kind}-{name}-{hashlib.sha256(what.encode()).hexdigest()[:10]}"


def _evaluation_finished(store: TrajectoryStore, run_id: str) -> bool:
    try:
        rows = store.query(
            "SELECT count(*) AS n FROM metrics WHERE run_id = ? AND source = ?",
            [run_id, PASS_AT_K_SOURCE],
        ).to_pylist()
    except StoreError:
        return False  # a new store
    return bool(rows and rows[0]["n"])


def read_policy_evaluation(
    store: TrajectoryStore, run_id: str, samples: int, *, rolled_out: bool, wall_s: float
) -> PolicyEvaluation:
    """The evaluation of `run_id` as the store holds it."""
    acted = store.query(
        "SELECT policy_kind, policy_model, policy_version, sampling, count(*) AS episodes "
        "FROM episodes WHERE run_id = ? GROUP BY ALL ORDER BY episodes DESC",
        [run_id],
    )
    statuses = store.read_episodes(run_id, include_quarantined=True, columns=["status"])
    verdicts = store.query(
        "SELECT quarantined, reason FROM iteration_status WHERE run_id = ? AND iteration = ?",
        [run_id, EVALUATION_ITERATION],
    ).to_pylist()
    quarantined = bool(verdicts and verdicts[0]["quarantined"])
    gate_reason = str(verdicts[0]["reason"]) if quarantined else None
    episodes = statuses.num_rows
    infra_errors = sum(1 for s in statuses.column(0).to_pylist() if not is_trainable(s))
    return PolicyEvaluation(
        run_id=run_id,
        acted=tuple(acted.to_pylist()),
        episodes=episodes,
        infra_errors=infra_errors,
        pass_at_k=tuple(
            pass_at_k_from_store(store, run_id, EVALUATION_ITERATION, ks=default_ks(samples))
        ),
        quarantined=quarantined,
        gate_reason=gate_reason,
        rolled_out=rolled_out,
        wall_s=wall_s,
    )


@flow(name="evaluate-policy", log_prints=False)
def evaluate_policy(settings: PolicyEvaluationSettings) -> PolicyEvaluation:
    check_store_before_use(settings.store)
    with writer_lease(settings.store, run_id=settings.run_id or "-", purpose="evaluate"):
        return _evaluate_policy(settings)


def _evaluate_policy(settings: PolicyEvaluationSettings) -> PolicyEvaluation:
    logger = get_run_logger()
    started = time.monotonic()
    # Before any episode and any write: the spec parses, the server answers with the model and
    # calls tools (or the model directory holds a chat model).
    policy = policy_from_spec(settings.policy, sampling=settings.sampling, check=True)
    task_dirs = task_dirs_in(settings.tasks_dir)
    store = TrajectoryStore(settings.store)
    run_id = settings.run_id or evaluation_run_id(settings, policy)
    if _evaluation_finished(store, run_id):
        logger.info("evaluation %s is already in %s; reporting it", run_id, settings.store)
        return read_policy_evaluation(
            store, run_id, settings.samples, rolled_out=False, wall_s=time.monotonic() - started
        )
    # Round robin: the same shards on every attempt, so shards an interrupted evaluation
    # committed are skipped, not run again.
    requests = plan_iteration(
        task_dirs,
        run_id=run_id,
        iteration=EVALUATION_ITERATION,
        policy=policy,
        tasks_per_iteration=len(task_dirs),
        group_size=settings.samples,
        shard_count=settings.shards,
        seed=settings.seed,
        episode_config=EpisodeConfig(max_steps=settings.max_steps, seed=settings.seed),
        recovery=RecoveryPolicy(settings.max_attempts),
        schedule="round_robin",
        max_concurrent_requests=settings.max_concurrent_requests,
    )
    policy.close()
    committed = set(store.committed_shards(run_id, EVALUATION_ITERATION))
    pending = [r for r in requests if r.shard not in committed]
    logger.info(
        "evaluating %s on %d tasks x %d samples as run %s (%d of %d shards to run)",
        settings.policy,
        len(task_dirs),
        settings.samples,
        run_id,
        len(pending),
        len(requests),
    )
    futures = [rollout_shard.submit(request, settings.store) for request in pending]
    for future in completed_while_workers_remain(
        futures, no_worker_timeout_s=settings.no_worker_timeout_s
    ):
        future.result()
    expected = sum(len(r.episodes) for r in requests)
    report = gate_iteration(store, run_id, EVALUATION_ITERATION, GateSettings.from_env(), expected)
    if report.quarantined:
        logger.warning("the evaluation's quality gate failed: %s", report.reason)
    results = pass_at_k_from_store(
        store, run_id, EVALUATION_ITERATION, ks=default_ks(settings.samples)
    )
    record_pass_at_k(store, run_id, EVALUATION_ITERATION, results)
    create_table_artifact(
        key=re.sub(r"[^a-z0-9-]+", "-", f"pass-at-k-{run_id}".lower()),
        table=[dataclasses.asdict(r) for r in results],
        description=f"pass@k of {settings.policy} on {len(task_dirs)} tasks from "
        f"{settings.tasks_dir} ({settings.samples} samples each)",
    )
    return read_policy_evaluation(
        store, run_id, settings.samples, rolled_out=True, wall_s=time.monotonic() - started
    )


def run_policy_evaluation(
    settings: PolicyEvaluationSettings, *, workers: int = 2, dask_address: str | None = None
) -> PolicyEvaluation:
    """Run `evaluate_policy` on embedded defaults: a local Prefect API unless `PREFECT_API_URL`
    is set, and a Dask LocalCluster of `workers` processes unless `dask_address` names one."""
    from flows.runtime import dask_task_runner, prefect_api, prefect_home_for

    runner = dask_task_runner(workers, dask_address)
    check_store_before_use(settings.store)
    with (
        writer_lease(settings.store, run_id=settings.run_id or "-", purpose="evaluate"),
        prefect_api(prefect_home_for(settings.store)),
    ):
        return evaluate_policy.with_options(task_runner=runner)(settings)
