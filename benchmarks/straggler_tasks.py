"""A task mix with stragglers: demo tasks where some tasks' test suites take much longer, so
episode durations spread by 10x or more (what async and streaming rollouts must absorb).

    python benchmarks/straggler_tasks.py --out DIR [--count 24] [--seed 0]

Each task is a generated demo task plus one extra test file, `tests/test_workload.py`, whose
test sleeps for the task's tier's delay and is listed in `pass_to_pass`: every test run the
agent makes and the verifier's run pay it, as a suite with a slow integration test would.
Sleeping, not computing, keeps the mix's durations the same on a loaded machine (and models an
agent waiting on a model server or a slow service rather than burning the sandbox's CPU quota).
Tiers are drawn per task from `TIERS` with a seeded generator; the task id records the tier.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
import tomllib
from pathlib import Path

import tomli_w

TIERS = {"fast": (0.0, 0.6), "slow": (4.0, 0.25), "straggler": (40.0, 0.15)}
"""tier: (seconds a test run sleeps, share of tasks). An episode of the built-in policy at
`--max-steps 4` runs the suite about twice (once or twice as the agent, once to verify): the
fast tier's episodes take 3-20 s (idle to heavily loaded 2-core machine), the straggler tier's
at least 80 s more. A test run stays under the sandbox's 60 s command limit."""

WORKLOAD_TEST = '''"""A slow part of the suite: an integration test that waits on something."""

import time


def test_workload():
    time.sleep({delay_s})
'''


def tier_for(rng: random.Random) -> str:
    names = list(TIERS)
    return rng.choices(names, weights=[TIERS[n][1] for n in names])[0]


def add_workload(task_dir: Path, tier: str) -> None:
    """Give the task a sleeping pass-to-pass test and rename it after its tier."""
    delay_s = TIERS[tier][0]
    manifest_path = task_dir / "task.toml"
    manifest = tomllib.loads(manifest_path.read_text())
    rollyard = manifest["metadata"]["rollyard"]  # Harbor keeps tool tables under metadata
    workspace = task_dir / rollyard.get("workspace_dir", "environment/workspace")
    (workspace / "tests" / "test_workload.py").write_text(WORKLOAD_TEST.format(delay_s=delay_s))
    rollyard["pass_to_pass"] = [*rollyard["pass_to_pass"], "tests/test_workload.py::test_workload"]
    rollyard["id"] = f"{rollyard['id'].replace('demo-', 'straggler-', 1)}-{tier}"
    rollyard["source"] = f"{rollyard['source']}; straggler mix tier {tier} ({delay_s:g} s a run)"
    manifest_path.write_text(tomli_w.dumps(manifest))


def generate_straggler_tasks(out_dir: Path, count: int, seed: int) -> dict[str, list[str]]:
    """Write `count` tasks under `out_dir`; returns task ids by tier."""
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    if out_dir.exists() and any(out_dir.iterdir()):
        raise SystemExit(f"error: {out_dir} is not empty; give a new directory with --out")
    staging = out_dir / ".staging"
    rng = random.Random(seed)
    by_tier: dict[str, list[str]] = {tier: [] for tier in TIERS}
    try:
        for task_dir in generate_demo_tasks(staging, count, seed=seed, difficulty="easy"):
            tier = tier_for(rng)
            add_workload(task_dir, tier)
            task_id = tomllib.loads((task_dir / "task.toml").read_text())["metadata"]["rollyard"][
                "id"
            ]
            task_dir.rename(out_dir / task_id)
            by_tier[tier].append(task_id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return by_tier


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--count", type=int, default=24)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.count < 1:
        raise SystemExit(f"error: --count must be at least 1, got {args.count}")
    args.out.mkdir(parents=True, exist_ok=True)
    by_tier = generate_straggler_tasks(args.out, args.count, args.seed)
    for tier, ids in by_tier.items():
        print(f"{tier:9s} {TIERS[tier][0]:4.1f} s a test run: {len(ids)} tasks")
    return 0


if __name__ == "__main__":
    sys.exit(main())
