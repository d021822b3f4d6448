"""Trained samples per second, sync vs async vs streaming, through the train flow on the
straggler mix, with a trainer whose update takes about as long as a rollout iteration.

    python benchmarks/async.py [--iterations 4] [--workers 4] [--out benchmarks/figures/async.json]

One run: the three modes train on the same tasks with the same seed, one after another on one
Dask cluster and one Prefect server. The trainer is the built-in one plus a stated stand-in cost
(`TrainSettings.update_stand_in_s`): each update first waits for the wall time of one
synchronous rollout iteration, measured in this run's warm-up iteration, as an update on an
accelerator would take without using the rollout hosts' CPUs.

Trained samples are the episodes the trainer actually updated on: committed, in a step the gate
passed, within the staleness bound. Trainer idle is the share of the run's wall time the
trainer was not updating (updates x the stand-in cost, the built-in update itself taking
milliseconds). Target (issue 18): streaming >= 2x sync, trainer idle below 10%.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TASKS_PER_STEP = 4
GROUP_SIZE = 2
MAX_STEPS = 2
MAX_POLICY_LAG = 2
RUN_ID = "async-bench"
"""Every mode uses the same run id (in its own store), so its episodes draw the same seeds."""


def _settings(tasks: Path, store: Path, mode: str, iterations: int, stand_in_s: float) -> Any:
    from flows.train_settings import TrainSettings

    return TrainSettings(
        tasks_dir=str(tasks),
        store=str(store),
        run_id=RUN_ID,
        iterations=iterations,
        tasks_per_iteration=TASKS_PER_STEP,
        group_size=GROUP_SIZE,
        # one shard per group in every mode: what differs is only when the trainer consumes
        shards_per_iteration=TASKS_PER_STEP,
        max_concurrent_requests=GROUP_SIZE,
        max_steps=MAX_STEPS,
        schedule="round_robin",
        mode=mode,
        max_policy_lag=MAX_POLICY_LAG,
        update_stand_in_s=stand_in_s,
    )


def _trained_samples(store: Path) -> dict[str, float]:
    from storage import TrajectoryStore

    rows = (
        TrajectoryStore(str(store))
        .query(
            "SELECT name, sum(value) AS total FROM metrics WHERE run_id = ? AND source = "
            "'train_flow' GROUP BY name",
            [RUN_ID],
        )
        .to_pylist()
    )
    return {r["name"]: float(r["total"]) for r in rows}


def step_end_times(store: Path) -> list[float]:
    """When each step's metrics were recorded (epoch seconds), in step order: a step ends
    there, after its commit, gate, update and checkpoint."""
    from storage import TrajectoryStore

    rows = (
        TrajectoryStore(str(store))
        .query(
            "SELECT iteration, epoch(max(recorded_at)) AS ended FROM metrics WHERE run_id = ? "
            "AND source = 'train_flow' GROUP BY iteration ORDER BY iteration",
            [RUN_ID],
        )
        .to_pylist()
    )
    return [float(r["ended"]) for r in rows]


BREAKDOWN_METRICS = ("stream_wait_s", "commit_s", "gate_s", "trainer_wait_s", "update_s")
"""Per-step seconds the flow records where the trainer's time goes (the streaming mode records
all of them; the others the gate and the update)."""


def step_breakdown(store: Path) -> list[dict[str, float]]:
    """Per step, in step order, the seconds of `BREAKDOWN_METRICS` the store recorded: the wait
    for a full batch, its commit, its gate, the trainer's wait between updates, the update."""
    from storage import TrajectoryStore

    rows = (
        TrajectoryStore(str(store))
        .query(
            "SELECT iteration, name, value FROM metrics WHERE run_id = ? AND source = "
            "'train_flow' AND list_contains(?, name) ORDER BY iteration",
            [RUN_ID, list(BREAKDOWN_METRICS)],
        )
        .to_pylist()
    )
    steps: dict[int, dict[str, float]] = {}
    for row in rows:
        steps.setdefault(int(row["iteration"]), {})[row["name"]] = round(float(row["value"]), 1)
    return [steps[i] for i in sorted(steps)]


def steady_state(
    trained_per_step: list[int], ends_s: list[float], stand_in_s: float
) -> dict[str, float | None]:
    """Trained samples per second and trainer idle from the end of the first step to the end
    of the last: what a long run converges to. The whole-run figures also carry the first
    batch's fill, which a run of few steps cannot amortize (streaming's wall is about
    fill + steps x update, sync's steps x (rollout + update))."""
    if len(ends_s) < 2 or len(trained_per_step) != len(ends_s):
        return {"steady_trained_samples_per_s": None, "steady_trainer_idle_share": None}
    interval_s = ends_s[-1] - ends_s[0]
    return {
        "steady_trained_samples_per_s": round(sum(trained_per_step[1:]) / interval_s, 4),
        "steady_trainer_idle_share": round(1 - (len(ends_s) - 1) * stand_in_s / interval_s, 3),
    }


def run_mode(
    tasks: Path, workdir: Path, mode: str, iterations: int, stand_in_s: float, address: str
) -> dict[str, Any]:
    from flows.train import run_training

    store = workdir / f"{mode}-store"
    started = time.monotonic()
    summaries = run_training(
        _settings(tasks, store, mode, iterations, stand_in_s), dask_address=address
    )
    wall_s = time.monotonic() - started
    totals = _trained_samples(store)
    trained_per_step = [
        0 if s.quarantined else s.episodes - s.infra_errors - s.stale_dropped for s in summaries
    ]
    trained = sum(trained_per_step)
    busy_s = len(summaries) * stand_in_s
    return {
        "mode": mode,
        "wall_s": round(wall_s, 1),
        "steps": len(summaries),
        "episodes_committed": sum(s.episodes for s in summaries),
        "trained_samples": trained,
        "trained_samples_per_s": round(trained / wall_s, 4),
        "stale_dropped": sum(s.stale_dropped for s in summaries),
        "quarantined_steps": sum(s.quarantined for s in summaries),
        "max_policy_lag": max(s.max_policy_lag for s in summaries),
        "trainer_idle_share": round(1 - busy_s / wall_s, 3),
        "step_walls_s": [round(s.wall_s, 1) for s in summaries],
        "trained_per_step": trained_per_step,
        "measured_update_s": round(totals.get("update_s", 0.0), 1) or None,
        **steady_state(trained_per_step, step_end_times(store), stand_in_s),
        "step_breakdown_s": step_breakdown(store),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--iterations", type=int, default=4)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--count", type=int, default=24, help="tasks in the straggler mix")
    parser.add_argument("--workdir", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args()
    if args.iterations < 1 or args.workers < 1:
        raise SystemExit("error: --iterations and --workers must be at least 1")

    from distributed import Client, LocalCluster

    sys.path.insert(0, str(Path(__file__).parent))
    from straggler_tasks import generate_straggler_tasks

    from flows.runtime import LocalPrefectServer, local_cluster_kwargs

    # The gate stays on with its thresholds, but the built-in policy's early groups often
    # all fail alike: a zero-variance share of 1 must not quarantine a step here (it
    # trains nothing either way), or the modes would differ by chance in what they train on.
    os.environ.setdefault("ROLLYARD_GATE_MAX_ZERO_VARIANCE_GROUP_SHARE", "1.0")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rollyard-async-"))
    tasks = workdir / "tasks"
    if not tasks.is_dir():
        tasks.mkdir(parents=True)
        generate_straggler_tasks(tasks, args.count, seed=0)

    results = []
    # A server of its own, given time: its start needs ~20 s of CPU (imports, migrations). Run
    # niced on a shared host, it would get a few % of a core next to jobs at nice 0, and every
    # Prefect call of the run waits on it: as root, it runs at nice 0 (see `niceness`).
    server = LocalPrefectServer(workdir / "prefect", niceness=0 if os.geteuid() == 0 else None)
    server.start(timeout_s=900)
    os.environ["PREFECT_API_URL"] = server.api_url  # the workers inherit it
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with (
        temporary_settings(updates={PREFECT_API_URL: server.api_url}),
        LocalCluster(**local_cluster_kwargs(args.workers)) as cluster,
        Client(cluster),
    ):
        address = str(cluster.scheduler_address)
        # Warm-up (imports, GX, the Prefect client) and the stand-in's measure: one synchronous
        # iteration's rollout wall on this mix.
        warm = run_mode(tasks, workdir / "warm", "sync", 1, 0.0, address)
        stand_in_s = round(warm["step_walls_s"][0], 1)
        print(f"stand-in update cost: {stand_in_s} s (one sync rollout iteration)", flush=True)
        for mode in ("sync", "async", "streaming"):
            result = run_mode(tasks, workdir, mode, args.iterations, stand_in_s, address)
            results.append(result)
            print(json.dumps(result), flush=True)
    server.stop()

    by_mode = {r["mode"]: r for r in results}
    speedups = {
        mode: round(
            by_mode[mode]["trained_samples_per_s"] / by_mode["sync"]["trained_samples_per_s"], 2
        )
        if by_mode["sync"]["trained_samples_per_s"]
        else None
        for mode in by_mode
    }
    figures = {
        "config": {
            "tasks": args.count,
            "tasks_per_step": TASKS_PER_STEP,
            "group_size": GROUP_SIZE,
            "max_steps": MAX_STEPS,
            "max_policy_lag": MAX_POLICY_LAG,
            "workers": args.workers,
            "iterations": args.iterations,
            "stand_in_update_s": stand_in_s,
        },
        "results": results,
        "speedup_vs_sync": speedups,
    }
    sync_steady = by_mode["sync"]["steady_trained_samples_per_s"]
    figures["steady_speedup_vs_sync"] = {
        mode: round(r["steady_trained_samples_per_s"] / sync_steady, 2)
        if sync_steady and r["steady_trained_samples_per_s"]
        else None
        for mode, r in by_mode.items()
    }
    print(json.dumps(figures["speedup_vs_sync"]), json.dumps(figures["steady_speedup_vs_sync"]))
    streaming = by_mode["streaming"]
    print(
        f"streaming / sync = {speedups['streaming']} (target >= 2), trainer idle "
        f"{streaming['trainer_idle_share']:.0%} (target < 10%)"
    )
    if args.out:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
