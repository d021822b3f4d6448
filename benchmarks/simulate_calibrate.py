"""The simulation against a real run: a `rollyard train` run's measured walls and gaps (from its
store and its Prefect database), the costs they imply, and the model's error on that run."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import sqlite3
import statistics
from pathlib import Path
from typing import Any

from simulate_model import Costs, SimConfig, simulate, workload_from_store

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
