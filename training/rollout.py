"""Rollout batches: plan an iteration's episodes into shards, run a shard, commit it exactly once.

A shard is the unit of distribution and of commit. The flow ships one `ShardRequest` per Dask
task; the worker runs its episodes over warm sandboxes from a per-process pool and commits the
trajectories to the store under (run, iteration, shard), so a retried or rescheduled shard runs
again but writes nothing twice. Works the same from a notebook without Prefect or Dask:

    requests = plan_iteration(task_dirs, run_id="r1", iteration=0, policy=policy, ...)
    outcomes = [rollout_shard_and_commit(r, store_root) for r in requests]
"""

from __future__ import annotations

import atexit
import dataclasses
import functools
import os
import pickle
import random
import socket
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Literal

from sandboxes import Limits, SandboxPool
from storage import CommitResult, StoreError, TrajectoryStore
from tasks_lib.format.loader import load_task
from tasks_lib.format.model import Task
from training.episode import EpisodeConfig
from training.errors import TrainerError, TrainingSettingsError
from training.policy import Policy
from training.recovery import FaultPlan, RecoveryPolicy, run_episode_with_recovery
from training.trajectory import EpisodeKey, Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class EpisodeRequest:
    task_dir: str
    key: EpisodeKey


@dataclasses.dataclass(frozen=True, slots=True)
class ShardRequest:
    """Everything a worker needs to run one shard: picklable, self-contained."""

    run_id: str
    iteration: int
    shard: int
    episodes: tuple[EpisodeRequest, ...]
    policy_bytes: bytes
    """The pickled policy: workers rebuild it exactly (a served model's client pickles as its
    address and settings, never its API key)."""
    policy_version: str
    episode_config: EpisodeConfig = dataclasses.field(default_factory=EpisodeConfig)
    recovery: RecoveryPolicy = dataclasses.field(default_factory=RecoveryPolicy)
    faults: FaultPlan | None = None
    """Injected faults (tests and benchmarks only)."""
    policy_lag: int = 0
    """Updates the trainer will be ahead of this shard's policy when it consumes the shard."""
    max_concurrent_requests: int = 1
    """Episodes of the shard in flight at once (threads), so a model server batches their
    requests. Each holds one sandbox from the worker's pool, so this also bounds the shard's
    open sandboxes."""

    def __post_init__(self) -> None:
        if self.max_concurrent_requests < 1:
            raise ValueError(
                f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class ShardOutcome:
    run_id: str
    iteration: int
    shard: int
    trajectories: tuple[Trajectory, ...]
    newly_committed: bool
    """False when the shard had been committed before (a replay wrote nothing)."""
    worker: str


def sample_task_dirs(
    task_dirs: Sequence[Path], *, count: int, iteration: int, seed: int
) -> list[Path]:
    """`count` distinct tasks for `iteration`, the same for the same (seed, iteration)."""
    if not task_dirs:
        raise TrainingSettingsError(
            "no tasks to sample from: give a directory holding task directories"
        )
    ordered = sorted(Path(d) for d in task_dirs)
    rng = random.Random(f"{seed}/{iteration}")
    if count >= len(ordered):
        return rng.sample(ordered, len(ordered))
    return rng.sample(ordered, count)


Schedule = Literal["round_robin", "longest_first", "by_group"]


def plan_iteration(
    task_dirs: Sequence[Path],
    *,
    run_id: str,
    iteration: int,
    policy: Policy,
    tasks_per_iteration: int,
    group_size: int,
    shard_count: int,
    seed: int = 0,
    episode_config: EpisodeConfig | None = None,
    recovery: RecoveryPolicy | None = None,
    faults: FaultPlan | None = None,
    schedule: Schedule = "round_robin",
    predicted_s: Mapping[str, float] | None = None,
    policy_lag: int = 0,
    max_concurrent_requests: int = 1,
) -> list[ShardRequest]:
    """Sample tasks, make one group of `group_size` samples per task, and deal the episodes into
    at most `shard_count` shards.

    `round_robin` spreads each group across shards. `longest_first` uses `predicted_s` (task dir
    -> predicted episode seconds, see `predict_episode_seconds`): episodes are placed longest
    first onto the least-loaded shard and shards are returned heaviest first, so long tasks start
    early and no straggler holds the batch at the end (LPT scheduling). `by_group` makes each
    group its own shard (`shard_count` is not used): the streaming mode's unit, so a group is
    done as soon as its own samples are."""
    if group_size < 1 or tasks_per_iteration < 1 or shard_count < 1:
        raise TrainingSettingsError("group_size, tasks_per_iteration and shard_count must be >= 1")
    if schedule not in ("round_robin", "longest_first", "by_group"):
        raise TrainingSettingsError(
            f"schedule must be round_robin, longest_first or by_group, got {schedule!r}"
        )
    chosen = sample_task_dirs(task_dirs, count=tasks_per_iteration, iteration=iteration, seed=seed)
    episodes = [
        EpisodeRequest(
            str(task_dir),
            EpisodeKey(run_id, iteration, group_index=group, sample_index=sample),
        )
        for group, task_dir in enumerate(chosen)
        for sample in range(group_size)
    ]
    shard_count = min(shard_count, len(episodes))
    if schedule == "by_group":
        shards = [
            episodes[start : start + group_size] for start in range(0, len(episodes), group_size)
        ]
    elif schedule == "longest_first":
        shards = _longest_first(episodes, shard_count, predicted_s or {})
    else:
        shards = [episodes[shard::shard_count] for shard in range(shard_count)]
    policy_bytes = pickle.dumps(policy)
    config = episode_config or EpisodeConfig(seed=seed)
    return [
        ShardRequest(
            run_id=run_id,
            iteration=iteration,
            shard=shard,
            episodes=tuple(members),
            policy_bytes=policy_bytes,
            policy_version=policy.version,
            episode_config=config,
            recovery=recovery or RecoveryPolicy(),
            faults=faults,
            policy_lag=policy_lag,
            max_concurrent_requests=max_concurrent_requests,
        )
        for shard, members in enumerate(shards)
    ]


def _longest_first(
    episodes: list[EpisodeRequest], shard_count: int, predicted_s: Mapping[str, float]
) -> list[list[EpisodeRequest]]:
    known = [v for v in predicted_s.values() if v > 0]
    default_s = sum(known) / len(known) if known else 1.0  # unknown tasks: the mean
    cost = {e.task_dir: predicted_s.get(e.task_dir, default_s) for e in episodes}
    shards: list[list[EpisodeRequest]] = [[] for _ in range(shard_count)]
    loads = [0.0] * shard_count
    for episode in sorted(episodes, key=lambda e: -cost[e.task_dir]):
        lightest = min(range(shard_count), key=loads.__getitem__)
        shards[lightest].append(episode)
        loads[lightest] += cost[episode.task_dir]
    order = sorted(range(shard_count), key=lambda i: -loads[i])
    return [shards[i] for i in order]


def predict_episode_seconds(
    store: TrajectoryStore, task_dirs: Sequence[Path], *, last_n: int = 20
) -> dict[str, float]:
    """Predicted wall seconds of an episode per task dir: the median of its last `last_n`
    committed episodes in the store (tasks never run are left out)."""
    ids = {_load_task_cached(str(d)).id: str(d) for d in task_dirs}
    if not ids:
        return {}
    try:
        rows = store.query(
            """
            SELECT task_id, median(wall_s) AS seconds FROM (
                SELECT task_id, wall_s, row_number() OVER (
                    PARTITION BY task_id ORDER BY finished_at DESC) AS recent
                FROM episodes WHERE wall_s IS NOT NULL)
            WHERE recent <= ? GROUP BY task_id
            """,
            [last_n],
        ).to_pylist()
    except StoreError:
        return {}  # an empty store has no history yet
    return {ids[r["task_id"]]: float(r["seconds"]) for r in rows if r["task_id"] in ids}


# -- running a shard ------------------------------------------------------------------------------


@functools.cache
def worker_pool() -> SandboxPool:
    """This process's sandbox pool (one per Dask worker process), closed at exit."""
    pool = SandboxPool(limits=Limits(), max_idle_per_snapshot=2)
    atexit.register(pool.close)
    return pool


@functools.lru_cache(maxsize=512)
def _load_task_cached(task_dir: str) -> Task:
    return load_task(task_dir)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def run_shard(request: ShardRequest, *, pool: SandboxPool | None = None) -> list[Trajectory]:
    """Run the shard's episodes with the policy it carries: one after another, or up to
    `max_concurrent_requests` at a time, each with its own `Policy.fork()`. Trajectories come
    back in the shard's order either way."""
    pool = pool or worker_pool()
    policy: Policy = pickle.loads(request.policy_bytes)
    if policy.version != request.policy_version:
        raise TrainerError(
            f"shard {request.shard} carries policy {policy.version}, expected "
            f"{request.policy_version}: the policy bytes are corrupt"
        )

    # Loaded here, in one thread: the loader parses test files with `ast.parse`, which
    # CPython 3.11 before 3.11.8 can fail with a spurious "AST constructor recursion depth
    # mismatch" when threads parse at once (python/cpython#106905).
    tasks = {episode.task_dir: _load_task_cached(episode.task_dir) for episode in request.episodes}

    def run(episode: EpisodeRequest, acting: Policy) -> Trajectory:
        return run_episode_with_recovery(
            tasks[episode.task_dir],
            acting,
            pool,
            key=episode.key,
            config=request.episode_config,
            recovery=request.recovery,
            faults=request.faults,
        )

    try:
        in_flight = min(request.max_concurrent_requests, len(request.episodes))
        if in_flight <= 1:
            return [run(episode, policy) for episode in request.episodes]
        with ThreadPoolExecutor(in_flight, thread_name_prefix="episode") as executor:
            futures = [executor.submit(run, e, policy.fork()) for e in request.episodes]
            return [future.result() for future in futures]
    finally:
        policy.close()


def commit_shard(
    store: TrajectoryStore, request: ShardRequest, trajectories: Sequence[Trajectory]
) -> CommitResult:
    worker = worker_name()
    return store.commit_iteration_shard(
        request.run_id,
        request.iteration,
        request.shard,
        episodes=[
            t.to_episode_record(worker=worker, policy_lag=request.policy_lag) for t in trajectories
        ],
        steps=[step for t in trajectories for step in t.to_step_records()],
    )


def rollout_shard_and_commit(
    request: ShardRequest, store_root: str | Path, *, pool: SandboxPool | None = None
) -> ShardOutcome:
    """Run a shard and commit it; replaying a committed shard runs it but writes nothing."""
    trajectories = run_shard(request, pool=pool)
    result = commit_shard(TrajectoryStore(store_root), request, trajectories)
    return ShardOutcome(
        run_id=request.run_id,
        iteration=request.iteration,
        shard=request.shard,
        trajectories=tuple(trajectories),
        newly_committed=result.committed,
        worker=worker_name(),
    )
