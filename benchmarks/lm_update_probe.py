"""What one GRPO update does to a warm-started policy, measured without a rollout after it.

`benchmarks/lm_learning.py` shows whether the reward rises over whole runs, but an iteration's
mean moves ~0.07 from the draw alone. This probe isolates one update: it rolls out on-policy
batches of the warm start once (the flags training tasks, the benchmark's sampling), applies one
update per trainer configuration to a fresh copy of the warm start, and scores each result with
the same seeds on the held-out tasks, turn by turn:

- The held-out tasks' reference transcripts are replayed once in bwrap sandboxes (real
  observations). For every assistant turn, the policy samples `--samples` replies at T=1 from the
  reference conversation before that turn; a reply is right when it holds exactly the reference
  tool call. The estimate is the mean over tasks of the product of the turns' right shares, a
  pass rate in which a turn's miss is not followed by recovery (the warm start never recovers).
- Every configuration is scored with the same sampling seeds, so two nearby policies draw the
  same replies wherever their distributions agree: differences of a few hundredths are signal.

The controls are supervised: more fine-tuning steps on the warm tasks' reference transcripts,
and on the policy's own passing episodes (text after a reply's last tool call left out), at
batch 16 — what a reward-filtered update could reach with the same data.

    python benchmarks/lm_update_probe.py --warm-start DIR --work DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lm_learning import write_tasks

BATCH_SEEDS = (0, 1, 2)
"""One on-policy batch of 12 tasks x 4 per seed, as the benchmark's first iteration draws."""

UPDATES: dict[str, dict[str, Any]] = {
    "GRPO, lr 2e-5, 2 epochs x 2 minibatches, one batch (the edit-only benchmark's)": {
        "learning_rate": 2e-5,
        "epochs": 2,
        "minibatches": 2,
        "batches": 1,
    },
    "GRPO, lr 5e-5, 2 x 2, one batch": {
        "learning_rate": 5e-5,
        "epochs": 2,
        "minibatches": 2,
        "batches": 1,
    },
    "GRPO, lr 3e-4, 1 x 8 minibatches, three batches, floor 0.2": {
        "learning_rate": 3e-4,
        "minibatches": 8,
        "min_reinforced_prob": 0.2,
    },
    "the same, negative advantages scaled to 0": {
        "learning_rate": 3e-4,
        "minibatches": 8,
        "min_reinforced_prob": 0.2,
        "negative_advantage_scale": 0.0,
    },
}


def turn_pass_estimate(
    model: Any, tokenizer: Any, transcripts: Sequence[Any], *, samples: int, max_tokens: int
) -> tuple[float, list[float]]:
    """The held-out pass estimate and each turn's share of exactly right replies."""
    from training.lm.generate import LocalGenerator, SamplingParams

    generator = LocalGenerator(model, tokenizer, name="probe")
    jobs = []
    for task, transcript in enumerate(transcripts):
        messages = list(transcript.messages)
        for turn, message in enumerate(messages):
            if message["role"] != "assistant":
                continue
            reference = message["tool_calls"][0]["function"]
            for sample in range(samples):
                seed = task * 1000 + turn * 10 + sample  # the same draws for every policy
                sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=seed)
                prompt = generator.prompt(messages[:turn], list(transcript.tools), sampling)
                jobs.append((task, turn, reference, prompt))
    right: dict[tuple[int, int], list[bool]] = {}
    for start in range(0, len(jobs), 32):
        chunk = jobs[start : start + 32]
        for (task, turn, reference, _), reply in zip(
            chunk, generator.generate_batch([job[3] for job in chunk]), strict=True
        ):
            exact = (
                len(reply.tool_calls) == 1
                and not reply.malformed_tool_calls
                and reply.tool_calls[0].name == reference["name"]
                and json.loads(reply.tool_calls[0].arguments) == json.loads(reference["arguments"])
            )
            right.setdefault((task, turn), []).append(exact)
    per_task: dict[int, list[float]] = {}
    for (task, _), outcomes in sorted(right.items()):
        per_task.setdefault(task, []).append(sum(outcomes) / len(outcomes))
    estimate = sum(math.prod(shares) for shares in per_task.values()) / len(per_task)
    per_turn = [sum(shares) / len(shares) for shares in zip(*per_task.values(), strict=True)]
    return estimate, per_turn


def on_policy_batches(warm: Path, train_tasks: Path, root: Path, max_tokens: int) -> list[Any]:
    """The warm start's own episodes: one batch per seed, as the train flow's first iteration
    samples them (bwrap sandboxes, the verifier, the store)."""
    from storage import TrajectoryStore
    from tasks_lib.format.finder import tasks_in
    from training.lm.conversation import ChatSampling
    from training.lm.spec import policy_from_spec
    from training.local import rollout_batch

    sampling = ChatSampling(temperature=1.0, max_tokens=max_tokens)
    batches = []
    for seed in BATCH_SEEDS:
        batches.append(
            rollout_batch(
                tasks_in(train_tasks),
                TrajectoryStore(root / "store"),
                policy=policy_from_spec(f"hf:{warm}", sampling=sampling),
                run_id=f"probe-{seed}",
                iteration=0,
                tasks_per_iteration=12,
                group_size=4,
                max_steps=4,
                seed=seed,
                max_concurrent_requests=4,
            )
        )
    return batches


def grpo_update(warm: Path, batches: list[Any], settings: dict[str, Any], work: Path) -> Any:
    from training.lm.grpo_config import LMTrainerConfig
    from training.lm.trainer import LMTrainer

    values = dict(settings)
    count = values.pop("batches", len(batches))
    trainer = LMTrainer.from_model_dir(
        warm, weights_dir=work, config=LMTrainerConfig(**values, seed=0)
    )
    metrics = trainer.update([t for batch in batches[:count] for t in batch])
    return trainer, metrics


def supervised_steps(
    warm: Path, sequences: list[Any], steps: int, learning_rate: float
) -> tuple[Any, Any]:
    """Fine-tune a fresh copy of the warm start for `steps` steps of 16 sequences (mean
    log-loss over their trained positions), AdamW as the trainer builds it."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.lm.token_loss import token_logprobs

    tokenizer = AutoTokenizer.from_pretrained(warm)
    model = AutoModelForCausalLM.from_pretrained(warm, dtype=torch.float32)
    model.eval()
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, weight_decay=0.0)
    draw = random.Random(0)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    for _ in range(steps):
        batch = draw.sample(sequences, 16)
        optimizer.zero_grad(set_to_none=True)
        logprobs = token_logprobs(model, batch, temperature=1.0, pad_token_id=pad)
        loss = -sum(lp.sum() for lp in logprobs) / sum(len(lp) for lp in logprobs)
        loss.backward()
        optimizer.step()
    return model, tokenizer


def as_samples(transcripts: Sequence[Any], tokenizer: Any) -> list[Any]:
    """Reference transcripts as the trainer's samples (their replies trained)."""
    from training.lm.tiny import transcript_token_ids
    from training.lm.token_loss import TrainedSample
    from training.lm.tokens import TrainingSequence

    samples = []
    for index, transcript in enumerate(transcripts):
        ids, trained = transcript_token_ids(tokenizer, transcript)
        sequence = TrainingSequence(tuple(ids), tuple(trained), (0.0,) * len(ids))
        positions = tuple(i for i, t in enumerate(trained) if t)
        samples.append(TrainedSample(f"reference-{index}", sequence, 1.0, positions))
    return samples


def own_passing_samples(batches: list[Any], tokenizer: Any) -> list[Any]:
    """The passing episodes' replies, each cut after its last `</tool_call>`."""
    from training.lm.token_loss import trained_samples

    passing = [t for batch in batches for t in batch if t.trainable and t.passed]
    samples = trained_samples(passing, {t.episode_id: 1.0 for t in passing}, 8192)
    close = tuple(tokenizer.encode("</tool_call>", add_special_tokens=False))
    end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    kept = []
    for sample in samples:
        ids, positions, after_call, previous = sample.sequence.input_ids, [], False, -2
        for position in sample.trained_positions:
            if position != previous + 1:
                after_call = False  # a new reply
            previous = position
            if after_call and ids[position] != end:
                continue
            positions.append(position)
            after_call = after_call or ids[position - len(close) + 1 : position + 1] == close
        kept.append(dataclasses.replace(sample, trained_positions=tuple(positions)))
    return kept


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--warm-start", type=Path, required=True, help="an hf: model directory")
    parser.add_argument("--work", type=Path, required=True, help="a new directory")
    parser.add_argument("--held-out-tasks", type=int, default=64)
    parser.add_argument("--warm-tasks", type=int, default=300)
    parser.add_argument("--samples", type=int, default=4, help="replies per held-out turn")
    parser.add_argument("--max-tokens", type=int, default=96)
    args = parser.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from tasks_lib.format.finder import tasks_in
    from training.lm.sft import reference_transcripts

    torch.set_num_threads(1)  # the same arithmetic whatever else runs: the seeds decide
    started = time.monotonic()
    root = args.work.resolve()
    root.mkdir(parents=True, exist_ok=False)
    warm = args.warm_start.resolve()
    held = tasks_in(write_tasks(root, "held-out", "flags", range(500, 500 + args.held_out_tasks)))
    held_transcripts, skipped = reference_transcripts(held, run_tests=False)
    if skipped:
        raise SystemExit(f"held-out references that did not replay: {skipped}")
    train_tasks = write_tasks(root, "train", "flags", range(32))
    batches = on_policy_batches(warm, train_tasks, root, args.max_tokens)
    rewards = [sum(t.reward for t in b if t.trainable) / len(b) for b in batches]
    print(f"on-policy batches: mean reward {', '.join(f'{r:.3f}' for r in rewards)} "
          f"({time.monotonic() - started:.0f} s so far)", flush=True)  # fmt: skip

    def report(label: str, model: Any, tokenizer: Any, extra: str = "") -> None:
        estimate, turns = turn_pass_estimate(
            model, tokenizer, held_transcripts, samples=args.samples, max_tokens=args.max_tokens
        )
        shares = " / ".join(f"{share:.2f}" for share in turns)
        print(f"| {label} | {estimate:.3f} | {shares} | {extra} |", flush=True)

    print("\n| update | held-out pass estimate | right share: read / edit / submit | |")
    print("|---|---:|---|---|")
    tokenizer = AutoTokenizer.from_pretrained(warm)
    report("none (the warm start)", AutoModelForCausalLM.from_pretrained(warm), tokenizer)
    for number, (label, settings) in enumerate(UPDATES.items()):
        trainer, metrics = grpo_update(warm, batches, settings, root / f"update-{number}")
        extra = f"approx. KL {metrics.approx_kl:.4f}, {metrics.optimizer_steps} steps"
        report(label, trainer.model, trainer.tokenizer, extra)

    warm_transcripts, _ = reference_transcripts(
        tasks_in(write_tasks(root, "warm", "flags", range(1000, 1000 + args.warm_tasks))),
        run_tests=False,
    )
    references = as_samples(warm_transcripts, tokenizer)
    own = own_passing_samples(batches, tokenizer)
    for source, sequences in (("reference transcripts", references), ("own passes", own)):
        for steps in (8, 16):
            model, _ = supervised_steps(warm, sequences, steps, 3e-4)
            report(f"supervised, {source}, {steps} steps, lr 3e-4", model, tokenizer)
    print(f"\ntotal {time.monotonic() - started:.0f} s", flush=True)


if __name__ == "__main__":
    main()
