"""Does a tiny language model learn with token-level GRPO? SFT warm start, then RL through the
real train flow, several seeds, figures for the README.

1. Tasks of the `settings` family, `flags` vocabulary by default (set one boolean flag of
   `app/settings.py` to the value the instruction gives; `--family settings`: an integer constant
   of one of several packages; pytest verifies): a warm-start set, a training set and a held-out
   set, disjoint.
2. A tiny Qwen2-architecture model (config + tokenizer trained here, random weights) is
   warm-started with the real command: `rollyard sft --tasks WARM --policy hf:BASE --out SFT
   --no-test-run --file-changes both` (reference solutions replayed as tool calls in bwrap
   sandboxes, verified, then fine-tuned on; each solution demonstrated twice, as an `edit_file`
   call and as the whole file rewritten through `run_command`, so imitation leaves the choice
   between the two at a coin toss and only the reward tells which one the model carries out).
3. The warm-started policy is scored on the held-out tasks.
4. Per seed, `flows.train.run_training` trains it with `--policy hf:SFT` (Prefect + a Dask
   LocalCluster + bwrap + the verifier + the store + the quality gates; the LM trainer), then
   the last checkpoint's directory (`hf:DIR`) is scored on the held-out tasks.

Targets (issue 16): the mean over seeds of (mean reward of the last three iterations - reward of
the first) >= 0.2, and a held-out pass rate above the warm-started policy's.

    python benchmarks/lm_learning.py --seeds 0 1 2 --work /tmp/lm-learning
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]


def write_tasks(root: Path, name: str, family: str, indices: range) -> Path:
    from tasks_lib.sources.families.settings.generate import (
        plan_flags_task,
        plan_settings_task,
        write_settings_task,
    )

    plan = plan_flags_task if family == "flags" else plan_settings_task
    out = root / name
    for index in indices:
        task = plan(0, index)
        write_settings_task(task, out / task.task_id)
    return out


def build_base(root: Path, hidden_size: int, layers: int, tool_declarations: str) -> Path:
    from training.lm.tiny import TinyModelSize, build_tiny_model

    size = TinyModelSize(
        hidden_size=hidden_size,
        intermediate_size=3 * hidden_size,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=2048,
    )
    return build_tiny_model(root / "base", seed=0, size=size, tool_declarations=tool_declarations)


def warm_start(root: Path, base: Path, warm_tasks: Path, args: argparse.Namespace) -> Path:
    """The real command line, in a subprocess."""
    out = root / "sft"
    env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
    command = [
        sys.executable, "-m", "flows.cli", "sft", "--tasks", str(warm_tasks),
        "--policy", f"hf:{base}", "--out", str(out), "--no-test-run",
        "--steps", str(args.sft_steps), "--batch-size", str(args.sft_batch_size),
        "--learning-rate", str(args.sft_learning_rate), "--store", str(root / "sft-store"),
        "--context-first-steps", str(args.sft_context_first_steps),
        "--context-first-learning-rate", str(args.sft_context_first_learning_rate),
        "--threads", "1", "--file-changes", args.sft_file_changes,
    ]  # fmt: skip
    finished = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    if finished.returncode != 0:
        raise SystemExit(f"rollyard sft failed ({finished.returncode}):\n{finished.stderr[-3000:]}")
    print("sft:", finished.stdout.strip().splitlines()[-1], flush=True)
    return out


def held_out_pass_rate(
    model_dir: Path, tasks: Path, store: Path, run_id: str, samples: int, seed: int, sampling: Any
) -> float:
    """Pass rate of `hf:model_dir` over every held-out task, `samples` episodes each."""
    from storage import TrajectoryStore
    from tasks_lib.format.finder import tasks_in
    from training.lm.spec import policy_from_spec
    from training.local import rollout_batch

    task_dirs = tasks_in(tasks)
    batch = rollout_batch(
        task_dirs,
        TrajectoryStore(store),
        policy=policy_from_spec(f"hf:{model_dir}", sampling=sampling),
        run_id=run_id,
        iteration=0,
        tasks_per_iteration=len(task_dirs),
        group_size=samples,
        max_steps=4,
        seed=seed,
    )
    scored = [t for t in batch if t.trainable]
    return sum(1 for t in scored if t.passed) / len(scored) if scored else 0.0


def train_seed(
    root: Path, sft: Path, train_tasks: Path, seed: int, args: argparse.Namespace, sampling: Any
) -> tuple[list[Any], Path, list[dict[str, Any]]]:
    from flows.train import run_training
    from flows.train_settings import TrainSettings
    from storage import TrajectoryStore
    from training.lm.grpo_config import LMTrainerConfig

    store = root / f"store-{seed}"
    settings = TrainSettings(
        tasks_dir=str(train_tasks),
        store=str(store),
        run_id=f"lm-{seed}",
        policy=f"hf:{sft}",
        lm_trainer=LMTrainerConfig(
            learning_rate=args.learning_rate,
            epochs=args.epochs,
            minibatches=args.minibatches,
            loss_aggregation=args.loss_aggregation,
            kl_coef=args.kl_coef,
            negative_advantage_scale=args.negative_advantage_scale,
            min_reinforced_prob=args.min_reinforced_prob,
            seed=seed,
        ),
        max_concurrent_requests=args.in_flight,
        sampling=sampling,
        iterations=args.iterations,
        tasks_per_iteration=args.tasks_per_iteration,
        group_size=args.group_size,
        shards_per_iteration=2,
        max_steps=4,
        seed=seed,
    )
    summaries = run_training(settings, workers=2)
    opened = TrajectoryStore(store)
    latest = max(opened.checkpoints.recorded(f"lm-{seed}"), key=lambda c: c.iteration)
    model_dir = Path(opened.root) / latest.metadata["model_dir"]
    metrics = opened.query(
        "SELECT iteration, name, value FROM metrics WHERE run_id = ? AND source = 'train_flow' "
        "AND name IN ('sampled_tokens_per_s', 'trained_tokens_per_s', 'rollout_wall_s', "
        "'update_s', 'logprob_mismatch_max_abs', 'tokens_trained') ORDER BY iteration",
        [f"lm-{seed}"],
    ).to_pylist()
    return summaries, model_dir, metrics


def change_tools_by_iteration(store: Path, run_id: str) -> list[dict[str, Any]]:
    """Per iteration: how the episodes changed the file (`edit_file`, `run_command`, both or
    neither) — the choice a `--sft-file-changes both` warm start leaves open — and the pass rate
    of each."""
    from storage import TrajectoryStore

    table = TrajectoryStore(store).query(
        """
        WITH used AS (
          SELECT episode_id,
                 bool_or(action_kind = 'edit_file') AS edit,
                 bool_or(action_kind = 'run_command') AS command
          FROM steps GROUP BY episode_id)
        SELECT iteration,
               CASE WHEN edit AND command THEN 'both' WHEN edit THEN 'edit_file'
                    WHEN command THEN 'run_command' ELSE 'neither' END AS tool,
               count(*) AS episodes,
               avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) AS pass_rate
        FROM episodes JOIN used USING (episode_id)
        WHERE run_id = ?
        GROUP BY ALL ORDER BY ALL""",
        [run_id],
    )
    return table.to_pylist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--seeds",
        type=int,
        nargs="*",
        default=[0, 1, 2],
        help="training seeds; none: the warm start and its held-out score only",
    )
    parser.add_argument("--family", choices=("flags", "settings"), default="flags")
    parser.add_argument(
        "--warm-start",
        type=Path,
        default=None,
        metavar="DIR",
        help="a warm-started model directory of an earlier run (its `sft`) to "
        "train from instead of running `rollyard sft` again",
    )
    parser.add_argument(
        "--warm-pass",
        type=float,
        default=None,
        metavar="RATE",
        help="with --warm-start: its held-out pass rate measured by that run "
        "(same held-out tasks and samples), instead of measuring it again",
    )
    parser.add_argument("--work", type=Path, required=True, help="a new directory")
    parser.add_argument("--iterations", type=int, default=8)
    parser.add_argument("--tasks-per-iteration", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=4)
    parser.add_argument("--train-tasks", type=int, default=96)
    parser.add_argument("--warm-tasks", type=int, default=300)
    parser.add_argument("--held-out-tasks", type=int, default=32)
    parser.add_argument("--held-out-samples", type=int, default=2)
    parser.add_argument("--hidden-size", type=int, default=128)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--sft-steps", type=int, default=1000)
    parser.add_argument("--sft-batch-size", type=int, default=16)
    parser.add_argument(
        "--sft-learning-rate",
        type=float,
        default=1e-3,
        help="peak learning rate of the steps on every token",
    )
    parser.add_argument(
        "--sft-context-first-steps",
        type=int,
        default=450,
        help="of --sft-steps, those that train only the reply tokens read from the prompt",
    )
    parser.add_argument("--sft-context-first-learning-rate", type=float, default=1e-3)
    parser.add_argument(
        "--sft-file-changes",
        choices=("edit", "rewrite", "both"),
        default="both",
        help="rollyard sft --file-changes: how the warm start's transcripts change the file",
    )
    parser.add_argument(
        "--tool-declarations",
        choices=("schemas", "signatures"),
        default="signatures",
        help="how the tiny model's chat template declares the tools",
    )
    parser.add_argument("--learning-rate", type=float, default=2e-4)
    parser.add_argument("--epochs", type=int, default=2, help="passes of the GRPO update per batch")
    parser.add_argument("--minibatches", type=int, default=2, help="optimizer steps per pass")
    parser.add_argument("--kl-coef", type=float, default=0.0)
    parser.add_argument(
        "--negative-advantage-scale",
        type=float,
        default=0.0,
        help="1: GRPO; 0: only the better episodes of a group are reinforced",
    )
    parser.add_argument(
        "--min-reinforced-prob",
        type=float,
        default=0.2,
        help="sampled tokens below this probability take no positive advantage",
    )
    parser.add_argument(
        "--in-flight",
        type=int,
        default=4,
        help="episodes a shard keeps in flight (the hf: policy batches their forward passes)",
    )
    parser.add_argument(
        "--loss-aggregation",
        choices=("token", "sequence"),
        default="token",
        help="token: every trained token weighs the same; sequence: every episode does",
    )
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument(
        "--temperature",
        type=float,
        default=1.0,
        help="sampling temperature of every rollout (the trainer recomputes log-probabilities "
        "at the same temperature)",
    )
    args = parser.parse_args()
    if args.warm_pass is not None and args.warm_start is None:
        parser.error("--warm-pass is the held-out pass rate of a --warm-start DIR; give both")

    from training.lm.conversation import ChatSampling
    from training.lm.tiny import parameter_count

    started = time.monotonic()
    root = args.work.resolve()
    root.mkdir(parents=True, exist_ok=False)
    train_tasks = write_tasks(root, "train", args.family, range(args.train_tasks))
    held_tasks = write_tasks(root, "held-out", args.family, range(500, 500 + args.held_out_tasks))
    warm_tasks = write_tasks(root, "warm", args.family, range(1000, 1000 + args.warm_tasks))
    sampling = ChatSampling(temperature=args.temperature, max_tokens=args.max_tokens)
    if args.warm_start is None:
        base = build_base(root, args.hidden_size, args.layers, args.tool_declarations)
        sft = warm_start(root, base, warm_tasks, args)
    else:
        sft = args.warm_start.resolve()
    parameters = parameter_count(sft)
    print(f"model: {parameters / 1e6:.2f} M parameters", flush=True)
    sft_s = time.monotonic() - started
    if args.warm_pass is not None:
        warm_pass = args.warm_pass
    else:
        warm_pass = held_out_pass_rate(
            sft, held_tasks, root / "eval-store", "held-out-sft", args.held_out_samples, 0, sampling
        )
    print(f"warm-started held-out pass rate {warm_pass:.3f} ({sft_s:.0f} s so far)", flush=True)
    if args.warm_pass is None:
        for row in change_tools_by_iteration(root / "eval-store", "held-out-sft"):
            print("  held-out, warm start:", json.dumps(row), flush=True)

    rows = []
    if not args.seeds:
        return
    for seed in args.seeds:
        seed_started = time.monotonic()
        summaries, trained_dir, metrics = train_seed(root, sft, train_tasks, seed, args, sampling)
        rewards = [s.reward_mean for s in summaries]
        trained_pass = held_out_pass_rate(
            trained_dir,
            held_tasks,
            root / "eval-store",
            f"held-out-{seed}",
            args.held_out_samples,
            0,
            sampling,
        )
        gain = statistics.fmean(rewards[-3:]) - rewards[0]
        by_name: dict[str, list[float]] = {}
        for row in metrics:
            by_name.setdefault(row["name"], []).append(float(row["value"]))
        row = {
            "seed": seed,
            "rewards": rewards,
            "gain": gain,
            "quarantined": [s.iteration for s in summaries if s.quarantined],
            "held_out_trained": trained_pass,
            "seconds": time.monotonic() - seed_started,
            **{f"mean_{k}": statistics.fmean(v) for k, v in by_name.items()},
        }
        row["change_tools"] = change_tools_by_iteration(root / f"store-{seed}", f"lm-{seed}")
        row["held_out_change_tools"] = change_tools_by_iteration(
            root / "eval-store", f"held-out-{seed}"
        )
        rows.append(row)
        print(json.dumps(row), flush=True)

    total_s = time.monotonic() - started
    mean_gain = statistics.fmean(r["gain"] for r in rows)
    mean_held = statistics.fmean(r["held_out_trained"] for r in rows)
    print("\n| seed | reward per iteration | last 3 | gain | held-out pass, warm start | "
          "held-out pass, trained |")  # fmt: skip
    print("|---:|---|---:|---:|---:|---:|")
    for r in rows:
        curve = " ".join(f"{x:.2f}".lstrip("0") for x in r["rewards"])
        print(f"| {r['seed']} | {curve} | {statistics.fmean(r['rewards'][-3:]):.3f} | "
              f"{r['gain']:+.3f} | {warm_pass:.3f} | {r['held_out_trained']:.3f} |")  # fmt: skip
    print(f"| mean | | | **{mean_gain:+.3f}** | {warm_pass:.3f} | **{mean_held:.3f}** |")
    print(f"\nmodel {parameters / 1e6:.2f} M parameters; total {total_s:.0f} s "
          f"(warm start {sft_s:.0f} s)")  # fmt: skip
    print(f"target gain >= +0.2 on the mean: {'met' if mean_gain >= 0.2 else 'not met'}; "
          f"held-out above the warm start: {'met' if mean_held > warm_pass else 'not met'}")  # fmt: skip
    (root / "result.json").write_text(
        json.dumps({"rows": rows, "warm_pass": warm_pass, "total_s": total_s}, indent=1)
    )


if __name__ == "__main__":
    main()
