"""Does the built-in policy learn? GRPO on demo tasks, several seeds, figures for the README.

For each seed: generate demo tasks, split them into training and held-out tasks, train a fresh
`CandidateScorerPolicy` with GRPO for a few iterations on bwrap sandboxes with the real
verifier, and report

- the mean reward of the first iteration against the mean of the last three, and
- the pass rate on held-out tasks never trained on, trained policy against the untrained one.

    python benchmarks/learning.py --seeds 0 1 2

The defaults are the size of `rollyard demo` (8 iterations x 4 tasks x 6 samples, 6 steps,
easy tasks).

Library calls only (no Prefect, no Dask): the same episode function and trainer the flow runs.
"""

from __future__ import annotations

import argparse
import pickle
import random
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

from sandboxes import open_sandbox
from tasks_lib import generate_demo_tasks, load_task
from tasks_lib.model import Task
from training import (
    CandidateScorerPolicy,
    EpisodeConfig,
    EpisodeKey,
    GRPOConfig,
    GRPOTrainer,
    ScorerConfig,
    Trajectory,
    run_episode,
)


def run_group(
    task: Task,
    policy_bytes: bytes,
    *,
    run_id: str,
    iteration: int,
    group_index: int,
    group_size: int,
    config: EpisodeConfig,
) -> list[Trajectory]:
    """G samples of one task in one sandbox; the policy is a private copy for this thread."""
    policy: CandidateScorerPolicy = pickle.loads(policy_bytes)
    with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
        return [
            run_episode(
                task,
                policy,
                sandbox,
                key=EpisodeKey(run_id, iteration, group_index=group_index, sample_index=sample),
                config=config,
            )
            for sample in range(group_size)
        ]


def run_groups(
    tasks: list[Task],
    policy: CandidateScorerPolicy,
    *,
    run_id: str,
    iteration: int,
    group_size: int,
    config: EpisodeConfig,
    workers: int,
) -> list[Trajectory]:
    policy_bytes = pickle.dumps(policy)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = [
            pool.submit(
                run_group,
                task,
                policy_bytes,
                run_id=run_id,
                iteration=iteration,
                group_index=index,
                group_size=group_size,
                config=config,
            )
            for index, task in enumerate(tasks)
        ]
        return [t for future in futures for t in future.result()]


def pass_rate(trajectories: list[Trajectory]) -> float:
    scored = [t for t in trajectories if t.trainable]
    return sum(1 for t in scored if t.passed) / max(1, len(scored))


def mean_reward(trajectories: list[Trajectory]) -> float:
    scored = [t.reward for t in trajectories if t.trainable and t.reward is not None]
    return statistics.fmean(scored) if scored else 0.0


def parse_difficulty(text: str) -> str | dict[str, float] | None:
    """`mixed` (the family's own mix), one level (`easy`), or weights (`easy=3,medium=1`)."""
    if text == "mixed":
        return None
    if "=" not in text:
        return text
    return {level: float(weight) for level, weight in (p.split("=") for p in text.split(","))}


def run_seed(seed: int, args: argparse.Namespace, work_dir: Path) -> dict[str, float]:
    paths = generate_demo_tasks(
        work_dir / f"tasks-{seed}",
        args.train_tasks + args.heldout_tasks,
        seed=seed,
        difficulty=parse_difficulty(args.difficulty),
    )
    tasks = [load_task(path) for path in paths]
    train, heldout = tasks[: args.train_tasks], tasks[args.train_tasks :]
    config = EpisodeConfig(max_steps=args.max_steps, step_timeout_s=30.0)
    policy = CandidateScorerPolicy(ScorerConfig(init_seed=seed), seed=seed)
    untrained = pickle.loads(pickle.dumps(policy))
    trainer = GRPOTrainer(policy, GRPOConfig(seed=seed, learning_rate=args.learning_rate))
    rng = random.Random(seed)
    rewards: list[float] = []
    for iteration in range(args.iterations):
        started = time.monotonic()
        batch_tasks = rng.sample(train, args.tasks_per_iteration)
        batch = run_groups(
            batch_tasks,
            policy,
            run_id=f"learn-{seed}",
            iteration=iteration,
            group_size=args.group_size,
            config=config,
            workers=args.workers,
        )
        metrics = trainer.update(batch)
        rewards.append(mean_reward(batch))
        print(
            f"  seed {seed} iteration {iteration}: reward {rewards[-1]:.3f} "
            f"pass {pass_rate(batch):.2f} groups used {metrics.groups.groups_used}/"
            f"{metrics.groups.groups_total} (zero-variance {metrics.groups.groups_zero_variance}, "
            f"infra {metrics.groups.groups_with_infra_failures}) "
            f"entropy {metrics.entropy:.2f} [{time.monotonic() - started:.0f}s]",
            flush=True,
        )
    evaluations = {}
    for name, candidate in (("untrained", untrained), ("trained", policy)):
        evaluation = run_groups(
            heldout,
            candidate,
            run_id=f"heldout-{seed}-{name}",
            iteration=0,
            group_size=args.eval_samples,
            config=config,
            workers=args.workers,
        )
        evaluations[name] = evaluation
    print(
        f"  seed {seed} held-out pass: untrained {pass_rate(evaluations['untrained']):.3f}, "
        f"trained {pass_rate(evaluations['trained']):.3f}",
        flush=True,
    )
    return {
        "first": rewards[0],
        "last3": statistics.fmean(rewards[-3:]),
        "heldout_untrained": pass_rate(evaluations["untrained"]),
        "heldout_trained": pass_rate(evaluations["trained"]),
        "heldout_reward_untrained": mean_reward(evaluations["untrained"]),
        "heldout_reward_trained": mean_reward(evaluations["trained"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--tasks-per-iteration", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=6)
    parser.add_argument("--train-tasks", type=int, default=16)
    parser.add_argument("--heldout-tasks", type=int, default=6)
    parser.add_argument("--eval-samples", type=int, default=3)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--difficulty",
        default="easy",
        help="demo task difficulty: mixed, easy, medium, hard or easy=3,medium=1",
    )
    parser.add_argument("--learning-rate", type=float, default=GRPOConfig().learning_rate)
    args = parser.parse_args()
    torch.set_num_threads(1)  # episodes run in threads; the network is tiny

    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="rollyard-learning-", dir="/var/tmp") as work:
        Path(work).chmod(0o711)
        for seed in args.seeds:
            results.append(run_seed(seed, args, Path(work)))

    print()
    print(
        "| seed | reward, iteration 1 | reward, last 3 | gain | held-out pass, untrained | held-out pass, trained |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for seed, result in zip(args.seeds, results, strict=True):
        print(
            f"| {seed} | {result['first']:.3f} | {result['last3']:.3f} | "
            f"{result['last3'] - result['first']:+.3f} | {result['heldout_untrained']:.3f} | "
            f"{result['heldout_trained']:.3f} |"
        )
    mean = {key: statistics.fmean(r[key] for r in results) for key in results[0]}
    print(
        f"| mean | {mean['first']:.3f} | {mean['last3']:.3f} | {mean['last3'] - mean['first']:+.3f} "
        f"| {mean['heldout_untrained']:.3f} | {mean['heldout_trained']:.3f} |"
    )
    print(
        f"\nheld-out mean reward: untrained {mean['heldout_reward_untrained']:.3f}, "
        f"trained {mean['heldout_reward_trained']:.3f}; total {time.monotonic() - started:.0f}s"
    )


if __name__ == "__main__":
    main()
