"""Orchestration overhead: episodes/s through the train flow (Prefect + Dask + store commits +
quality gate + update + checkpoint) against a bare loop running the same shard function in a
process pool, from one run on the same tasks, and the effect of longest-first scheduling on a
mix of long and short tasks.

    python benchmarks/orchestration.py [--iterations 3] [--workers 2]

Target: flow / bare >= 0.85. Start-up (Prefect server, worker processes and their imports) is
paid before timing on both sides; everything per iteration is timed.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

TASKS_PER_ITERATION = 8
GROUP_SIZE = 4
SHARDS = 4
RUN_ID = "bench"
"""Every compared run uses one run id (in its own store): episode ids, and so the sampled
actions, are then the same on both sides."""


def _warm_worker() -> int:
    import training.rollout  # noqa: F401  (imports torch, tasks_lib, storage)

    return os.getpid()


def _bare_shard(request, store_root: str):  # type: ignore[no-untyped-def]
    from training.rollout import rollout_shard_and_commit

    return rollout_shard_and_commit(request, store_root).trajectories


def bare_loop(
    task_dirs: list[Path], store: Path, iterations: int, workers: int, max_steps: int
) -> float:
    """Episodes/s of a plain process pool over the same shards, with the same GRPO update
    between iterations (so both sides run the same episodes), no Prefect, Dask or gate."""
    from training.builtin.grpo import GRPOConfig, GRPOTrainer
    from training.builtin.scorer_policy import CandidateScorerPolicy
    from training.episode import EpisodeConfig
    from training.rollout import plan_iteration

    trainer = GRPOTrainer(CandidateScorerPolicy(seed=0), GRPOConfig(seed=0))
    with concurrent.futures.ProcessPoolExecutor(workers) as pool:
        for future in [pool.submit(_warm_worker) for _ in range(workers * 2)]:
            future.result()
        started = time.monotonic()
        episodes = 0
        for iteration in range(iterations):
            requests = plan_iteration(
                task_dirs,
                run_id=RUN_ID,
                iteration=iteration,
                policy=trainer.policy,
                tasks_per_iteration=TASKS_PER_ITERATION,
                group_size=GROUP_SIZE,
                shard_count=SHARDS,
                episode_config=EpisodeConfig(max_steps=max_steps),
                schedule="round_robin",
            )
            outcomes = list(pool.map(_bare_shard, requests, [str(store)] * len(requests)))
            trajectories = [t for outcome in outcomes for t in outcome]
            episodes += len(trajectories)
            trainer.update(trajectories)
        return episodes / (time.monotonic() - started)


def flow_run(
    task_dirs_root: Path,
    store: Path,
    iterations: int,
    address: str,
    max_steps: int,
    schedule: str,
    run_id: str,
) -> tuple[float, list[float]]:
    from flows.train import run_training
    from flows.train_settings import TrainSettings

    settings = TrainSettings(
        tasks_dir=str(task_dirs_root),
        store=str(store),
        run_id=run_id,
        iterations=iterations,
        tasks_per_iteration=TASKS_PER_ITERATION,
        group_size=GROUP_SIZE,
        shards_per_iteration=SHARDS,
        max_steps=max_steps,
        schedule=schedule,
    )
    started = time.monotonic()
    summaries = run_training(settings, dask_address=address)
    wall = time.monotonic() - started
    return sum(s.episodes for s in summaries) / wall, [s.wall_s for s in summaries]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--iterations", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()

    from distributed import Client, LocalCluster

    from flows.runtime import local_cluster_kwargs, prefect_api
    from tasks_lib import generate_demo_tasks
    from tasks_lib.format import tasks_in

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rollyard-orchestration-"))
    tasks_root = workdir / "tasks"
    if not tasks_root.is_dir():
        # A mix of short (easy) and long (hard) tasks, for the scheduling comparison too.
        generate_demo_tasks(
            tasks_root, 2 * TASKS_PER_ITERATION, seed=3, difficulty={"easy": 1, "hard": 1}
        )
    task_dirs = tasks_in(tasks_root)

    bare_eps = bare_loop(
        task_dirs, workdir / "bare-store", args.iterations, args.workers, args.max_steps
    )
    print(f"bare process pool: {bare_eps:.3f} episodes/s", flush=True)

    with (
        prefect_api(workdir / "prefect"),
        LocalCluster(**local_cluster_kwargs(args.workers)) as cluster,
        Client(cluster) as client,
    ):
        client.run(_warm_worker)
        address = cluster.scheduler_address
        # Warm the flow path once (GX import for the gate, Prefect client) outside the timing.
        flow_run(tasks_root, workdir / "warm-store", 1, address, 1, "round_robin", "warm")
        flow_eps, _ = flow_run(
            tasks_root,
            workdir / "flow-store",
            args.iterations,
            address,
            args.max_steps,
            "round_robin",
            RUN_ID,
        )
        print(f"train flow:        {flow_eps:.3f} episodes/s", flush=True)
        # Scheduling: the same episodes twice, each from a copy of that store, so longest-first
        # predicts durations from the same history and both runs do identical work.
        walls = {}
        for schedule in ("round_robin", "longest_first"):
            store = workdir / f"{schedule}-store"
            shutil.copytree(workdir / "flow-store", store, dirs_exist_ok=True)
            _, walls[schedule] = flow_run(
                tasks_root, store, args.iterations, address, args.max_steps, schedule, "schedule"
            )
        rr_walls, lpt_walls = walls["round_robin"], walls["longest_first"]

    ratio = flow_eps / bare_eps
    print(f"\nflow / bare = {ratio:.2f}  (target >= 0.85: {'PASS' if ratio >= 0.85 else 'FAIL'})")
    rr, lpt = sum(rr_walls), sum(lpt_walls)
    print(
        f"iteration wall, round robin:   {', '.join(f'{w:.1f}' for w in rr_walls)} s "
        f"(total {rr:.1f})"
    )
    print(
        f"iteration wall, longest first: {', '.join(f'{w:.1f}' for w in lpt_walls)} s "
        f"(total {lpt:.1f})"
    )
    print(f"longest-first / round-robin = {lpt / rr:.2f} (below 1 is faster)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
