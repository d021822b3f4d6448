"""Fault-injection benchmark: many episodes through the real train flow (Prefect + Dask + bwrap
+ store) while sandboxes are SIGKILLed, hang and are OOM-killed, workers die and the flow itself
is killed and resumed. Prints the accounting: every scheduled episode must be committed exactly
once, none lost, none duplicated, infra failures labelled and never scored.

    python benchmarks/faults.py                      # 1,000 episodes at 10% faults
    python benchmarks/faults.py --episodes 80 --flow-kills 1
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TASKS_PER_ITERATION = 10
GROUP_SIZE = 4


def fault_plan(rate: float, marker_dir: Path, seed: int):  # type: ignore[no-untyped-def]
    from training.recovery import FaultPlan

    # Split the total rate over the kinds of faults.
    return FaultPlan(
        sandbox_kill=rate * 0.3,
        hang=rate * 0.2,
        oom=rate * 0.2,
        worker_kill=rate * 0.3,
        seed=seed,
        marker_dir=str(marker_dir),
    )


def settings_for(args: argparse.Namespace, workdir: Path, resume: bool):  # type: ignore[no-untyped-def]
    from flows.train_settings import TrainSettings

    return TrainSettings(
        tasks_dir=str(workdir / "tasks"),
        store=str(workdir / "store"),
        run_id="faults",
        iterations=args.episodes // (TASKS_PER_ITERATION * GROUP_SIZE),
        tasks_per_iteration=TASKS_PER_ITERATION,
        group_size=GROUP_SIZE,
        shards_per_iteration=4,
        max_steps=args.max_steps,
        seed=args.seed,
        resume=resume,
        faults=fault_plan(args.fault_rate, workdir / "markers", args.seed),
        max_attempts=3,
    )


def child(args: argparse.Namespace) -> int:
    """One flow run (killed or not by the parent)."""
    from flows.train import run_training

    workdir = Path(args.workdir)
    run_training(settings_for(args, workdir, resume=True), dask_address=args.dask_address)
    return 0


def accounting(store_root: Path, iterations: int) -> dict[str, object]:
    from storage import TrajectoryStore

    store = TrajectoryStore(str(store_root))
    rows = store.query(
        "SELECT iteration, group_index, sample_index, count(*) AS n FROM episodes "
        "WHERE run_id = 'faults' GROUP BY ALL"
    ).to_pylist()
    scheduled = {
        (i, g, s)
        for i in range(iterations)
        for g in range(TASKS_PER_ITERATION)
        for s in range(GROUP_SIZE)
    }
    committed = {(r["iteration"], r["group_index"], r["sample_index"]) for r in rows}
    statuses = store.query(
        "SELECT status, count(*) AS n, count(reward) AS with_reward, "
        "sum(CASE WHEN attempt > 0 THEN 1 ELSE 0 END) AS recovered_after_retry "
        "FROM episodes WHERE run_id = 'faults' GROUP BY status ORDER BY status"
    ).to_pylist()
    return {
        "scheduled": len(scheduled),
        "committed": sum(r["n"] for r in rows),
        "missing": len(scheduled - committed),
        "duplicated": sum(r["n"] - 1 for r in rows if r["n"] > 1),
        "unexpected": len(committed - scheduled),
        "statuses": statuses,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--fault-rate", type=float, default=0.10)
    parser.add_argument("--flow-kills", type=int, default=2)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--dask-address", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(args)

    import dask
    from distributed import LocalCluster

    from flows.runtime import local_cluster_kwargs, prefect_api
    from flows.train import WORKER_DEATHS_PER_SHARD
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rollyard-faults-"))
    iterations = args.episodes // (TASKS_PER_ITERATION * GROUP_SIZE)
    if iterations < 1:
        parser.error(f"--episodes must be at least {TASKS_PER_ITERATION * GROUP_SIZE}")
    if not (workdir / "tasks").is_dir():
        # Easy tasks: the fewest tests per verification, so the run measures recovery, not pytest.
        generate_demo_tasks(
            workdir / "tasks", 2 * TASKS_PER_ITERATION, seed=args.seed, difficulty="easy"
        )
    started = time.monotonic()
    kills_done = 0
    rng = random.Random(args.seed)
    dask.config.set({"distributed.scheduler.allowed-failures": WORKER_DEATHS_PER_SHARD})
    with (
        prefect_api(workdir / "prefect") as api_url,
        LocalCluster(**local_cluster_kwargs(args.workers)) as cluster,
    ):
        env = {**os.environ, "PREFECT_API_URL": api_url}
        while True:
            command = [
                sys.executable,
                __file__,
                "--child",
                "--workdir",
                str(workdir),
                "--dask-address",
                cluster.scheduler_address,
                "--episodes",
                str(args.episodes),
                "--fault-rate",
                str(args.fault_rate),
                "--max-steps",
                str(args.max_steps),
                "--seed",
                str(args.seed),
            ]
            flow = subprocess.Popen(
                command,
                env=env,
                start_new_session=True,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            if kills_done < args.flow_kills:
                # Kill the flow at a random point of its run, as a lost flow host would be.
                wait_s = rng.uniform(20, 60)
                try:
                    flow.wait(timeout=wait_s)
                except subprocess.TimeoutExpired:
                    os.killpg(flow.pid, signal.SIGKILL)
                    flow.wait()
                    kills_done += 1
                    print(f"flow killed after {wait_s:.0f} s (kill {kills_done})", flush=True)
                    continue
            if flow.wait() == 0:
                break
            print(f"flow run exited with {flow.returncode}; resuming", flush=True)
    wall_s = time.monotonic() - started
    report = accounting(workdir / "store", iterations)
    markers = len(list((workdir / "markers").glob("*"))) if (workdir / "markers").is_dir() else 0
    print(
        f"\nfault-injection accounting ({args.episodes} episodes, {args.fault_rate:.0%} faults, "
        f"{kills_done} flow kills, {markers} worker kills, {wall_s:.0f} s):"
    )
    for key in ("scheduled", "committed", "missing", "duplicated", "unexpected"):
        print(f"  {key:>12}: {report[key]}")
    print("  by final status (count, with a reward, recovered after a retry):")
    for row in report["statuses"]:  # type: ignore[attr-defined]
        print(
            f"    {row['status']:>14}: {int(row['n']):5d}  {int(row['with_reward']):5d}  "
            f"{int(row['recovered_after_retry']):5d}"
        )
    infra_scored = sum(
        r["with_reward"]
        for r in report["statuses"]  # type: ignore[attr-defined]
        if r["status"] in ("infra_error", "verifier_error", "task_error")
    )
    ok = (
        report["missing"] == 0
        and report["duplicated"] == 0
        and report["unexpected"] == 0
        and report["committed"] == report["scheduled"]
        and infra_scored == 0
    )
    print(
        f"\n{'PASS' if ok else 'FAIL'}: every scheduled episode accounted for exactly once; "
        f"infra failures carry no reward ({infra_scored} scored)"
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
