"""Does the built-in policy learn? GRPO on demo tasks, several seeds, figures for the README.

For each seed: generate demo tasks, split them into training and held-out tasks, train a fresh
`CandidateScorerPolicy` with GRPO for a few iterations on bwrap sandboxes with the real
verifier, and report

- the mean reward of the first iteration against the mean of the last three, and
- the pass rate on held-out tasks never trained on, trained policy against the untrained one.

    python benchmarks/learning.py --seeds 0 1 2

`--families demo data_analysis ops` trains one policy on a mix of families (training, held-out and
per-iteration tasks split evenly among them) and reports the reward of each family. The last
lines say, per family, whether the learning target is met on the mean over seeds: last three
iterations at least +0.2 above the first, and a higher held-out pass rate trained than untrained.

The defaults are the size of `rollyard demo` (8 iterations x 8 tasks x 4 samples, 6 steps,
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
from typing import Any

import torch

from sandboxes import open_sandbox
from tasks_lib import generate_demo_tasks, load_task
from tasks_lib.format.model import Task
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


def grpo_config(seed: int, args: argparse.Namespace) -> GRPOConfig:
    """The trainer's settings: the library defaults unless the command line overrides them (to
    measure what each one is worth, e.g. `--trial-credit-weight 0 --clip-epsilon 0.2 --epochs 2`
    is plain GRPO with PPO's usual clip; `--target-entropy 1.5` adapts the entropy weight)."""
    return GRPOConfig(
        seed=seed,
        learning_rate=args.learning_rate,
        trial_credit_weight=args.trial_credit_weight,
        clip_epsilon=args.clip_epsilon,
        epochs=args.epochs,
        target_entropy=args.target_entropy,
        entropy_coef_bounds=(args.entropy_coef_bounds[0], args.entropy_coef_bounds[1]),
        kl_coef=args.kl_coef,
    )


# -- one policy over one or several families ----------------------------------------------------

FAMILIES = ("demo", "data_analysis", "ops")
# The learning target: the mean reward of the last three iterations at least this much above
# the first iteration's, on the mean over seeds (and trained above untrained on held-out tasks).
TARGET_GAIN = 0.2


def split_count(total: int, parts: int) -> list[int]:
    """`total` spread over `parts` as evenly as possible (the first ones get the remainder)."""
    return [total // parts + (1 if index < total % parts else 0) for index in range(parts)]


def generate_family_tasks(
    family: str, out_dir: Path, count: int, seed: int, difficulty: str
) -> list[Path]:
    from tasks_lib.sources.families.data_analysis import generate_data_analysis_tasks
    from tasks_lib.sources.families.ops import generate_ops_tasks

    if family == "demo":
        return generate_demo_tasks(
            out_dir, count, seed=seed, difficulty=parse_difficulty(difficulty)
        )
    if family == "data_analysis":
        return generate_data_analysis_tasks(out_dir, count, seed=seed)
    return generate_ops_tasks(out_dir, count, seed=seed)


def run_seed(seed: int, args: argparse.Namespace, work_dir: Path) -> dict[str, dict[str, Any]]:
    """One seed over the families of `args.families`: per family, training and held-out tasks of
    its own; each iteration draws the same share of tasks from every family. Returns per family
    its reward per iteration and its held-out figures."""
    families = list(args.families)
    # Run ids (which seed each episode's sampling) as they were when demo-only runs had a loop
    # of their own, so the figures in benchmarks/README.md reproduce.
    tag = "" if families == ["demo"] else "mixed-"
    train: dict[str, list[Task]] = {}
    heldout: dict[str, list[Task]] = {}
    family_of: dict[str, str] = {}
    train_counts = split_count(args.train_tasks, len(families))
    heldout_counts = split_count(args.heldout_tasks, len(families))
    for family, n_train, n_heldout in zip(families, train_counts, heldout_counts, strict=True):
        paths = generate_family_tasks(
            family, work_dir / f"tasks-{seed}-{family}", n_train + n_heldout, seed, args.difficulty
        )
        tasks = [load_task(path) for path in paths]
        train[family], heldout[family] = tasks[:n_train], tasks[n_train:]
        family_of.update((task.id, family) for task in tasks)
    config = EpisodeConfig(max_steps=args.max_steps, step_timeout_s=30.0)
    policy = CandidateScorerPolicy(ScorerConfig(init_seed=seed), seed=seed)
    untrained = pickle.loads(pickle.dumps(policy))
    trainer = GRPOTrainer(policy, grpo_config(seed, args))
    rng = random.Random(seed)
    rewards: dict[str, list[float]] = {family: [] for family in families}

    def by_family(batch: list[Trajectory], family: str) -> list[Trajectory]:
        return [t for t in batch if family_of[t.task_id] == family]

    per_iteration = split_count(args.tasks_per_iteration, len(families))
    for iteration in range(args.iterations):
        started = time.monotonic()
        batch_tasks = [
            task
            for family, count in zip(families, per_iteration, strict=True)
            for task in rng.sample(train[family], min(count, len(train[family])))
        ]
        batch = run_groups(
            batch_tasks,
            policy,
            run_id=f"learn-{tag}{seed}",
            iteration=iteration,
            group_size=args.group_size,
            config=config,
            workers=args.workers,
        )
        metrics = trainer.update(batch)
        for family in families:
            rewards[family].append(mean_reward(by_family(batch, family)))
        shares = ", ".join(f"{family} {rewards[family][-1]:.3f}" for family in families)
        print(
            f"  seed {seed} iteration {iteration}: reward {mean_reward(batch):.3f} ({shares}) "
            f"groups used {metrics.groups.groups_used}/{metrics.groups.groups_total} "
            f"(zero-variance {metrics.groups.groups_zero_variance}, "
            f"infra {metrics.groups.groups_with_infra_failures}) "
            f"entropy {metrics.entropy:.2f}"
            + (f" (weight {trainer.entropy_coef:.3g})" if args.target_entropy is not None else "")
            + f" [{time.monotonic() - started:.0f}s]",
            flush=True,
        )
    all_heldout = [task for family in families for task in heldout[family]]
    evaluations = {}
    for name, candidate in (("untrained", untrained), ("trained", policy)):
        evaluations[name] = run_groups(
            all_heldout,
            candidate,
            run_id=f"heldout-{tag}{seed}-{name}",
            iteration=0,
            group_size=args.eval_samples,
            config=config,
            workers=args.workers,
        )
    results: dict[str, dict[str, Any]] = {}
    for family in families:
        untrained_runs = by_family(evaluations["untrained"], family)
        trained_runs = by_family(evaluations["trained"], family)
        results[family] = {
            "rewards": rewards[family],
            "first": rewards[family][0],
            "last3": statistics.fmean(rewards[family][-3:]),
            "heldout_untrained": pass_rate(untrained_runs),
            "heldout_trained": pass_rate(trained_runs),
            "heldout_reward_untrained": mean_reward(untrained_runs),
            "heldout_reward_trained": mean_reward(trained_runs),
        }
        print(
            f"  seed {seed} {family} held-out pass: untrained "
            f"{results[family]['heldout_untrained']:.3f}, trained "
            f"{results[family]['heldout_trained']:.3f}",
            flush=True,
        )
    return results


def print_table(seeds: list[int], results: list[dict[str, dict[str, Any]]]) -> None:
    print()
    print(
        "| family | seed | reward, iteration 1 | reward per iteration | reward, last 3 | gain "
        "| held-out pass, untrained | held-out pass, trained |"
    )
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for family in results[0]:
        rows = [result[family] for result in results]
        for seed, row in zip(seeds, rows, strict=True):
            curve = " ".join(f"{r:.2f}".removeprefix("0") for r in row["rewards"])
            print(
                f"| {family} | {seed} | {row['first']:.3f} | {curve} | {row['last3']:.3f} | "
                f"{row['last3'] - row['first']:+.3f} | {row['heldout_untrained']:.3f} | "
                f"{row['heldout_trained']:.3f} |"
            )
        if len(rows) > 1:
            mean = {
                key: statistics.fmean(r[key] for r in rows) for key in rows[0] if key != "rewards"
            }
            print(
                f"| {family} | mean | {mean['first']:.3f} | | {mean['last3']:.3f} | "
                f"{mean['last3'] - mean['first']:+.3f} | {mean['heldout_untrained']:.3f} | "
                f"{mean['heldout_trained']:.3f} |"
            )
    for family in results[0]:
        untrained = statistics.fmean(r[family]["heldout_reward_untrained"] for r in results)
        trained = statistics.fmean(r[family]["heldout_reward_trained"] for r in results)
        print(f"{family}: held-out mean reward untrained {untrained:.3f}, trained {trained:.3f}")


def print_status(results: list[dict[str, dict[str, Any]]]) -> None:
    """One line per family: is the learning target met on the mean over seeds?"""
    for family in results[0]:
        gain = statistics.fmean(r[family]["last3"] - r[family]["first"] for r in results)
        untrained = statistics.fmean(r[family]["heldout_untrained"] for r in results)
        trained = statistics.fmean(r[family]["heldout_trained"] for r in results)
        met = gain >= TARGET_GAIN and trained > untrained
        print(
            f"{family}: learning target (mean gain, last 3 against iteration 1, >= "
            f"+{TARGET_GAIN:.2f}; held-out pass trained > untrained) "
            f"{'MET' if met else 'NOT MET'}: gain {gain:+.3f}, held-out pass {untrained:.3f} -> "
            f"{trained:.3f} over {len(results)} seed(s)"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--tasks-per-iteration", type=int, default=8)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--train-tasks", type=int, default=32)
    parser.add_argument("--heldout-tasks", type=int, default=12)
    parser.add_argument("--eval-samples", type=int, default=2)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument(
        "--difficulty",
        default="easy",
        help="demo task difficulty: mixed, easy, medium, hard or easy=3,medium=1",
    )
    defaults = GRPOConfig()
    parser.add_argument("--learning-rate", type=float, default=defaults.learning_rate)
    parser.add_argument("--trial-credit-weight", type=float, default=defaults.trial_credit_weight)
    parser.add_argument("--clip-epsilon", type=float, default=defaults.clip_epsilon)
    parser.add_argument("--epochs", type=int, default=defaults.epochs)
    parser.add_argument(
        "--target-entropy",
        type=float,
        default=defaults.target_entropy,
        help="adapt the entropy bonus's weight toward this mean policy entropy (nats)",
    )
    parser.add_argument(
        "--entropy-coef-bounds",
        type=float,
        nargs=2,
        metavar=("LOW", "HIGH"),
        default=defaults.entropy_coef_bounds,
        help="bounds of the adapted entropy weight (with --target-entropy)",
    )
    parser.add_argument(
        "--kl-coef",
        type=float,
        default=defaults.kl_coef,
        help="weight of the penalty on the KL divergence from the pre-update policy",
    )
    parser.add_argument(
        "--families",
        nargs="+",
        choices=FAMILIES,
        default=["demo"],
        help="task families to train on together (tasks split evenly); rewards per family",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)  # episodes run in threads; the network is tiny
    started = time.monotonic()
    results = []
    with tempfile.TemporaryDirectory(prefix="rollyard-learning-", dir="/var/tmp") as work:
        Path(work).chmod(0o711)
        for seed in args.seeds:
            results.append(run_seed(seed, args, Path(work)))
    print_table(args.seeds, results)
    print_status(results)
    print(f"total {time.monotonic() - started:.0f}s")


if __name__ == "__main__":
    main()
