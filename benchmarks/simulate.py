"""A discrete-event model (simpy) of the training loop at scale: how busy the trainer and the
sandboxes are, and how many commits a second the store must take, for sync, async and streaming.

    python benchmarks/simulate.py calibrate --store STORE --run-id RUN   # model vs a real run
    python benchmarks/simulate.py export --store STORE --out FILE        # measured figures
    python benchmarks/simulate.py sweep [--store STORE | --figures FILE]  # 100 to 10,000 sandboxes

What is modelled, per episode and per shard (each cost a parameter of `Costs`):
- a shard is one Dask task: the scheduler spends `scheduler_s_per_task` on it (serially), the
  Prefect task around it costs `task_overhead_s` on the worker, then the shard's episodes run one
  after another on one sandbox slot (as `training.rollout.run_shard` does), each paying
  `sandbox_open_s` when the slot holds no warm sandbox of the episode's task, else
  `sandbox_reset_s`, then its measured wall (agent steps plus `verify_s`, scaled by
  `verify_scale`);
- the shard commits: `commit_write_s` of file writes on the worker, then a Delta log commit of
  `commit_log_s` that one writer does at a time; `commit_group` shards queued at once share one
  log commit (the store's group commit);
- the trainer: `gate_s` (+ per episode), the update (`update_fixed_s` + `gpu_s_per_episode`
  x batch / GPUs), then `finish_s` (checkpoint, completion marker, compaction).

Modes: `sync` (roll out an iteration, then update), `async` (the next `staleness` iterations
roll out while the trainer updates: the train flow's async mode), `streaming` (groups flow into
a buffer as their shards commit and the trainer takes a batch as soon as one is full; a group
whose policy is more than `staleness` updates behind when it is taken is dropped and counted).

Episode durations come from a store's episodes table (DuckDB over the Delta tables) with
`--store`, else from `benchmarks/simulate_figures.json` (measured on this machine and
committed; `export` writes it).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import itertools
import json
import math
import random
import sqlite3
import statistics
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import simpy

HERE = Path(__file__).resolve().parent
FIGURES_FILE = HERE / "simulate_figures.json"
PLOTS_DIR = HERE / "figures"
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


# -- calibration against a real run -------------------------------------------------------------


def _epoch_s(value: Any) -> float:
    return float(value.timestamp())


def measure_run(store_root: str, run_id: str) -> dict[str, Any]:
    """What a real `rollyard train` run did, from its store and its Prefect database: iteration
    walls (between completion markers), the gaps that are not episodes (between episodes of a
    shard, between shards on a worker, around the trainer) and the gate's and update's times."""
    from flows.runtime import prefect_home_for
    from storage import TrajectoryStore
    from training.iteration import ITERATION_DONE_SOURCE

    store = TrajectoryStore(store_root)
    episodes = store.query(
        "SELECT iteration, shard, worker, task_id, wall_s, verify_s, started_at, finished_at "
        "FROM episodes WHERE run_id = ? ORDER BY started_at",
        [run_id],
    ).to_pylist()
    markers = store.query(
        "SELECT iteration, max(recorded_at) AS at FROM metrics WHERE run_id = ? AND source = ? "
        "GROUP BY iteration ORDER BY iteration",
        [run_id, ITERATION_DONE_SOURCE],
    ).to_pylist()
    if len(markers) < 2 or not episodes:
        raise SystemExit(
            f"error: run {run_id!r} in {store_root} has {len(markers)} finished iteration(s); "
            "calibration needs at least 2 (the first one pays the workers' start-up)"
        )
    marker_s = {int(m["iteration"]): _epoch_s(m["at"]) for m in markers}
    by_iteration: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for episode in episodes:
        by_iteration[int(episode["iteration"])].append(episode)

    within_shard, between_shards = [], []
    for iteration_episodes in by_iteration.values():
        by_worker: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
        for episode in iteration_episodes:
            by_worker[episode["worker"]].append(episode)
        for run in by_worker.values():
            for before, after in itertools.pairwise(run):
                gap = _epoch_s(after["started_at"]) - _epoch_s(before["finished_at"])
                same_shard = before["shard"] == after["shard"]
                (within_shard if same_shard else between_shards).append(gap)
    trainer_gaps = []
    for iteration in sorted(by_iteration)[1:]:
        previous = by_iteration[iteration - 1]
        last_finish = max(_epoch_s(e["finished_at"]) for e in previous)
        first_start = min(_epoch_s(e["started_at"]) for e in by_iteration[iteration])
        trainer_gaps.append(first_start - last_finish)

    prefect_runs: dict[str, list[float]] = collections.defaultdict(list)
    database = prefect_home_for(store_root) / "prefect.db"
    if database.is_file():
        connection = sqlite3.connect(f"file:{database}?mode=ro", uri=True)
        try:
            rows = connection.execute(
                "SELECT name, julianday(end_time) - julianday(start_time) FROM task_run "
                "WHERE state_type = 'COMPLETED' AND end_time IS NOT NULL"
            ).fetchall()
        finally:
            connection.close()
        for name, days in rows:
            prefect_runs[str(name).rsplit("-", 1)[0]].append(float(days) * 86_400)
    walls = [marker_s[i] - marker_s[i - 1] for i in sorted(marker_s)[1:] if i - 1 in marker_s]
    return {
        "iteration_walls_s": walls,
        "within_shard_gap_s": statistics.median(within_shard) if within_shard else 0.0,
        "between_shards_gap_s": statistics.median(between_shards) if between_shards else 0.0,
        "trainer_gap_s": statistics.median(trainer_gaps),
        "gate_s": statistics.median(prefect_runs["gate_iteration"] or [0.0]),
        "update_s": statistics.median(prefect_runs["update_policy"] or [0.0]),
        "updates": len(prefect_runs["update_policy"]),
        "episodes": len(episodes),
        "iterations": len(markers),
    }


def calibrated_costs(measured: dict[str, Any], base: Costs) -> Costs:
    """`base` with the loop's fixed costs replaced by what the run measured. The gaps hold
    several modelled costs each; the part not modelled separately goes to the Prefect task
    overhead (between shards) and to the trainer's finish (between iterations)."""
    open_s = max(0.0, measured["within_shard_gap_s"])
    commit_s = base.commit_write_s + base.commit_log_s
    task_overhead_s = max(
        0.0, measured["between_shards_gap_s"] - commit_s - open_s - base.scheduler_s_per_task
    )
    # Between the last episode of one iteration and the first of the next: the last shard's
    # commit and task overhead, the gate, the update, the rest (checkpoint, marker,
    # compaction, artifacts, planning).
    finish_s = max(
        0.0,
        measured["trainer_gap_s"]
        - commit_s
        - task_overhead_s
        - open_s
        - measured["gate_s"]
        - measured["update_s"],
    )
    return dataclasses.replace(
        base,
        sandbox_open_s=open_s,
        sandbox_reset_s=open_s,
        task_overhead_s=task_overhead_s,
        gate_s=measured["gate_s"],
        gate_s_per_episode=0.0,
        update_fixed_s=measured["update_s"],
        finish_s=finish_s,
    )


def run_shape(store_root: str, run_id: str) -> dict[str, int]:
    """The configuration a run had, read back from its episodes: workers, groups per
    iteration, group size, episodes per shard."""
    from storage import TrajectoryStore

    sql = """
        WITH e AS (SELECT * FROM episodes WHERE run_id = ?)
        SELECT (SELECT count(DISTINCT worker) FROM e) AS workers,
               (SELECT max(g) FROM (SELECT count(DISTINCT group_index) AS g FROM e
                   GROUP BY iteration)) AS groups,
               (SELECT max(n) FROM (SELECT count(*) AS n FROM e
                   GROUP BY iteration, group_index)) AS group_size,
               (SELECT max(n) FROM (SELECT count(*) AS n FROM e
                   GROUP BY iteration, shard)) AS per_shard
    """
    row = TrajectoryStore(store_root).query(sql, [run_id]).to_pylist()[0]
    return {k: int(v) for k, v in row.items()}


def calibrate(store_root: str, run_id: str, *, seeds: int, schedule: str) -> dict[str, Any]:
    """Simulate the run's configuration with its measured costs and durations; compare the
    mean iteration wall (iterations after the first) with the measured one."""
    measured = measure_run(store_root, run_id)
    shape = run_shape(store_root, run_id)
    # The compared iterations are those after the first, so are the durations drawn.
    workload = workload_from_store(store_root, run_id, skip_iterations=1)
    costs = calibrated_costs(measured, Costs())
    simulated = []
    for seed in range(seeds):
        config = SimConfig(
            sandboxes=shape["workers"],
            mode="sync",
            batch_groups=shape["groups"],
            group_size=shape["group_size"],
            shard_episodes=shape["per_shard"],
            batches=measured["iterations"],
            schedule=schedule,
            seed=seed,
        )
        simulated.extend(simulate(config, workload, costs).batch_walls_s[1:])
    measured_wall = statistics.fmean(measured["iteration_walls_s"])
    simulated_wall = statistics.fmean(simulated)
    return {
        "run": {"store": Path(store_root).name, "run_id": run_id, **shape},
        "measured": measured,
        "costs": dataclasses.asdict(costs),
        "measured_iteration_wall_s": measured_wall,
        "simulated_iteration_wall_s": simulated_wall,
        "simulated_p10_p90_s": [
            statistics.quantiles(simulated, n=10)[0],
            statistics.quantiles(simulated, n=10)[-1],
        ],
        "error": simulated_wall / measured_wall - 1.0,
    }


# -- the sweep -----------------------------------------------------------------------------------

SANDBOX_COUNTS = (100, 1_000, 10_000)
GPU_COUNTS = (1, 4, 16, 64)
EPISODES_PER_SANDBOX = 4
"""Batch size at scale: each sandbox runs about this many episodes per batch."""
GROUP_SIZE_AT_SCALE = 8
UPDATE_RATIO = 0.02
"""GPU-seconds to train on one episode per second of its rollout: a stand-in, not a
measurement (a 7B-32B model trains on an agent episode's tokens in roughly 1-7% of the time
the episode took to roll out); the sweep's 1-64 GPUs then span trainer-bound to rollout-bound."""


def scale_config(
    sandboxes: int, mode: str, gpus: int, workload: Workload, **changes: Any
) -> SimConfig:
    config = SimConfig(
        sandboxes=sandboxes,
        mode=mode,
        batch_groups=sandboxes * EPISODES_PER_SANDBOX // GROUP_SIZE_AT_SCALE,
        group_size=GROUP_SIZE_AT_SCALE,
        shard_episodes=EPISODES_PER_SANDBOX,
        batches=6 if sandboxes < 10_000 else 4,
        staleness=1 if mode == "async" else 2,
        commit_group=16,
        gpus=gpus,
        gpu_s_per_episode=UPDATE_RATIO * workload.mean_episode_s(),
        schedule="round_robin",
    )
    return dataclasses.replace(config, **changes)


def result_row(result: SimResult) -> dict[str, Any]:
    c = result.config
    return {
        "sandboxes": c.sandboxes,
        "mode": c.mode,
        "gpus": c.gpus,
        "shard_episodes": c.shard_episodes,
        "commit_group": c.commit_group,
        "staleness": c.staleness,
        "schedule": c.schedule,
        "wall_s": round(result.wall_s, 1),
        "trainer_idle": round(result.trainer_idle, 4),
        "sandbox_utilization": round(result.sandbox_utilization, 4),
        "trained_per_s": round(result.trained_per_s, 2),
        "shard_commits_per_s": round(result.shard_commits_per_s, 1),
        "log_commits_per_s": round(result.log_commits_per_s, 1),
        "groups_dropped": result.groups_dropped,
        "dropped_share": round(
            result.groups_dropped
            / max(1, result.groups_dropped + result.episodes_trained // c.group_size),
            4,
        ),
        "max_staleness": result.max_staleness,
    }


AXES: dict[str, tuple[int, str, int, Sequence[int], dict[str, Any]]] = {
    # name (the field varied): (sandboxes, mode, gpus, values, other changes)
    # Rollout-bound (256 GPUs) with one episode a shard: the most commits a second.
    "commit_group": (10_000, "streaming", 256, (1, 4, 16, 64), {"shard_episodes": 1, "batches": 2}),
    "shard_episodes": (1_000, "sync", 16, (1, 2, 4, 8, 16), {}),
    "staleness": (1_000, "streaming", 16, (0, 1, 2, 4), {}),
}


def sweep(
    workload: Workload,
    costs: Costs,
    *,
    grid: list[dict[str, Any]] | None = None,
    axes: Sequence[str] = tuple(AXES),
) -> dict[str, list[dict[str, Any]]]:
    """The main grid (or `grid`, rows of an earlier sweep's output), then one axis at a time
    around a middle point, for the defaults."""
    tables: dict[str, list[dict[str, Any]]] = {"grid": list(grid or [])}
    if grid is None:
        for sandboxes in SANDBOX_COUNTS:
            for gpus in GPU_COUNTS:
                for mode in MODES:
                    config = scale_config(sandboxes, mode, gpus, workload)
                    tables["grid"].append(result_row(simulate(config, workload, costs)))
                    print(json.dumps(tables["grid"][-1]), flush=True)
    for name in axes:
        sandboxes, mode, gpus, values, fixed = AXES[name]
        tables[name] = []
        for value in values:
            config = scale_config(sandboxes, mode, gpus, workload, **{**fixed, name: value})
            tables[name].append(result_row(simulate(config, workload, costs)))
            print(json.dumps(tables[name][-1]), flush=True)
    return tables


def plot(
    tables: dict[str, list[dict[str, Any]]], out_dir: Path, title: str, name: str
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    grid = tables["grid"]
    written = []
    metrics = (
        ("trainer_idle", "trainer idle (share of time)"),
        ("sandbox_utilization", "sandbox utilization"),
        ("trained_per_s", "trained episodes / s"),
    )
    fig, axes = plt.subplots(len(metrics), len(SANDBOX_COUNTS), figsize=(13, 10), squeeze=False)
    for column, sandboxes in enumerate(SANDBOX_COUNTS):
        for row, (metric, label) in enumerate(metrics):
            axis = axes[row][column]
            for mode in MODES:
                points = [r for r in grid if r["sandboxes"] == sandboxes and r["mode"] == mode]
                axis.plot([r["gpus"] for r in points], [r[metric] for r in points],
                          marker="o", label=mode)  # fmt: skip
            axis.set_xscale("log", base=2)
            axis.set_xlabel("trainer GPUs")
            axis.set_ylabel(label)
            if metric == "trained_per_s":
                axis.set_yscale("log")
            axis.set_title(f"{sandboxes:,} sandboxes")
            axis.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = out_dir / f"{name}_grid.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), squeeze=False)
    for axis, (axis_name, field, label) in zip(
        axes[0],
        (
            ("commit_group", "commit_group", "shards per Delta log commit"),
            ("shard_episodes", "shard_episodes", "episodes per shard"),
            ("staleness", "staleness", "staleness bound (updates)"),
        ),
        strict=True,
    ):
        if axis_name not in tables:
            axis.set_visible(False)
            continue
        rows = tables[axis_name]
        xs = [r[field] for r in rows]
        axis.plot(xs, [r["sandbox_utilization"] for r in rows], marker="o", label="sandbox util.")
        axis.plot(xs, [1 - r["trainer_idle"] for r in rows], marker="s", label="trainer busy")
        if axis_name == "staleness":
            axis.plot(xs, [r["dropped_share"] for r in rows], marker="x", label="groups dropped")
        first = rows[0]
        axis.set_title(f"{axis_name}: {first['sandboxes']:,} sandboxes, {first['mode']}, "
                       f"{first['gpus']} GPUs", fontsize=9)  # fmt: skip
        axis.set_xlabel(label)
        axis.set_ylim(0, 1.05)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / f"{name}_defaults.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    return written


def plot_calibration(reports: dict[str, dict[str, Any]], path: Path) -> Path:
    """Measured against simulated iteration wall, one pair of bars per calibration run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6, 4))
    names = list(reports)
    xs = range(len(names))
    measured = [reports[n]["measured_iteration_wall_s"] for n in names]
    simulated = [reports[n]["simulated_iteration_wall_s"] for n in names]
    low = [s - reports[n]["simulated_p10_p90_s"][0] for n, s in zip(names, simulated, strict=True)]
    high = [reports[n]["simulated_p10_p90_s"][1] - s for n, s in zip(names, simulated, strict=True)]
    axis.bar([x - 0.2 for x in xs], measured, width=0.4, label="measured (mean)")
    axis.bar([x + 0.2 for x in xs], simulated, width=0.4, yerr=[low, high], capsize=4,
             label="simulated (mean, p10-p90)")  # fmt: skip
    for x, name in zip(xs, names, strict=True):
        axis.annotate(f"{100 * reports[name]['error']:+.1f}%", (x + 0.2, simulated[x]),
                      ha="center", va="bottom", fontsize=9)  # fmt: skip
    axis.set_xticks(list(xs), names)
    axis.set_ylabel("iteration wall (s)")
    axis.set_title("calibration: real train flow vs model, same configuration")
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def markdown_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    for row in rows:
        cells = []
        for column in columns:
            value = row[column]
            if column in ("trainer_idle", "sandbox_utilization", "dropped_share"):
                cells.append(f"{100 * value:.1f}%")
            elif isinstance(value, float):
                cells.append(f"{value:,.1f}")
            else:
                cells.append(f"{value:,}" if isinstance(value, int) else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cal = commands.add_parser("calibrate", help="simulate a real run's configuration, compare")
    cal.add_argument("--store", required=True)
    cal.add_argument("--run-id", required=True)
    cal.add_argument("--seeds", type=int, default=200)
    cal.add_argument("--schedule", choices=("round_robin", "longest_first"), default="round_robin")
    cal.add_argument("--json", type=Path, help="also write the comparison here")
    export = commands.add_parser("export", help="write a run's figures for later simulations")
    export.add_argument("--store", required=True)
    export.add_argument("--run-id", required=True)
    export.add_argument("--out", type=Path, default=FIGURES_FILE)
    export.add_argument(
        "--skip-iterations", type=int, default=1, help="leave out each run's first iterations"
    )
    export.add_argument(
        "--schedule", choices=("round_robin", "longest_first"), default="round_robin"
    )
    plot_cal = commands.add_parser("plot-calibration", help="bar chart of calibration reports")
    plot_cal.add_argument("reports", nargs="+", type=Path, help="NAME=FILE.json from calibrate")
    plot_cal.add_argument("--out", type=Path, default=PLOTS_DIR / "calibration.png")
    run = commands.add_parser("sweep", help="100 to 10,000 sandboxes, 1-64 GPUs, three modes")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--store", help="take episode durations from this store")
    source.add_argument("--figures", type=Path, default=FIGURES_FILE)
    run.add_argument("--run-id", help="with --store: only this run's episodes")
    run.add_argument(
        "--skip-iterations", type=int, default=1, help="with --store: leave out each run's first"
    )
    run.add_argument("--out", type=Path, default=PLOTS_DIR)
    run.add_argument("--name", default="simulate", help="prefix of the written files")
    run.add_argument(
        "--grid-from", type=Path, help="reuse the grid rows a sweep printed (its output, saved)"
    )
    run.add_argument("--axes", nargs="*", choices=tuple(AXES), default=list(AXES))
    args = parser.parse_args(argv)

    if args.command == "calibrate":
        report = calibrate(args.store, args.run_id, seeds=args.seeds, schedule=args.schedule)
        text = json.dumps(report, indent=2)
        print(text)
        if args.json:
            args.json.write_text(text + "\n")
        return 0
    if args.command == "export":
        report = calibrate(args.store, args.run_id, seeds=200, schedule=args.schedule)
        workload = workload_from_store(
            args.store, args.run_id, skip_iterations=args.skip_iterations
        )
        figures = {
            "measured": {k: v for k, v in report.items() if k != "costs"},
            "costs": report["costs"],
            "episodes": {
                task: [[round(a, 3), round(v, 3)] for a, v in pairs]
                for task, pairs in sorted(workload.episodes_by_task.items())
            },
        }
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {args.out}: {sum(map(len, workload.episodes_by_task.values()))} episodes "
              f"of {len(workload.tasks)} tasks, calibration error {100 * report['error']:+.1f}%")  # fmt: skip
        return 0
    if args.command == "plot-calibration":
        reports = {}
        for item in args.reports:
            name, _, file = str(item).partition("=")
            if not file:
                raise SystemExit(f"error: give each report as NAME=FILE.json, got {item}")
            reports[name] = json.loads(Path(file).read_text())
        print(plot_calibration(reports, args.out))
        return 0
    # Durations from a run; the fixed costs at scale are the defaults, measured on a lightly
    # loaded machine (a calibration's costs carry the load of its 2-core machine).
    if args.store:
        workload = workload_from_store(
            args.store, args.run_id, skip_iterations=args.skip_iterations
        )
    else:
        workload, _, _ = load_figures(args.figures)
    costs = Costs()
    print(f"workload: {len(workload.tasks)} tasks, mean episode {workload.mean_episode_s():.1f} s, "
          f"spread of task medians {workload.spread():.1f}x", flush=True)  # fmt: skip
    grid = None
    if args.grid_from:
        rows = [json.loads(line) for line in args.grid_from.read_text().splitlines()
                if line.startswith('{"sandboxes"')]  # fmt: skip
        grid = rows[: len(SANDBOX_COUNTS) * len(GPU_COUNTS) * len(MODES)]
    tables = sweep(workload, costs, grid=grid, axes=args.axes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(tables, indent=1) + "\n")
    plot(tables, args.out, f"{len(workload.tasks)} tasks, mean episode "
         f"{workload.mean_episode_s():.1f} s, spread {workload.spread():.1f}x", args.name)  # fmt: skip
    columns = ("sandboxes", "gpus", "mode", "trainer_idle", "sandbox_utilization",
               "trained_per_s", "shard_commits_per_s", "log_commits_per_s", "dropped_share")  # fmt: skip
    print(markdown_table(tables["grid"], columns))
    for name in args.axes:
        print(f"\n{name}\n" + markdown_table(tables[name], (name, *columns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
