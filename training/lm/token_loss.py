"""The loss side of token-level GRPO: which tokens of which episodes train (`trained_samples`),
their packing into micro-batches, the recomputed per-token logprobs and the minibatch weights of
each token, and the running sums of one update's metrics."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import torch

from training.errors import TrainerError
from training.lm.grpo_config import LossAggregation
from training.lm.tokens import (
    TrainingSequence,
    malformed_turns,
    training_sequences,
    trajectory_turns,
)
from training.trajectory import Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class TrainedSample:
    """One training sequence of an episode with the episode's advantage."""

    episode_id: str
    sequence: TrainingSequence
    advantage: float
    trained_positions: tuple[int, ...]
    """Indices of the sampled tokens (the loss mask's True positions)."""


def trained_samples(
    trajectories: Sequence[Trajectory], advantages: dict[str, float], budget: int
) -> list[TrainedSample]:
    samples = []
    for trajectory in trajectories:
        advantage = advantages.get(trajectory.episode_id)
        if advantage is None:
            continue
        turns = trajectory_turns(trajectory)
        # A reply without a usable tool call did nothing in the workspace: its episode's
        # success is not its doing, so it is never reinforced (it still takes a penalty).
        trained = (
            [not malformed for malformed in malformed_turns(trajectory)] if advantage > 0 else None
        )
        if not turns or not any(turn.completion_token_ids for turn in turns):
            raise TrainerError(
                f"episode {trajectory.episode_id} (policy {trajectory.policy_version}) stores no "
                "sampled token ids; the language-model trainer learns from token-in/token-out "
                "episodes only (hf: policies, or a server that returns token ids)"
            )
        for sequence in training_sequences(turns, trained):
            if len(sequence.input_ids) > budget:
                raise TrainerError(
                    f"episode {trajectory.episode_id} has a sequence of "
                    f"{len(sequence.input_ids)} tokens, over max_tokens_per_microbatch="
                    f"{budget}; raise the budget (more memory) or shorten episodes "
                    "(--max-steps, max_tokens)"
                )
            positions = tuple(i for i, trained in enumerate(sequence.loss_mask) if trained)
            if positions and positions[0] == 0:
                raise TrainerError(
                    f"episode {trajectory.episode_id}: a sampled token with no prompt before it"
                )
            if positions:
                samples.append(TrainedSample(trajectory.episode_id, sequence, advantage, positions))
    return samples


def microbatches(samples: Sequence[TrainedSample], budget: int) -> list[list[TrainedSample]]:
    """Consecutive samples packed so that count x longest length stays within `budget`."""
    batches: list[list[TrainedSample]] = []
    current: list[TrainedSample] = []
    longest = 0
    for sample in samples:
        length = len(sample.sequence.input_ids)
        if current and max(longest, length) * (len(current) + 1) > budget:
            batches.append(current)
            current, longest = [], 0
        current.append(sample)
        longest = max(longest, length)
    if current:
        batches.append(current)
    return batches


def causal_lm(model: Any) -> Any:
    """The transformers model under a peft wrapper (LoRA layers stay in place inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_logprobs(
    model: Any, samples: Sequence[TrainedSample], *, temperature: float, pad_token_id: int
) -> list[torch.Tensor]:
    """Per sample, log π(token | prefix) of its sampled tokens, in order. Right-padded batch;
    the output layer runs only at the positions that predict a sampled token (most of an agent
    episode is prompt and tool output)."""
    causal = causal_lm(model)
    width = max(len(s.sequence.input_ids) for s in samples)
    input_ids = torch.full((len(samples), width), pad_token_id, dtype=torch.long)
    attention = torch.zeros((len(samples), width), dtype=torch.long)
    for row, sample in enumerate(samples):
        ids = sample.sequence.input_ids
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention[row, : len(ids)] = 1
    hidden = causal.get_decoder()(input_ids=input_ids, attention_mask=attention).last_hidden_state
    rows = torch.tensor([row for row, s in enumerate(samples) for _ in s.trained_positions])
    positions = torch.tensor([p for s in samples for p in s.trained_positions])
    logits = causal.get_output_embeddings()(hidden[rows, positions - 1]).float()
    if temperature > 0:
        logits = logits / temperature
    targets = input_ids[rows, positions]
    chosen = torch.log_softmax(logits, dim=-1).gather(-1, targets[:, None]).squeeze(-1)
    return list(torch.split(chosen, [len(s.trained_positions) for s in samples]))


class AdapterOff:
    """The LoRA model with its adapter switched off for one forward pass (π_ref)."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def get_base_model(self) -> Any:
        return self

    def get_decoder(self) -> Any:
        model = self._model

        def decode(**inputs: Any) -> Any:
            with model.disable_adapter():
                return causal_lm(model).get_decoder()(**inputs)

        return decode

    def get_output_embeddings(self) -> Any:
        return causal_lm(self._model).get_output_embeddings()


@dataclasses.dataclass
class UpdateTotals:
    """Running sums of one update's metrics."""

    tokens: int = 0
    loss: float = 0.0
    policy_loss: float = 0.0
    kl_reference: float = 0.0
    grad_norm: float = 0.0
    optimizer_steps: int = 0
    microbatches: int = 0
    capped: int = 0
    mismatch_abs: list[float] = dataclasses.field(default_factory=list)
    sampler_kl: list[float] = dataclasses.field(default_factory=list)
    epoch: dict[str, list[float]] = dataclasses.field(default_factory=dict)

    def start_epoch(self) -> None:
        self.epoch = {}
        self.loss = self.policy_loss = self.kl_reference = 0.0

    def add(self, name: str, values: list[float]) -> None:
        self.epoch.setdefault(name, []).extend(values)

    def mean(self, name: str) -> float:
        values = self.epoch.get(name, [])
        return sum(values) / len(values) if values else 0.0


def token_weights(
    minibatch: Sequence[TrainedSample], aggregation: LossAggregation
) -> dict[int, float]:
    """Each sample's per-token weight in the minibatch loss (keyed by `id(sample)`)."""
    if aggregation == "token":
        tokens = sum(len(s.trained_positions) for s in minibatch)
        return {id(s): 1.0 / tokens for s in minibatch}
    per_episode: dict[str, int] = {}
    for sample in minibatch:
        per_episode[sample.episode_id] = per_episode.get(sample.episode_id, 0) + len(
            sample.trained_positions
        )
    episodes = len(per_episode)
    return {id(s): 1.0 / (episodes * per_episode[s.episode_id]) for s in minibatch}
