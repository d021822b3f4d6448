"""The token-level GRPO trainer's values: its hyper-parameters (`LMTrainerConfig`, `LoraSettings`)
and what one update reports (`LMUpdateMetrics`). Plain frozen dataclasses, free of torch."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from training.advantages import GroupStats, InfraFailureRule
from training.errors import TrainingSettingsError

LossAggregation = Literal["token", "sequence"]


@dataclasses.dataclass(frozen=True, slots=True)
class LoraSettings:
    """Train a LoRA adapter (peft) instead of every weight: for models too large to fine-tune."""

    rank: int = 8
    alpha: int = 16
    dropout: float = 0.0
    target_modules: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj")


@dataclasses.dataclass(frozen=True, slots=True)
class LMTrainerConfig:
    """Hyper-parameters of the token-level GRPO update."""

    learning_rate: float = 1e-4
    """AdamW step size."""
    weight_decay: float = 0.0
    epochs: int = 1
    """Passes over each batch. With one pass and one minibatch the update is exactly on-policy:
    θ_old is θ, and no extra forward pass is needed for it."""
    minibatches: int = 1
    """Optimizer steps per epoch (episodes split among them)."""
    clip_epsilon: float = 0.2
    """PPO clip range ε on the per-token ratio π_θ / π_old."""
    kl_coef: float = 0.0
    """Weight of KL(π_θ ‖ π_ref) per token (k3 estimator); π_ref is the policy training started
    from (the adapter switched off, under LoRA). 0 skips the reference forward pass."""
    loss_aggregation: LossAggregation = "token"
    """`token`: every sampled token of the minibatch weighs the same (sum / token count; long
    replies weigh more, DAPO's choice). `sequence`: each episode's tokens are averaged first, then
    episodes (the original GRPO: every episode weighs the same, whatever its length)."""
    max_tokens_per_microbatch: int = 8192
    """The memory budget: a forward/backward pass holds at most this many tokens (padding
    included); larger batches accumulate gradients over several passes."""
    max_importance_ratio: float | None = 2.0
    """Cap of the per-token weight π_old / π_sampler (truncated importance sampling), which
    corrects samples drawn by an older policy (async mode) or a drifting sampler. None turns
    the correction off."""
    negative_advantage_scale: float = 1.0
    """Multiplier of negative advantages: 1 is GRPO; 0 reinforces the group's better episodes
    only and never pushes a sampled token down (filtered behaviour cloning, RAFT-like)."""
    min_reinforced_prob: float = 0.0
    """A sampled token of probability below this takes no positive advantage (it still takes
    a negative one). The gradient of a token's log-probability scales with 1 minus its
    probability, so a token drawn at 0.01 pushes ~100 times harder than one drawn at 0.99, and a
    few chance tokens of a passing episode (text after a tool call) can outweigh every token
    that made it pass; 0 reinforces every token."""
    max_grad_norm: float = 1.0
    normalize_by_std: bool = True
    """Divide advantages by the group's std (GRPO); False: reward minus mean (Dr. GRPO)."""
    advantage_epsilon: float = 1e-6
    fixed_tests_weight: float = 0.0
    """Signal = reward + w * share of fail-to-pass tests fixed (0: the reward alone)."""
    min_group_size: int = 2
    infra_failures: InfraFailureRule = "mask_group"
    lora: LoraSettings | None = None
    """None: full fine-tune (small models)."""
    seed: int = 0
    """Seed of the minibatch split."""

    def __post_init__(self) -> None:
        problems = []
        if not self.learning_rate > 0:
            problems.append(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.epochs < 1 or self.minibatches < 1:
            problems.append("epochs and minibatches must be >= 1")
        if self.loss_aggregation not in ("token", "sequence"):
            problems.append(
                f"loss_aggregation must be 'token' or 'sequence', got {self.loss_aggregation!r}"
            )
        if self.max_tokens_per_microbatch < 2:
            problems.append("max_tokens_per_microbatch must be >= 2")
        if self.max_importance_ratio is not None and self.max_importance_ratio < 1:
            problems.append("max_importance_ratio must be >= 1 (or None)")
        if not 0 <= self.negative_advantage_scale <= 1:
            problems.append(
                f"negative_advantage_scale must be in [0, 1], got {self.negative_advantage_scale}"
            )
        if not 0 <= self.min_reinforced_prob < 1:
            problems.append(
                f"min_reinforced_prob must be in [0, 1), got {self.min_reinforced_prob}"
            )
        if self.kl_coef < 0:
            problems.append("kl_coef must be >= 0")
        if problems:
            raise TrainingSettingsError("; ".join(problems))

    def to_state(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> LMTrainerConfig:
        values = dict(state)
        lora = values.get("lora")
        if lora is not None:
            lora = dict(lora)
            lora["target_modules"] = tuple(lora["target_modules"])
            values["lora"] = LoraSettings(**lora)
        return cls(**values)


@dataclasses.dataclass(frozen=True, slots=True)
class LMUpdateMetrics:
    """What one update did; `as_dict()` gives rows for the store's metrics table."""

    policy_version_before: str
    policy_version_after: str
    reward_mean: float
    reward_std: float
    pass_rate: float
    groups: GroupStats
    episodes_used: int
    sequences: int
    tokens_trained: int
    """Sampled tokens that carried loss, over every epoch."""
    loss: float
    policy_loss: float
    kl_to_reference: float
    approx_kl: float
    """Mean k3 estimate of KL(π_old ‖ π_θ) over the last epoch's tokens."""
    clip_fraction: float
    grad_norm: float
    optimizer_steps: int
    microbatches: int
    logprob_mismatch_mean_abs: float
    """Mean |log π_sampler - log π_old| over the batch's sampled tokens."""
    logprob_mismatch_max_abs: float
    sampler_kl: float
    """Mean k3 estimate of KL(π_sampler ‖ π_old) per token."""
    importance_ratio_capped_fraction: float
    """Share of tokens whose π_old / π_sampler weight hit `max_importance_ratio`."""

    def as_dict(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, GroupStats):
                values.update({k: float(v) for k, v in dataclasses.asdict(value).items()})
            elif isinstance(value, int | float):
                values[field.name] = float(value)
        return values
