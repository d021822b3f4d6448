"""Token-level GRPO for a transformers causal LM: the trainer of `hf:` policies.

Read top to bottom:

1. Groups and masks come from `training.advantages.group_advantages` (the built-in trainer's
   function): zero-variance and infra-failure groups teach nothing and are counted.
2. Each trained episode's input is its stored tokens (`training.lm.tokens.training_sequences`):
   the exact ids the model read and sampled — never re-tokenized text. Only sampled ids carry
   loss; prompt, tool-output and template tokens are masked.
3. For every sampled token the trainer recomputes log π_θ(token | prefix) (logits divided by the
   sampling temperature, as the sampler drew them) and minimizes PPO's clipped surrogate with the
   episode's group-relative advantage, plus `kl_coef` times the k3 estimate of KL to the reference
   policy (the weights training started from). `loss_aggregation` says how tokens are weighed.
4. The sampler's logprobs are compared with θ_old's recomputed ones on every batch (stored as
   `logprob_mismatch_*`): the way users catch inference/training drift. Their ratio
   π_old / π_sampler (policy lag in async mode, or drift) weights each token, capped at
   `max_importance_ratio` (truncated importance sampling).
5. Sequences are packed into micro-batches of at most `max_tokens_per_microbatch` tokens and
   their gradients accumulated, so one optimizer step sees the whole (mini)batch whatever its
   size; a sequence longer than the budget is an error naming it.
6. After an update the weights are written as a Hugging Face directory (full model, or the LoRA
   adapter) with the tokenizer; the policy acts from it (`hf:DIR`), so the rollout side takes
   the new weights once per version (workers cache a loaded model by its weights' digest). With
   `ServedAdapters`, the new adapter is loaded into the OpenAI-compatible server instead
   (vLLM's `/v1/load_lora_adapter`) and the policy's requests name it as their model.
   `save_checkpoint` records the directory and the optimizer in the store's checkpoints table.
"""

from __future__ import annotations

import dataclasses
import math
import random
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import torch

from training.advantages import GroupStats, InfraFailureRule, group_advantages
from training.errors import TrainerError, TrainingSettingsError
from training.lm.conversation import ChatSampling
from training.lm.hf_policy import HFPolicy, weights_digest
from training.lm.tokens import TrainingSequence, training_sequences, trajectory_turns
from training.trainer import Trainer
from training.trajectory import Trajectory

if TYPE_CHECKING:
    from storage import CheckpointInfo, TrajectoryStore
    from training.policy import Policy

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
class ServedAdapters:
    """The server an `openai:` policy talks to, which takes each new LoRA adapter at runtime:
    vLLM started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, or rollyard's
    small-scale server (`training.lm.server`), serving the base model the trainer starts from."""

    base_url: str
    """The API root, e.g. `http://127.0.0.1:8000/v1`."""
    base_model: str
    """The served base model's name."""

    def load(self, lora_name: str, adapter_dir: Path) -> None:
        """`POST /v1/load_lora_adapter`; an adapter already loaded under the name is kept (a
        resumed run loads its last adapter again)."""
        import httpx

        try:
            response = httpx.post(
                f"{self.base_url}/load_lora_adapter",
                json={"lora_name": lora_name, "lora_path": str(adapter_dir)},
                timeout=120.0,
            )
        except httpx.TransportError as error:
            raise TrainerError(
                f"cannot load adapter {lora_name} into {self.base_url}: {error}"
            ) from error
        if response.status_code == 400 and "already been loaded" in response.text:
            return
        if response.status_code != 200:
            raise TrainerError(
                f"{self.base_url}/load_lora_adapter answered {response.status_code} for "
                f"{lora_name}: {response.text[:300]}; start vLLM with --enable-lora and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            )


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


@dataclasses.dataclass(frozen=True, slots=True)
class _Sample:
    """One training sequence of an episode with the episode's advantage."""

    episode_id: str
    sequence: TrainingSequence
    advantage: float
    trained_positions: tuple[int, ...]
    """Indices of the sampled tokens (the loss mask's True positions)."""


def _samples(
    trajectories: Sequence[Trajectory], advantages: dict[str, float], budget: int
) -> list[_Sample]:
    samples = []
    for trajectory in trajectories:
        advantage = advantages.get(trajectory.episode_id)
        if advantage is None:
            continue
        turns = trajectory_turns(trajectory)
        if not turns or not any(turn.completion_token_ids for turn in turns):
            raise TrainerError(
                f"episode {trajectory.episode_id} (policy {trajectory.policy_version}) stores no "
                "sampled token ids; the language-model trainer learns from token-in/token-out "
                "episodes only (hf: policies, or a server that returns token ids)"
            )
        for sequence in training_sequences(turns):
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
                samples.append(_Sample(trajectory.episode_id, sequence, advantage, positions))
    return samples


def _microbatches(samples: Sequence[_Sample], budget: int) -> list[list[_Sample]]:
    """Consecutive samples packed so that count x longest length stays within `budget`."""
    batches: list[list[_Sample]] = []
    current: list[_Sample] = []
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


def _causal_lm(model: Any) -> Any:
    """The transformers model under a peft wrapper (LoRA layers stay in place inside it)."""
    return model.get_base_model() if hasattr(model, "get_base_model") else model


def token_logprobs(
    model: Any, samples: Sequence[_Sample], *, temperature: float, pad_token_id: int
) -> list[torch.Tensor]:
    """Per sample, log π(token | prefix) of its sampled tokens, in order. Right-padded batch;
    the output layer runs only at the positions that predict a sampled token (most of an agent
    episode is prompt and tool output)."""
    causal = _causal_lm(model)
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


def _write_atomically(out: Path, write: Any) -> None:
    """Call `write(directory)` on a fresh directory beside `out`, then move it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        write(partial)
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


class LMTrainer(Trainer):
    """Trains a causal LM (full fine-tune or LoRA) from token-in/token-out episodes."""

    kind = "lm"

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        base_model_dir: str | Path,
        policy_dir: str | Path,
        weights_dir: str | Path,
        config: LMTrainerConfig,
        sampling: ChatSampling | None = None,
        updates: int = 0,
        served: ServedAdapters | None = None,
    ) -> None:
        if served is not None and config.lora is None:
            raise TrainingSettingsError(
                "a served policy takes new weights as LoRA adapters: set LMTrainerConfig.lora"
            )
        self.served = served
        self.model = model
        self.tokenizer = tokenizer
        self.base_model_dir = Path(base_model_dir).resolve()
        self.policy_dir = Path(policy_dir).resolve()
        """The HF directory the policy acts from: the weights after the last update."""
        self.weights_dir = Path(weights_dir).resolve()
        """Where each update's weights are written (`update-NNNN/`)."""
        self.config = config
        self.sampling = sampling or ChatSampling()
        self.updates = updates
        self.optimizer = torch.optim.AdamW(
            [p for p in model.parameters() if p.requires_grad],
            lr=config.learning_rate,
            weight_decay=config.weight_decay,
        )
        self._random = random.Random(config.seed)
        self._reference: Any = None
        pad = tokenizer.pad_token_id
        self.pad_token_id = int(pad if pad is not None else tokenizer.eos_token_id)
        model.eval()  # no dropout: the recomputed logprobs are the sampler's distribution

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_model_dir(
        cls,
        model_dir: str | Path,
        *,
        weights_dir: str | Path,
        config: LMTrainerConfig | None = None,
        sampling: ChatSampling | None = None,
        served: ServedAdapters | None = None,
    ) -> LMTrainer:
        """A trainer starting from the model in `model_dir` (the policy acts from it until the
        first update). With `served`, the policy is the server's model and each update's
        adapter is loaded into that server."""
        config = config or LMTrainerConfig()
        model, tokenizer = _load(model_dir, adapter_dir=None, lora=config.lora)
        return cls(
            model,
            tokenizer,
            base_model_dir=model_dir,
            policy_dir=model_dir,
            weights_dir=weights_dir,
            config=config,
            sampling=sampling,
            served=served,
        )

    @property
    def policy(self) -> Policy:
        """`hf:` over the weights after the last update, or, served, the `openai:` policy whose
        requests name the last update's adapter (the version is the adapter's digest)."""
        if self.served is None:
            return HFPolicy(self.policy_dir, sampling=self.sampling)
        from training.lm.openai_policy import OpenAIPolicy

        if self.policy_dir == self.base_model_dir:
            return OpenAIPolicy(
                self.served.base_url, self.served.base_model, sampling=self.sampling
            )
        name = self.adapter_name
        return OpenAIPolicy(
            self.served.base_url, name, sampling=self.sampling, version=f"openai:{name}"
        )

    @property
    def adapter_name(self) -> str:
        """The served name of the current adapter: the base model's and the weights' digest."""
        assert self.served is not None
        return f"{self.served.base_model}@{weights_digest(self.policy_dir)[:12]}"

    @property
    def temperature(self) -> float:
        """The sampler's temperature: logits are divided by it, as the sampler drew with it
        (greedy sampling recomputes the model's own distribution)."""
        return self.sampling.temperature if self.sampling.temperature > 0 else 1.0

    # -- the update -----------------------------------------------------------------------------

    def update(self, trajectories: Sequence[Trajectory]) -> LMUpdateMetrics:
        """One token-level GRPO update on one iteration's batch (any mix of statuses)."""
        config = self.config
        version_before = self.policy.version
        advantages, stats = group_advantages(trajectories, config)
        samples = _samples(trajectories, advantages, config.max_tokens_per_microbatch)
        rewards = [t.reward for t in trajectories if t.trainable and t.reward is not None]
        passed = sum(1 for t in trajectories if t.trainable and t.passed)
        totals = _Totals()
        if samples:
            self._train(samples, totals)
            self.updates += 1
            self._write_policy_weights()
        reward_mean = math.fsum(rewards) / len(rewards) if rewards else 0.0
        reward_std = (
            math.sqrt(math.fsum((r - reward_mean) ** 2 for r in rewards) / len(rewards))
            if rewards
            else 0.0
        )
        mismatch = totals.mismatch_abs
        return LMUpdateMetrics(
            policy_version_before=version_before,
            policy_version_after=self.policy.version,
            reward_mean=reward_mean,
            reward_std=reward_std,
            pass_rate=passed / len(rewards) if rewards else 0.0,
            groups=stats,
            episodes_used=len({s.episode_id for s in samples}),
            sequences=len(samples),
            tokens_trained=totals.tokens,
            loss=totals.loss,
            policy_loss=totals.policy_loss,
            kl_to_reference=totals.kl_reference,
            approx_kl=totals.mean("approx_kl"),
            clip_fraction=totals.mean("clipped"),
            grad_norm=totals.grad_norm,
            optimizer_steps=totals.optimizer_steps,
            microbatches=totals.microbatches,
            logprob_mismatch_mean_abs=sum(mismatch) / len(mismatch) if mismatch else 0.0,
            logprob_mismatch_max_abs=max(mismatch, default=0.0),
            sampler_kl=sum(totals.sampler_kl) / len(totals.sampler_kl)
            if totals.sampler_kl
            else 0.0,
            importance_ratio_capped_fraction=totals.capped / len(mismatch) if mismatch else 0.0,
        )

    def _logprobs(self, model: Any, batch: Sequence[_Sample]) -> list[torch.Tensor]:
        return token_logprobs(
            model, batch, temperature=self.temperature, pad_token_id=self.pad_token_id
        )

    def _train(self, samples: list[_Sample], totals: _Totals) -> None:
        config = self.config
        budget = config.max_tokens_per_microbatch
        on_policy = config.epochs * config.minibatches == 1
        old: dict[int, torch.Tensor] = {}
        if not on_policy:  # θ_old must stay fixed while θ moves: one pass before any step
            with torch.no_grad():
                for batch in _microbatches(samples, budget):
                    for sample, logprobs in zip(
                        batch, self._logprobs(self.model, batch), strict=True
                    ):
                        old[id(sample)] = logprobs
        episode_ids = sorted({s.episode_id for s in samples})
        for epoch in range(config.epochs):
            self._random.shuffle(episode_ids)
            chunk = math.ceil(len(episode_ids) / config.minibatches)
            totals.start_epoch()
            for start in range(0, len(episode_ids), chunk):
                members = set(episode_ids[start : start + chunk])
                minibatch = [s for s in samples if s.episode_id in members]
                weights = _token_weights(minibatch, config.loss_aggregation)
                self.optimizer.zero_grad(set_to_none=True)
                for batch in _microbatches(minibatch, budget):
                    self._accumulate(batch, weights, old, totals, first_pass=epoch == 0)
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], config.max_grad_norm
                )
                self.optimizer.step()
                totals.optimizer_steps += 1
                totals.grad_norm = float(grad_norm)

    def _accumulate(
        self,
        batch: list[_Sample],
        weights: dict[int, float],
        old: dict[int, torch.Tensor],
        totals: _Totals,
        *,
        first_pass: bool,
    ) -> None:
        """Forward and backward one micro-batch; its loss is already scaled to its share of
        the minibatch (`weights`), so the accumulated gradient is the minibatch's."""
        config = self.config
        new = self._logprobs(self.model, batch)
        reference: list[torch.Tensor] | None = None
        if config.kl_coef > 0:
            with torch.no_grad():
                reference = self._logprobs(self._reference_model(), batch)
        loss = torch.zeros(())
        for index, (sample, logprobs) in enumerate(zip(batch, new, strict=True)):
            old_logprobs = old.get(id(sample), logprobs.detach())
            sampler = torch.tensor(
                [sample.sequence.sampler_logprobs[p] for p in sample.trained_positions]
            )
            weight = torch.ones_like(sampler)
            if config.max_importance_ratio is not None:
                weight = (old_logprobs - sampler).exp().clamp(max=config.max_importance_ratio)
            log_ratio = logprobs - old_logprobs
            ratio = log_ratio.exp()
            clipped = ratio.clamp(1 - config.clip_epsilon, 1 + config.clip_epsilon)
            per_token = -torch.minimum(ratio * sample.advantage, clipped * sample.advantage)
            per_token = per_token * weight
            kl_reference = torch.zeros_like(per_token)
            if reference is not None:
                delta = reference[index] - logprobs
                kl_reference = delta.exp() - delta - 1
            token_weight = weights[id(sample)]
            policy_part = (per_token * token_weight).sum()
            kl_part = (kl_reference * token_weight).sum()
            loss = loss + policy_part + config.kl_coef * kl_part
            with torch.no_grad():
                totals.policy_loss += float(policy_part)
                totals.kl_reference += float(kl_part)
                totals.tokens += len(sample.trained_positions)
                totals.add("approx_kl", ((ratio - 1) - log_ratio).tolist())
                totals.add("clipped", ((ratio - 1).abs() > config.clip_epsilon).float().tolist())
                if first_pass:
                    drift = old_logprobs - sampler
                    totals.mismatch_abs += drift.abs().tolist()
                    totals.sampler_kl += (drift.exp() - drift - 1).tolist()
                    if config.max_importance_ratio is not None:
                        totals.capped += int((drift.exp() >= config.max_importance_ratio).sum())
        loss.backward()  # type: ignore[no-untyped-call]
        totals.loss += float(loss.detach())
        totals.microbatches += 1

    def _reference_model(self) -> Any:
        """π_ref: the adapter switched off (LoRA), or a frozen copy of the starting weights."""
        if self.config.lora is not None:
            return _AdapterOff(self.model)
        if self._reference is None:
            from transformers import AutoModelForCausalLM

            reference: Any = AutoModelForCausalLM.from_pretrained(
                self.base_model_dir, dtype=torch.float32
            )
            reference.eval()
            reference.requires_grad_(False)
            self._reference = reference
        return self._reference

    def _write_policy_weights(self) -> None:
        """The weights after this update as an HF directory the policy acts from."""
        out = self.weights_dir / f"update-{self.updates:04d}"

        def write(directory: Path) -> None:
            self.model.save_pretrained(directory)
            self.tokenizer.save_pretrained(directory)

        _write_atomically(out, write)
        self.policy_dir = out
        if self.served is not None:
            self.served.load(self.adapter_name, out)

    # -- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(
        self,
        store: TrajectoryStore,
        *,
        run_id: str,
        iteration: int,
        trained_on_iterations: Sequence[int] = (),
        n_episodes: int = 0,
        parent_policy_version: str | None = None,
    ) -> CheckpointInfo:
        """Record the policy's HF directory (model or adapter + tokenizer) and the optimizer in
        the checkpoints table: the row names the directory, the blob holds what resuming needs
        beyond it (optimizer moments, counters, the minibatch shuffle)."""
        root = Path(store.root).resolve()
        model_dir = _relative_to(self.policy_dir, root)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "config": self.config.to_state(),
            "shuffle_state": self._random.getstate(),
            "model_dir": model_dir,
            "base_model_dir": str(self.base_model_dir),
            "weights_dir": _relative_to(self.weights_dir, root),
            "sampling": dataclasses.asdict(self.sampling),
            "served": dataclasses.asdict(self.served) if self.served else None,
        }
        return store.checkpoints.save(
            run_id,
            self.policy.version,
            state,
            iteration=iteration,
            trained_on_iterations=trained_on_iterations,
            n_episodes=n_episodes,
            parent_policy_version=parent_policy_version,
            metadata={
                "trainer": self.kind,
                "model_dir": model_dir,
                "base_model_dir": str(self.base_model_dir),
                "updates": self.updates,
                "lora": self.config.lora is not None,
            },
        )

    @classmethod
    def load_checkpoint(
        cls,
        store: TrajectoryStore,
        run_id: str,
        policy_version: str,
        *,
        sampling: ChatSampling | None = None,
    ) -> LMTrainer:
        """The trainer as `save_checkpoint` left it: weights from the recorded directory,
        optimizer, counters and shuffle state from the blob."""
        state, _ = store.checkpoints.load(run_id, policy_version)
        root = Path(store.root).resolve()
        config = LMTrainerConfig.from_state(state["config"])
        model_dir = _resolve(state["model_dir"], root)
        base_dir = Path(state["base_model_dir"])
        trained = model_dir != base_dir
        model, tokenizer = _load(
            base_dir,
            adapter_dir=model_dir if config.lora is not None and trained else None,
            lora=config.lora,
            weights_from=model_dir if config.lora is None else None,
        )
        trainer = cls(
            model,
            tokenizer,
            base_model_dir=base_dir,
            policy_dir=model_dir,
            weights_dir=_resolve(state["weights_dir"], root),
            config=config,
            sampling=sampling or ChatSampling(**state["sampling"]),
            updates=int(state["updates"]),
            served=ServedAdapters(**state["served"]) if state.get("served") else None,
        )
        if trainer.served is not None and trained:  # the server may have restarted since
            trainer.served.load(trainer.adapter_name, model_dir)
        trainer.optimizer.load_state_dict(state["optimizer"])
        version, internal, gauss = state["shuffle_state"]
        trainer._random.setstate((version, tuple(internal), gauss))
        return trainer


class _AdapterOff:
    """The LoRA model with its adapter switched off for one forward pass (π_ref)."""

    def __init__(self, model: Any) -> None:
        self._model = model

    def get_base_model(self) -> Any:
        return self

    def get_decoder(self) -> Any:
        model = self._model

        def decode(**inputs: Any) -> Any:
            with model.disable_adapter():
                return _causal_lm(model).get_decoder()(**inputs)

        return decode

    def get_output_embeddings(self) -> Any:
        return _causal_lm(self._model).get_output_embeddings()


@dataclasses.dataclass
class _Totals:
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


def _token_weights(minibatch: Sequence[_Sample], aggregation: LossAggregation) -> dict[int, float]:
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


def _load(
    model_dir: str | Path,
    *,
    adapter_dir: Path | None,
    lora: LoraSettings | None,
    weights_from: Path | None = None,
) -> tuple[Any, Any]:
    """Model (trainable) and tokenizer: full weights from `weights_from` (or `model_dir`); under
    LoRA the base from `model_dir` with the adapter of `adapter_dir`, or a fresh adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = weights_from or Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    if lora is None:
        return model, tokenizer
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_dir is not None:
        return PeftModel.from_pretrained(model, adapter_dir, is_trainable=True), tokenizer
    adapter = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, adapter), tokenizer


def _relative_to(path: Path, root: Path) -> str:
    """`path` relative to the store root when inside it (the store can move), else absolute."""
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path.resolve())


def _resolve(path: str, root: Path) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else root / candidate
