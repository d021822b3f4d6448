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

The hyper-parameters are in `grpo_config`, the loss side (samples, micro-batches, logprobs,
token weights) in `token_loss`, loading and writing weights in `weights`; this module is the
trainer that drives them.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from training.advantages import group_advantages
from training.errors import TrainingSettingsError
from training.lm.conversation import ChatSampling
from training.lm.grpo_config import LMTrainerConfig, LMUpdateMetrics
from training.lm.hf_policy import HFPolicy, weights_digest
from training.lm.token_loss import (
    AdapterOff,
    TrainedSample,
    UpdateTotals,
    microbatches,
    token_logprobs,
    token_weights,
    trained_samples,
)
from training.lm.weights import (
    ServedAdapters,
    load_trainable_model,
    path_under_root,
    resolve_under_root,
    write_atomically,
)
from training.trainer import Trainer
from training.trajectory import Trajectory

if TYPE_CHECKING:
    from storage import CheckpointInfo, TrajectoryStore
    from training.policy import Policy


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
        model, tokenizer = load_trainable_model(model_dir, adapter_dir=None, lora=config.lora)
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
        from training.lm.openai_policy import ClientSettings, OpenAIPolicy

        # The trainer has the weights, so the policy knows which token ids the model has.
        client = ClientSettings(vocab_size=int(self.model.config.vocab_size))
        if self.policy_dir == self.base_model_dir:
            return OpenAIPolicy(
                self.served.base_url, self.served.base_model, sampling=self.sampling, client=client
            )
        name = self.adapter_name
        return OpenAIPolicy(
            self.served.base_url,
            name,
            sampling=self.sampling,
            client=client,
            version=f"openai:{name}",
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
        samples = trained_samples(trajectories, advantages, config.max_tokens_per_microbatch)
        rewards = [t.reward for t in trajectories if t.trainable and t.reward is not None]
        passed = sum(1 for t in trajectories if t.trainable and t.passed)
        totals = UpdateTotals()
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

    def _logprobs(self, model: Any, batch: Sequence[TrainedSample]) -> list[torch.Tensor]:
        return token_logprobs(
            model, batch, temperature=self.temperature, pad_token_id=self.pad_token_id
        )

    def _train(self, samples: list[TrainedSample], totals: UpdateTotals) -> None:
        config = self.config
        budget = config.max_tokens_per_microbatch
        on_policy = config.epochs * config.minibatches == 1
        old: dict[int, torch.Tensor] = {}
        if not on_policy:  # θ_old must stay fixed while θ moves: one pass before any step
            with torch.no_grad():
                for batch in microbatches(samples, budget):
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
                weights = token_weights(minibatch, config.loss_aggregation)
                self.optimizer.zero_grad(set_to_none=True)
                for batch in microbatches(minibatch, budget):
                    self._accumulate(batch, weights, old, totals, first_pass=epoch == 0)
                grad_norm = torch.nn.utils.clip_grad_norm_(
                    [p for p in self.model.parameters() if p.requires_grad], config.max_grad_norm
                )
                self.optimizer.step()
                totals.optimizer_steps += 1
                totals.grad_norm = float(grad_norm)

    def _accumulate(
        self,
        batch: list[TrainedSample],
        weights: dict[int, float],
        old: dict[int, torch.Tensor],
        totals: UpdateTotals,
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
            advantage = torch.full_like(ratio, sample.advantage)
            if sample.advantage < 0:
                advantage = advantage * config.negative_advantage_scale
            elif config.min_reinforced_prob > 0:
                advantage = advantage * (sampler.exp() >= config.min_reinforced_prob)
            per_token = -torch.minimum(ratio * advantage, clipped * advantage)
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
            return AdapterOff(self.model)
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

        write_atomically(out, write)
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
        model_dir = path_under_root(self.policy_dir, root)
        state = {
            "optimizer": self.optimizer.state_dict(),
            "updates": self.updates,
            "config": self.config.to_state(),
            "shuffle_state": self._random.getstate(),
            "model_dir": model_dir,
            "base_model_dir": str(self.base_model_dir),
            "weights_dir": path_under_root(self.weights_dir, root),
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
        model_dir = resolve_under_root(state["model_dir"], root)
        base_dir = Path(state["base_model_dir"])
        trained = model_dir != base_dir
        model, tokenizer = load_trainable_model(
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
            weights_dir=resolve_under_root(state["weights_dir"], root),
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
