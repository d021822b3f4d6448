"""Iteration-gate overhead against the iteration's rollout time, for 10,000-episode batches.

Gate: `gate_iteration` on a committed 10,000-episode iteration (reads the batch from the store,
builds the frames, runs both GX suites, reads the drift reference, writes the gates table), with a
previous iteration as the drift reference; median of `--rounds`. GX's one-off import is reported
apart (a worker pays it once). Rollout: real episodes of the built-in policy on demo tasks (bwrap
sandboxes, the real verifier), mean wall time per episode, scaled to 10,000 episodes over
`--workers` parallel workers. Target: gate <= 5% of rollout.

    python benchmarks/gates.py [--episodes 10000] [--rounds 3] [--sample-episodes 8] [--workers 2]
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from storage import TrajectoryStore, episode_id_for


def batch(run_id: str, iteration: int, episodes: int, group_size: int = 8) -> list[dict[str, Any]]:
    rng = random.Random(iteration)
    rows = []
    for index in range(episodes):
        group, sample = divmod(index, group_size)
        status = "infra_error" if rng.random() < 0.01 else "ok"
        reward = None if status != "ok" else float(rng.random() < 0.4)
        rows.append(
            {
                "episode_id": episode_id_for(run_id, iteration, f"task-{group}", group, sample),
                "run_id": run_id,
                "iteration": iteration,
                "task_id": f"task-{group}",
                "task_version": "1",
                "group_index": group,
                "sample_index": sample,
                "policy_version": f"p{iteration}",
                "snapshot_digest": "sha256:x",
                "sandbox_backend": "bwrap",
                "reward": reward,
                "status": status,
                "passed": None if reward is None else reward == 1.0,
                "flags": ["missing_tests:-"] if rng.random() < 0.05 else [],
                "terminated": True,
                "n_steps": rng.randint(1, 12),
                "wall_s": rng.uniform(0.5, 9.0),
            }
        )
    return rows


def rollout_seconds_per_episode(samples: int, root: Path) -> float:
    from sandboxes import open_sandbox
    from tasks_lib import generate_demo_tasks, load_task
    from training import CandidateScorerPolicy, EpisodeConfig, EpisodeKey, run_episode

    tasks = [load_task(p) for p in generate_demo_tasks(root / "tasks", 2, seed=0)]
    policy = CandidateScorerPolicy(seed=0)
    walls = []
    for index in range(samples):
        task = tasks[index % len(tasks)]
        started = time.monotonic()
        with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
            run_episode(
                task,
                policy,
                sandbox,
                key=EpisodeKey("bench", 0, sample_index=index),
                config=EpisodeConfig(max_steps=8),
            )
        walls.append(time.monotonic() - started)
    return statistics.mean(walls)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sample-episodes", type=int, default=8)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    started = time.monotonic()
    import great_expectations  # noqa: F401 - timing the one-off import

    import_s = time.monotonic() - started
    from storage.gates import gate_iteration

    with tempfile.TemporaryDirectory(prefix="rollyard-bench-gates-", dir="/var/tmp") as tmp:
        root = Path(tmp)
        root.chmod(0o755)
        store = TrajectoryStore(root / "store")
        for iteration in (0, 1):
            rows = batch("bench", iteration, args.episodes)
            for shard in range(8):
                store.commit_iteration_shard("bench", iteration, shard, episodes=rows[shard::8])
        gate_iteration(store, "bench", 0)
        gate_s = []
        for _ in range(args.rounds):
            t0 = time.monotonic()
            report = gate_iteration(store, "bench", 1)
            gate_s.append(time.monotonic() - t0)
        per_episode_s = rollout_seconds_per_episode(args.sample_episodes, root)
    gate = statistics.median(gate_s)
    rollout = per_episode_s * args.episodes / args.workers
    print(f"GX import (once per process): {import_s:.2f} s")
    print(
        f"gate on {args.episodes} episodes: median {gate:.2f} s "
        f"(runs {', '.join(f'{s:.2f}' for s in gate_s)}); passed={report.passed}, "
        f"{len(report.results)} expectations"
    )
    print(
        f"rollout: {per_episode_s:.2f} s per episode (mean of {args.sample_episodes}) x "
        f"{args.episodes} / {args.workers} workers = {rollout:.0f} s"
    )
    ratio = gate / rollout
    print(f"gate / rollout = {ratio:.4%}  (target <= 5%: {'PASS' if ratio <= 0.05 else 'FAIL'})")
    with_import = (gate + import_s) / rollout
    print(f"including the GX import: {with_import:.4%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
