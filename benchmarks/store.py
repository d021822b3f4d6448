"""Trajectory store against JSONL: ingest rate, reward-curve query time and its peak memory.

From one run it prints: steps/s committed to the store against the same records written as JSONL
(one trajectory per line with its steps nested, as peer systems dump rollouts); a reward-curve
query over all steps (DuckDB over the store) against pandas over the JSONL; and the peak resident
memory of each query process. Both writers get the same in-memory Python records (episodes with
their steps nested), generated in batches of shards outside the timed sections. The store commits
them three ways, each into its own store: through a shard writer (`TrajectoryStore.shard_writer`,
what a caller committing shards in sequence uses; its thread commits the shards queued meanwhile
as one group while the caller converts the next ones, and the clock stops only once every shard
of the batch is committed), one `commit_iteration_shard` call after another, and as Arrow tables
through a shard writer (built outside the clock). A store shard is complete once both tables are
committed, exactly once; neither side syncs to disk.

    python benchmarks/store.py                 # 10 million steps (a few minutes, a few GB of disk)
    python benchmarks/store.py --steps 400000  # a quick check

Last, it compacts the store (one steps file per iteration instead of one per shard) and prints
what that took, the query time after it, and what committing one more shard costs before and
after.

Targets (issue 4): ingest >= 3x JSONL; query < 1 s and >= 20x faster than pandas; peak <= 1 GB.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

import pyarrow as pa  # noqa: E402

from storage import TrajectoryStore, episode_id_for  # noqa: E402

RUN_ID = "bench"
# Shards committed one at a time before and after compaction, to compare what a commit costs.
EXTRA_COMMITS = 8
OUTPUT_LINES = [
    "collected 12 items",
    "tests/test_parser.py::test_round_trip PASSED",
    "FAILED tests/test_parser.py::test_unicode - AssertionError: assert 'é' == 'e'",
    'Traceback (most recent call last):\n  File "src/parser.py", line 42, in parse',
    "$ ls -la src/\ntotal 24\n-rw-r--r-- 1 agent agent 1834 parser.py",
    "patch applied: 1 file changed, 3 insertions(+), 1 deletion(-)",
]
ACTIONS = ("run", "read", "edit", "submit")

# The store's query: the reward curve per iteration plus step-level figures, so it scans all steps.
STORE_QUERY = """
WITH s AS (
    SELECT iteration, count(*) AS steps, avg(duration_s) AS mean_step_s,
           avg(CASE WHEN exit_code <> 0 THEN 1.0 ELSE 0.0 END) AS nonzero_exit_rate
    FROM steps GROUP BY iteration
), e AS (
    SELECT iteration, count(*) AS episodes, avg(reward) AS mean_reward,
           avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
           quantile_cont(reward, 0.5) AS reward_p50
    FROM episodes GROUP BY iteration
)
SELECT * FROM e JOIN s USING (iteration) ORDER BY iteration
"""

# The query process's own peak resident memory. Not `ru_maxrss`: Linux carries the parent's
# resident size at the spawn over into the child's, so it would count the benchmark's own memory.
PEAK_FUNCTION = """
import resource

def peak_bytes():
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

# Imports happen before the clock starts, as in a notebook; the clock covers opening the tables.
QUERY_STORE_SCRIPT = (
    PEAK_FUNCTION
    + """
import sys, time
import duckdb
sys.path.insert(0, sys.argv[2])
from storage import TrajectoryStore
start = time.perf_counter()
table = TrajectoryStore(sys.argv[1], create=False).query(sys.argv[3])
elapsed = time.perf_counter() - start
print(elapsed, peak_bytes(), table.num_rows)
"""
)

# What a peer does with its JSONL dump: pandas, chunked so the machine does not run out of memory.
QUERY_PANDAS_SCRIPT = (
    PEAK_FUNCTION
    + """
import sys, time
import pandas as pd
start = time.perf_counter()
parts = []
for chunk in pd.read_json(sys.argv[1], lines=True, chunksize=20000):
    steps = chunk["steps"].explode().dropna()
    step_frame = pd.DataFrame(steps.tolist(), index=steps.index)
    step_frame["iteration"] = chunk.loc[step_frame.index, "iteration"].to_numpy()
    parts.append(pd.DataFrame({
        "iteration": chunk["iteration"], "reward": chunk["reward"], "passed": chunk["passed"],
    }).assign(kind="episode"))
    parts.append(pd.DataFrame({
        "iteration": step_frame["iteration"], "duration_s": step_frame["duration_s"],
        "nonzero": (step_frame["exit_code"] != 0).astype(float),
    }).assign(kind="step"))
frame = pd.concat(parts, ignore_index=True)
episodes = frame[frame.kind == "episode"].groupby("iteration").agg(
    episodes=("reward", "size"), mean_reward=("reward", "mean"),
    pass_rate=("passed", "mean"), reward_p50=("reward", "median"))
steps = frame[frame.kind == "step"].groupby("iteration").agg(
    steps=("duration_s", "size"), mean_step_s=("duration_s", "mean"),
    nonzero_exit_rate=("nonzero", "mean"))
result = episodes.join(steps)
elapsed = time.perf_counter() - start
print(elapsed, peak_bytes(), len(result))
"""
)


def make_shard_records(
    iteration: int, shard: int, n_episodes: int, steps_per_episode: int, rng: random.Random
) -> list[dict[str, Any]]:
    """Episodes as a rollout loop produces them: dicts with their steps nested under "steps"."""
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(hours=iteration)
    episodes = []
    for index in range(n_episodes):
        sample = shard * n_episodes + index
        task_id = f"task-{sample % 97}"
        episode_id = episode_id_for(RUN_ID, iteration, task_id, shard, sample)
        n_steps = steps_per_episode
        reward = float(rng.random() < 0.3 + 0.01 * iteration)
        steps = [
            {
                "episode_id": episode_id,
                "step": step,
                "action_kind": ACTIONS[step % 4],
                "action_text": f"pytest -q tests/test_parser.py -k case_{step}",
                "observation": OUTPUT_LINES[(sample + step) % len(OUTPUT_LINES)],
                "exit_code": int((sample + step) % 3 == 0),
                "duration_s": rng.random(),
            }
            for step in range(n_steps)
        ]
        episodes.append(
            {
                "episode_id": episode_id,
                "run_id": RUN_ID,
                "iteration": iteration,
                "task_id": task_id,
                "task_version": "v1",
                "group_index": shard,
                "sample_index": sample,
                "policy_version": f"p{iteration}",
                "snapshot_digest": "sha256:4f1c",
                "sandbox_backend": "bwrap",
                "reward": reward,
                "passed": reward == 1.0,
                "status": "ok",
                "flags": [],
                "terminated": True,
                "n_steps": n_steps,
                "started_at": start,
                "finished_at": start + timedelta(seconds=3),
                "sandbox_s": 2.5,
                "worker": f"worker-{shard % 4}",
                "steps": steps,
            }
        )
    return episodes


# (iteration, shard, episodes) or (iteration, shard, episodes, steps)
Shard = tuple[Any, ...]


def commit_pipelined(store: TrajectoryStore, batch: list[Shard]) -> float:
    """Seconds to commit `batch` through a shard writer, until every shard is committed."""
    start = time.perf_counter()
    with store.shard_writer() as writer:
        for iteration, shard, episodes, *steps in batch:
            writer.submit(
                RUN_ID, iteration, shard, episodes=episodes, steps=steps[0] if steps else ()
            )
    return time.perf_counter() - start


def commit_one_at_a_time(store: TrajectoryStore, batch: list[Shard]) -> float:
    """Seconds to commit `batch` with one `commit_iteration_shard` call after another."""
    start = time.perf_counter()
    for iteration, shard, episodes in batch:
        store.commit_iteration_shard(RUN_ID, iteration, shard, episodes=episodes)
    return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000_000, help="total steps to write")
    parser.add_argument("--steps-per-episode", type=int, default=20)
    parser.add_argument("--episodes-per-shard", type=int, default=1024)
    parser.add_argument("--shards-per-iteration", type=int, default=4)
    parser.add_argument(
        "--batch-shards",
        type=int,
        default=16,
        help="shards generated, then timed, together (the shard writer is flushed per batch)",
    )
    parser.add_argument("--workdir", type=Path, help="where to write (default: a temporary dir)")
    args = parser.parse_args()

    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="rollyard-bench-"))
    workdir.mkdir(parents=True, exist_ok=True)
    store_root, jsonl_path = workdir / "store", workdir / "rollouts.jsonl"
    sync_root, columnar_root = workdir / "store-one-at-a-time", workdir / "store-columnar"
    for root in (store_root, sync_root, columnar_root):
        shutil.rmtree(root, ignore_errors=True)
    store, sync_store = TrajectoryStore(store_root), TrajectoryStore(sync_root)
    columnar_store = TrajectoryStore(columnar_root)
    steps_per_shard = args.episodes_per_shard * args.steps_per_episode
    n_shards = max(1, args.steps // steps_per_shard)
    rng = random.Random(0)
    store_s = sync_s = columnar_s = jsonl_s = 0.0
    total_steps = 0
    with jsonl_path.open("w") as jsonl:
        for first in range(0, n_shards, args.batch_shards):
            batch = []
            for index in range(first, min(first + args.batch_shards, n_shards)):
                iteration, shard = divmod(index, args.shards_per_iteration)
                records = make_shard_records(
                    iteration, shard, args.episodes_per_shard, args.steps_per_episode, rng
                )
                total_steps += sum(len(r["steps"]) for r in records)
                batch.append((iteration, shard, records))

            start = time.perf_counter()
            for _, _, records in batch:
                for record in records:
                    jsonl.write(json.dumps(record, default=str))
                    jsonl.write("\n")
            jsonl.flush()
            jsonl_s += time.perf_counter() - start

            # The very records the JSONL writer dumped (episodes with their steps nested),
            # committed through a shard writer (shard N's commits overlap converting shard N+1;
            # the clock stops once every shard of the batch is committed), and one
            # `commit_iteration_shard` call after another; which goes first alternates by batch.
            if (first // args.batch_shards) % 2 == 0:
                store_s += commit_pipelined(store, batch)
                sync_s += commit_one_at_a_time(sync_store, batch)
            else:
                sync_s += commit_one_at_a_time(sync_store, batch)
                store_s += commit_pipelined(store, batch)

            # The same shards handed over as Arrow tables, as a rollout loop that buffers columns
            # would; building them stays outside the clock.
            tables = []
            for iteration, shard, records in batch:
                episodes = [{k: v for k, v in r.items() if k != "steps"} for r in records]
                step_rows = [step for r in records for step in r["steps"]]
                tables.append(
                    (
                        iteration,
                        shard,
                        pa.Table.from_pylist(episodes),
                        pa.Table.from_pylist(step_rows),
                    )
                )
            columnar_s += commit_pipelined(columnar_store, tables)

    # The query processes' peaks are their own, but free the records before starting them.
    del batch, tables
    store_rate, jsonl_rate = total_steps / store_s, total_steps / jsonl_s
    columnar_rate, sync_rate = total_steps / columnar_s, total_steps / sync_s
    store_mb = sum(p.stat().st_size for p in store_root.rglob("*") if p.is_file()) / 1e6
    print(f"steps: {total_steps:,} in {n_shards} shard commits of {steps_per_shard:,} steps")
    print(
        f"ingest  store {store_rate:>12,.0f} steps/s ({store_s:.1f} s, {store_mb:,.0f} MB)   "
        f"jsonl {jsonl_rate:>12,.0f} steps/s ({jsonl_s:.1f} s, "
        f"{jsonl_path.stat().st_size / 1e6:,.0f} MB)   ratio {store_rate / jsonl_rate:.1f}x"
    )
    print(
        f"ingest  store one commit_iteration_shard at a time {sync_rate:>12,.0f} steps/s "
        f"({sync_s:.1f} s)   ratio to jsonl {sync_rate / jsonl_rate:.1f}x"
    )
    print(
        f"ingest  store from Arrow tables {columnar_rate:>12,.0f} steps/s ({columnar_s:.1f} s)   "
        f"ratio to jsonl {columnar_rate / jsonl_rate:.1f}x"
    )

    def run(script: str, *argv: str) -> tuple[float, int]:
        output = subprocess.run(
            [sys.executable, "-c", script, *argv], check=True, capture_output=True, text=True
        ).stdout.split()
        return float(output[0]), int(output[1])

    query_s, query_peak = min(
        (run(QUERY_STORE_SCRIPT, str(store_root), str(REPO_ROOT), STORE_QUERY) for _ in range(3)),
        key=lambda result: result[0],
    )
    pandas_s, pandas_peak = run(QUERY_PANDAS_SCRIPT, str(jsonl_path))
    print(
        f"query   store {query_s:.3f} s (peak {query_peak / 2**20:,.0f} MiB)   "
        f"pandas over jsonl {pandas_s:.1f} s (peak {pandas_peak / 2**20:,.0f} MiB)   "
        f"ratio {pandas_s / query_s:.0f}x"
    )

    # Compaction (`TrajectoryStore.compact`): one steps file per iteration instead of one per
    # shard. What it costs, and what it changes for the query and for the next shard commits
    # (Delta's per-commit cost grows with the number of live files).
    next_iteration = n_shards // args.shards_per_iteration + 1
    extra = [
        make_shard_records(
            next_iteration + index, 0, args.episodes_per_shard, args.steps_per_episode, rng
        )
        for index in range(2 * EXTRA_COMMITS)
    ]

    def commit_ms(records: list[list[dict[str, Any]]]) -> float:
        times = []
        for episodes in records:
            started = time.perf_counter()
            TrajectoryStore(store_root).commit_iteration_shard(
                RUN_ID, episodes[0]["iteration"], 0, episodes=episodes
            )
            times.append(time.perf_counter() - started)
        return statistics.median(times) * 1000

    before_ms = commit_ms(extra[:EXTRA_COMMITS])
    started = time.perf_counter()
    compacted = TrajectoryStore(store_root).compact()
    compact_s = time.perf_counter() - started
    after_ms = commit_ms(extra[EXTRA_COMMITS:])
    compacted_s, compacted_peak = min(
        (run(QUERY_STORE_SCRIPT, str(store_root), str(REPO_ROOT), STORE_QUERY) for _ in range(3)),
        key=lambda result: result[0],
    )
    print(
        f"compact {compacted.files_before:,} steps files -> {compacted.files_after:,} "
        f"({compacted.rows:,} rows) in {compact_s:.1f} s; query after {compacted_s:.3f} s "
        f"(peak {compacted_peak / 2**20:,.0f} MiB); one shard commit, median of "
        f"{EXTRA_COMMITS}: {before_ms:.0f} ms before, {after_ms:.0f} ms after"
    )
    shutil.rmtree(columnar_root, ignore_errors=True)
    shutil.rmtree(sync_root, ignore_errors=True)
    if args.workdir is None:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
