"""The simulation's model (simpy): its inputs (`Costs`, `Workload`, from a store or the committed
figures) and the discrete-event loop itself (`simulate`), for `benchmarks/simulate.py`."""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import random
import statistics
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import simpy

MODES = ("sync", "async", "streaming")


# -- inputs --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Costs:
    """Fixed costs of the loop, in seconds. Defaults are figures measured on this machine
    (benchmarks/README.md, research/stack.md) unless a calibration replaces them."""

    sandbox_open_s: float = 0.0144
    """Open a bwrap sandbox (open + execute + close p50 14.4 ms, Sandbox start-up)."""
    sandbox_reset_s: float = 0.0007
    """Reset a warm one (0.4-0.7 ms)."""
    scheduler_s_per_task: float = 0.001
    """Dask scheduler time per task, paid one task at a time (Dask's documented ~1 ms)."""
    task_overhead_s: float = 0.2
    """Prefect task under the Dask runner, on the worker (160-260 ms measured)."""
    commit_write_s: float = 0.045
    """A shard's Parquet files, written by its worker (a 58-61 ms shard commit minus the log)."""
    commit_log_s: float = 0.015
    """One Delta log commit (catch-up + two commits, 10-25 ms); one writer at a time."""
    gate_s: float = 0.35
    """Quality gate per batch: fixed part."""
    gate_s_per_episode: float = 0.4 / 10_000
    """...and per episode (0.42 s at 10,000 episodes)."""
    update_fixed_s: float = 0.2
    """Trainer update: fixed part (optimizer step, weights out)."""
    finish_s: float = 0.5
    """Checkpoint, completion marker, compaction, artifacts, per batch."""


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """Measured episode durations per task: agent seconds (wall minus verification) and
    verifier seconds, one pair per recorded episode."""

    episodes_by_task: dict[str, list[tuple[float, float]]]

    @property
    def tasks(self) -> list[str]:
        return sorted(self.episodes_by_task)

    def mean_episode_s(self) -> float:
        walls = [a + v for pairs in self.episodes_by_task.values() for a, v in pairs]
        return statistics.fmean(walls)

    def spread(self) -> float:
        """Ratio of the slowest task's median episode to the fastest's."""
        medians = [statistics.median(a + v for a, v in p) for p in self.episodes_by_task.values()]
        return max(medians) / min(medians)


def workload_from_store(
    store_root: str, run_id: str | None = None, *, skip_iterations: int = 0
) -> Workload:
    """Episode durations recorded in a store's episodes table (status `ok` only), leaving out
    each run's first `skip_iterations` iterations (the first pays the workers' start-up:
    imports, the first sandboxes, inside its episodes)."""
    from storage import TrajectoryStore

    sql = (
        "SELECT task_id, wall_s, coalesce(verify_s, 0) AS verify_s FROM episodes "
        "WHERE wall_s IS NOT NULL AND status = 'ok' AND iteration >= ?"
    )
    parameters: list[Any] = [skip_iterations]
    if run_id is not None:
        sql += " AND run_id = ?"
        parameters.append(run_id)
    rows = TrajectoryStore(store_root).query(sql, parameters).to_pylist()
    if not rows:
        raise SystemExit(
            f"error: no finished episodes{f' of run {run_id!r}' if run_id else ''} in the "
            f"store at {store_root}; run `rollyard train` into it first"
        )
    by_task: dict[str, list[tuple[float, float]]] = collections.defaultdict(list)
    for row in rows:
        verify_s = float(row["verify_s"])
        by_task[row["task_id"]].append((max(0.0, float(row["wall_s"]) - verify_s), verify_s))
    return Workload(dict(by_task))


def load_figures(path: Path) -> tuple[Workload, Costs, dict[str, Any]]:
    """The committed figures: measured episode durations, costs and the run they came from."""
    try:
        data = json.loads(path.read_text())
        workload = Workload({t: [(a, v) for a, v in p] for t, p in data["episodes"].items()})
        costs = Costs(**data["costs"])
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise SystemExit(
            f"error: cannot read simulation figures from {path}: {error}; regenerate them with "
            "`python benchmarks/simulate.py export --store STORE --run-id RUN --out FILE`"
        ) from error
    return workload, costs, data.get("measured", {})


# -- the model -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class SimConfig:
    sandboxes: int
    """Concurrent sandbox slots (a worker thread each, as in the train flow)."""
    mode: str = "sync"
    batch_groups: int = 4
    """GRPO groups per batch (an iteration's tasks)."""
    group_size: int = 4
    shard_episodes: int = 4
    """Episodes per shard (per Dask task), run in sequence on one slot."""
    batches: int = 6
    """Batches the trainer consumes (iterations)."""
    staleness: int = 1
    """async: iterations rolled out ahead; streaming: updates a group's policy may be behind."""
    commit_group: int = 16
    """Shards the store's writer may take into one Delta log commit."""
    gpus: int = 1
    gpu_s_per_episode: float = 0.0
    """Update cost of one episode on one GPU (0: the calibrated `update_fixed_s` only)."""
    verify_scale: float = 1.0
    schedule: str = "round_robin"
    seed: int = 0

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if min(self.sandboxes, self.batch_groups, self.group_size, self.shard_episodes) < 1:
            raise ValueError("sandboxes, batch_groups, group_size and shard_episodes must be >= 1")
        if self.staleness < 0 or self.commit_group < 1 or self.gpus < 1 or self.batches < 1:
            raise ValueError("staleness >= 0, commit_group >= 1, gpus >= 1, batches >= 1")

    @property
    def batch_episodes(self) -> int:
        return self.batch_groups * self.group_size


@dataclasses.dataclass(frozen=True, slots=True)
class SimResult:
    config: SimConfig
    wall_s: float
    batch_walls_s: tuple[float, ...]
    """Time between consecutive batch completions (the first from the start)."""
    trainer_busy_s: float
    first_update_s: float
    sandbox_busy_s: float
    """Slot-seconds spent opening/resetting sandboxes and running episodes."""
    episodes_run: int
    episodes_trained: int
    groups_dropped: int
    shard_commits: int
    log_commits: int
    max_staleness: int

    @property
    def trainer_idle(self) -> float:
        """Share of time the trainer's GPUs wait, from the end of the first batch (before it,
        every mode waits for a first rollout) to the end of the run."""
        window_s = self.wall_s - self.batch_walls_s[0]
        if window_s <= 0:
            return 1.0 - self.trainer_busy_s / self.wall_s
        return 1.0 - (self.trainer_busy_s - self.first_update_s) / window_s

    @property
    def sandbox_utilization(self) -> float:
        return self.sandbox_busy_s / (self.config.sandboxes * self.wall_s)

    @property
    def trained_per_s(self) -> float:
        return self.episodes_trained / self.wall_s

    @property
    def shard_commits_per_s(self) -> float:
        return self.shard_commits / self.wall_s

    @property
    def log_commits_per_s(self) -> float:
        return self.log_commits / self.wall_s


@dataclasses.dataclass(slots=True)
class _Episode:
    task: str
    group: int
    """Global group number."""
    agent_s: float
    verify_s: float


@dataclasses.dataclass(slots=True)
class _Group:
    number: int
    batch: int
    """The batch it was planned for."""
    size: int
    policy_version: int = 0
    committed: int = 0


class _Loop:
    """One simulated run. Slots are a FIFO resource, like Dask's queue of ready tasks."""

    def __init__(self, config: SimConfig, workload: Workload, costs: Costs) -> None:
        self.c, self.w, self.k = config, workload, costs
        self.env = simpy.Environment()
        self.rng = random.Random(config.seed)
        self.slots = simpy.Resource(self.env, capacity=config.sandboxes)
        self.scheduler = simpy.Resource(self.env, capacity=1)
        self.warm: list[str | None] = [None] * config.sandboxes
        self.free_slots = list(range(config.sandboxes))
        self.commit_queue: simpy.Store = simpy.Store(self.env)
        self.groups: dict[int, _Group] = {}
        self.next_group = 0
        self.version = 0
        self.trainer_busy_s = 0.0
        self.first_update_s = 0.0
        self.sandbox_busy_s = 0.0
        self.episodes_run = 0
        self.episodes_trained = 0
        self.groups_dropped = 0
        self.shard_commits = 0
        self.log_commits = 0
        self.max_staleness = 0
        self.batch_done_at: list[float] = []
        self.ready_groups: collections.deque[_Group] = collections.deque()
        self.group_ready = self.env.event()
        self.version_changed = self.env.event()
        self.env.process(self._committer())

    # episodes and shards

    def _plan_batch(self, batch: int) -> list[list[_Episode]]:
        """One batch's groups dealt into shards (round robin, or longest first)."""
        episodes = []
        for _ in range(self.c.batch_groups):
            task = self.rng.choice(self.w.tasks)
            group = _Group(self.next_group, batch, self.c.group_size, self.version)
            self.groups[group.number] = group
            self.next_group += 1
            measured = self.w.episodes_by_task[task]
            for _ in range(self.c.group_size):
                agent_s, verify_s = self.rng.choice(measured)
                episodes.append(_Episode(task, group.number, agent_s, verify_s))
        shard_count = max(1, math.ceil(len(episodes) / self.c.shard_episodes))
        if self.c.schedule == "longest_first":
            predicted = {t: statistics.median(a + v for a, v in p)
                         for t, p in self.w.episodes_by_task.items()}  # fmt: skip
            shards: list[list[_Episode]] = [[] for _ in range(shard_count)]
            loads = [0.0] * shard_count
            for episode in sorted(episodes, key=lambda e: -predicted[e.task]):
                lightest = min(range(shard_count), key=loads.__getitem__)
                shards[lightest].append(episode)
                loads[lightest] += predicted[episode.task]
            return [shards[i] for i in sorted(range(shard_count), key=lambda i: -loads[i])]
        if self.c.mode == "streaming":
            # Whole groups per shard where they fit: a group is ready for the trainer only
            # once every shard holding one of its episodes has committed.
            size = self.c.shard_episodes
            return [episodes[i : i + size] for i in range(0, len(episodes), size)]
        return [episodes[s::shard_count] for s in range(shard_count)]

    def _shard(self, episodes: list[_Episode]) -> Iterator[simpy.Event]:
        with self.scheduler.request() as turn:
            yield turn
            yield self.env.timeout(self.k.scheduler_s_per_task)
        with self.slots.request() as slot_turn:
            yield slot_turn
            slot = self.free_slots.pop()
            yield self.env.timeout(self.k.task_overhead_s)
            for episode in episodes:
                if self.warm[slot] == episode.task:
                    start_s = self.k.sandbox_reset_s
                else:
                    start_s = self.k.sandbox_open_s
                    self.warm[slot] = episode.task
                run_s = start_s + episode.agent_s + episode.verify_s * self.c.verify_scale
                yield self.env.timeout(run_s)
                # Counted once done, so work still running when the run ends is left out.
                self.sandbox_busy_s += run_s
                self.episodes_run += 1
            # The worker waits for its commit (commit_iteration_shard returns once the log
            # commit is in), so a store that falls behind holds slots.
            yield self.env.timeout(self.k.commit_write_s)
            committed = self.env.event()
            yield self.commit_queue.put((episodes, committed))
            yield committed
            self.free_slots.append(slot)

    def _committer(self) -> Iterator[simpy.Event]:
        """The store's writer: one Delta log commit at a time, taking up to `commit_group`
        queued shards into each."""
        while True:
            first = yield self.commit_queue.get()
            taken = [first]
            while self.commit_queue.items and len(taken) < self.c.commit_group:
                taken.append((yield self.commit_queue.get()))
            yield self.env.timeout(self.k.commit_log_s)
            self.log_commits += 1
            for episodes, committed in taken:
                self.shard_commits += 1
                for episode in episodes:
                    group = self.groups[episode.group]
                    group.committed += 1
                    if group.committed == group.size:
                        self.ready_groups.append(group)
                        if not self.group_ready.triggered:
                            self.group_ready.succeed()
                committed.succeed()

    def _submit_batch(self, batch: int) -> simpy.Event:
        shards = [self.env.process(self._shard(s)) for s in self._plan_batch(batch)]
        return self.env.all_of(shards)

    # the trainer

    def _train(self, episodes: int) -> Iterator[simpy.Event]:
        """Gate, update, checkpoint: one after another on the trainer's process. Only the
        update counts as the trainer busy (the GPUs idle through the gate and checkpoint)."""
        yield self.env.timeout(self.k.gate_s + self.k.gate_s_per_episode * episodes)
        update_s = self.k.update_fixed_s + self.c.gpu_s_per_episode * episodes / self.c.gpus
        yield self.env.timeout(update_s)
        self.trainer_busy_s += update_s
        if not self.batch_done_at:
            self.first_update_s = update_s
        self.version += 1
        self.version_changed.succeed()
        self.version_changed = self.env.event()
        self.episodes_trained += episodes
        yield self.env.timeout(self.k.finish_s)
        self.batch_done_at.append(self.env.now)

    def run_pipelined(self) -> Iterator[simpy.Event]:
        """sync (depth 0) and async (depth = staleness): the train flow's loop."""
        depth = self.c.staleness if self.c.mode == "async" else 0
        in_flight: dict[int, tuple[simpy.Event, int]] = {}
        for batch in range(self.c.batches):
            for ahead in range(batch, min(self.c.batches, batch + depth + 1)):
                if ahead not in in_flight:
                    in_flight[ahead] = (self._submit_batch(ahead), self.version)
            done, planned_at_version = in_flight.pop(batch)
            yield done
            self.ready_groups.clear()
            self.max_staleness = max(self.max_staleness, self.version - planned_at_version)
            yield from self._train(self.c.batch_episodes)

    def _producer(self) -> Iterator[simpy.Event]:
        """Streaming: plan a batch of groups whenever fewer than `staleness + 1` batches are
        ahead of the trainer's version (not capped at `batches`: dropped groups leave batches
        to fill with later ones)."""
        planned = 0
        while True:
            while planned <= self.version + self.c.staleness:
                self._submit_batch(planned)
                planned += 1
            yield self.version_changed

    def run_streaming(self) -> Iterator[simpy.Event]:
        """The trainer takes `batch_groups` committed groups as soon as they are there, in
        commit order, dropping those more than `staleness` updates behind; a short batch
        carries over."""
        self.env.process(self._producer())
        taken: list[_Group] = []
        while self.version < self.c.batches:
            while len(taken) < self.c.batch_groups:
                if not self.ready_groups:
                    self.group_ready = self.env.event()
                    yield self.group_ready
                    continue
                group = self.ready_groups.popleft()
                staleness = self.version - group.policy_version
                if staleness > self.c.staleness:
                    self.groups_dropped += 1
                    continue
                self.max_staleness = max(self.max_staleness, staleness)
                taken.append(group)
            yield from self._train(sum(g.size for g in taken))
            taken = []

    def run(self) -> SimResult:
        runner = self.run_streaming() if self.c.mode == "streaming" else self.run_pipelined()
        done = self.env.process(runner)
        self.env.run(until=done)
        walls = [
            b - a for a, b in zip([0.0, *self.batch_done_at], self.batch_done_at, strict=False)
        ]
        return SimResult(
            config=self.c,
            wall_s=self.env.now,
            batch_walls_s=tuple(walls),
            trainer_busy_s=self.trainer_busy_s,
            first_update_s=self.first_update_s,
            sandbox_busy_s=self.sandbox_busy_s,
            episodes_run=self.episodes_run,
            episodes_trained=self.episodes_trained,
            groups_dropped=self.groups_dropped,
            shard_commits=self.shard_commits,
            log_commits=self.log_commits,
            max_staleness=self.max_staleness,
        )


def simulate(config: SimConfig, workload: Workload, costs: Costs) -> SimResult:
    return _Loop(config, workload, costs).run()
