"""GRPO for the built-in policy: group-relative advantages and a PPO-style clipped objective.

Read top to bottom like CleanRL's ppo.py:

1. `training.advantages.group_advantages` (shared with the language-model trainer) — each
   trajectory's advantage against its group, with zero-variance and infra-failure groups masked
   explicitly and counted.
2. `step_advantages` — every action of a trajectory shares its advantage, and each trial
   (`TryEdit`) adds its credit (`trial_credits`: kept or reverted, against its group's trials).
3. `GRPOTrainer.update` — for `epochs`
   passes over minibatches it recomputes log π(a|s) from the stored candidate features, forms the
   ratio against the log-probability recorded when the action was sampled, and minimizes
   -min(ratio·A, clip(ratio, 1-ε, 1+ε)·A) averaged over actions, minus an entropy bonus, plus
   (with `kl_coef`) a penalty on the KL divergence from the pre-update policy over every
   candidate of each state (`kl_to_reference`). With `target_entropy` set, the bonus's weight adapts after each optimizer step toward keeping the
   policy's entropy at the target (`adapted_entropy_coef`).
4. Metrics come back as an `UpdateMetrics` value (`as_dict()` for the store's metrics table);
   `state_dict()` holds policy + optimizer (and the adapted entropy weight) for checkpoints.

`GRPOTrainer` implements `training.trainer.Trainer`.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch

from training.actions import TryEdit, trial_kept
from training.advantages import (
    GroupStats,
    InfraFailureRule,
    by_group,
    group_advantages,
    teaching_members,
)
from training.builtin.scorer_policy import CandidateScorerPolicy, chosen_and_entropies
from training.errors import TrainerError
from training.policy import ScorerRecord
from training.trainer import Trainer
from training.trajectory import Trajectory

if TYPE_CHECKING:
    from storage import CheckpointInfo, TrajectoryStore


@dataclasses.dataclass(frozen=True, slots=True)
class GRPOConfig:
    """Hyper-parameters of the GRPO update."""

    learning_rate: float = 0.05
    """Adam step size. High for a network this small: it must learn within a few iterations
    (the demo has eight, of 32 episodes each)."""
    epochs: int = 4
    """Passes over each batch (the ratio leaves 1 after the first; the clip bounds how far)."""
    minibatches: int = 2
    """Minibatches per epoch, split by trajectory (a trajectory's actions stay together)."""
    clip_epsilon: float = 0.5
    """PPO clip range ε: the ratio's influence is cut outside [1-ε, 1+ε]. Wider than the usual
    0.2: a run of eight updates could raise an action's probability at most 1.2^8 ≈ 4x under
    0.2, too little to go from uniform over ~20 candidates to reliable (measured:
    `benchmarks/README.md` § Learning)."""
    entropy_coef: float = 0.01
    """Weight of the entropy bonus; keeps the policy exploring before it is sure. With
    `target_entropy` set, the weight it starts from."""
    target_entropy: float | None = None
    """Mean policy entropy (nats, over the actions trained on) the entropy weight steers toward;
    None keeps the weight fixed at `entropy_coef`. A fixed weight small enough not to hold the
    policy back once its signal is clear is too small to stop a collapse (0.05 did not, on demo
    seed 0); an adapted one grows only while the entropy is below the target and shrinks again
    above it (SAC's temperature tuning, applied to the entropy bonus)."""
    entropy_coef_rate: float = 0.2
    """How fast the adapted weight moves: after each optimizer step its logarithm changes by
    `rate * (target_entropy - entropy)`, so 1 nat below the target multiplies it by e^rate.
    Measured on demo seed 1 (target 1.5): rate 1 swung the weight between its bounds within an
    update and undid what the policy had learned; 0.2 did not."""
    entropy_coef_bounds: tuple[float, float] = (1e-3, 0.1)
    """The adapted weight stays within these; the upper bound keeps the bonus from outweighing
    the advantages (of order 1): at 1.0 it reset a policy that had learned to near-uniform."""
    kl_coef: float = 0.0
    """Weight of a penalty on KL(π_before ‖ π) — the divergence of the policy from the one that
    sampled the batch (the pre-update policy), summed over every candidate of each state and
    averaged over the actions trained on. An anchor for the whole distribution: the PPO clip only
    stops pushing a *sampled* action's ratio once it leaves [1-ε, 1+ε], while the candidates not
    sampled move freely with the shared network, so several epochs can move a state's
    distribution far from where its samples said anything. With weight β one update moves each
    state at most about as far as π_before·exp(A/β). 0 (the default) turns it off: on demo seed 0,
    β = 0.5 and 2 held the entropy up and slowed learning by as much, neither reaching the
    unanchored curve in eight iterations (`benchmarks/README.md` § Learning)."""
    max_grad_norm: float = 1.0
    """Gradients are clipped to this global norm."""
    normalize_by_std: bool = True
    """Divide advantages by the group's reward std (GRPO); False keeps reward-minus-mean
    (Dr. GRPO), which does not up-weight groups that barely differ."""
    advantage_epsilon: float = 1e-6
    """Added to the std before dividing, and the variance below which a group counts as
    zero-variance."""
    fixed_tests_weight: float = 0.5
    """The signal advantages are computed from is `reward + w * fixed_fraction` (share of the
    task's fail-to-pass tests that pass). Multi-bug tasks seldom reach reward 1 early in
    training; this ranks a sample that fixed one bug above one that fixed none. Not the
    verifier's partial credit: that counts tests which passed all along, so it pays an untouched
    workspace more than an honest attempt, and the policy learns to submit at once."""
    trial_credit_weight: float = 1.0
    """Weight of the per-step credit of trials (`TryEdit`): a trial the environment kept (fewer
    visible tests failed after it) scores 1, a reverted one 0, centred on the mean of the
    group's trials, added to that step's advantage. The episode advantage gives every action of
    an episode the same credit, so the one trial that fixed the bug shares it with the guesses
    around it; this term tells them apart from the observation the agent itself was shown. It
    also lets groups whose rewards are all equal teach something when some of their trials were
    kept (a multi-bug task half fixed). 0 turns it off (plain GRPO)."""
    min_group_size: int = 2
    """Groups with fewer trainable samples than this are masked (no baseline to compare to)."""
    infra_failures: InfraFailureRule = "mask_group"
    """What a group with an infra failure contributes. `mask_group`: nothing — its baseline
    would come from fewer samples than its peers', and failures can correlate with what the
    policy did. `drop_samples`: its trainable samples, if `min_group_size` remain."""
    seed: int = 0
    """Seed of minibatch shuffling."""


@dataclasses.dataclass(frozen=True, slots=True)
class UpdateMetrics:
    """What one update did; `as_dict()` gives rows for the store's metrics table."""

    policy_version_before: str
    policy_version_after: str
    reward_mean: float
    """Mean reward of trainable trajectories (masked groups included: it is the batch's score)."""
    reward_std: float
    pass_rate: float
    groups: GroupStats
    steps_used: int
    loss: float
    policy_loss: float
    entropy: float
    approx_kl: float
    """Mean of (ratio - 1) - log ratio over the last epoch (k3 estimator)."""
    clip_fraction: float
    """Share of actions whose ratio left [1-ε, 1+ε] in the last epoch."""
    grad_norm: float
    optimizer_steps: int

    def as_dict(self) -> dict[str, float]:
        values: dict[str, float] = {}
        for field in dataclasses.fields(self):
            value = getattr(self, field.name)
            if isinstance(value, GroupStats):
                values.update({k: float(v) for k, v in dataclasses.asdict(value).items()})
            elif isinstance(value, int | float):
                values[field.name] = float(value)
        return values


def trial_credits(
    trajectories: Sequence[Trajectory], config: GRPOConfig | None = None
) -> dict[tuple[str, int], float]:
    """Credit per (episode id, step index) of every trial (`TryEdit`) in groups that train:
    kept (1) or reverted (0), minus the mean over the trials of its group. Empty when
    `trial_credit_weight` is 0. Groups with an infra failure (under `mask_group`) or fewer than
    `min_group_size` trainable samples give nothing, as in `group_advantages`."""
    config = config or GRPOConfig()
    if config.trial_credit_weight == 0.0:
        return {}
    credits: dict[tuple[str, int], float] = {}
    for members in by_group(trajectories).values():
        trainable = teaching_members(members, config)
        trials = [
            (trajectory.episode_id, step.index, float(trial_kept(step.observation.text)))
            for trajectory in trainable
            for step in trajectory.steps
            if isinstance(step.action, TryEdit)
        ]
        if not trials:
            continue
        baseline = math.fsum(kept for _, _, kept in trials) / len(trials)
        for episode_id, index, kept in trials:
            if kept != baseline:
                credits[(episode_id, index)] = kept - baseline
    return credits


def step_advantages(
    trajectories: Sequence[Trajectory],
    config: GRPOConfig | None = None,
    *,
    advantages: Mapping[str, float] | None = None,
) -> dict[tuple[str, int], float]:
    """The advantage each action trains with, per (episode id, step index): its episode's group
    advantage plus `trial_credit_weight` times its trial credit. Actions left out carry no
    signal (masked episodes, and the untried actions of a zero-variance group). `advantages`
    are the episodes' `group_advantages`, when the caller already has them."""
    config = config or GRPOConfig()
    if advantages is None:
        advantages, _ = group_advantages(trajectories, config)
    credits = trial_credits(trajectories, config)
    weight = config.trial_credit_weight
    result: dict[tuple[str, int], float] = {}
    for trajectory in trajectories:
        advantage = advantages.get(trajectory.episode_id)
        for step in trajectory.steps:
            credit = credits.get((trajectory.episode_id, step.index))
            if advantage is None and credit is None:
                continue
            result[(trajectory.episode_id, step.index)] = (advantage or 0.0) + weight * (
                credit or 0.0
            )
    return result


def clipped_objective(
    new_logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    clip_epsilon: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate as a loss to minimize (mean over actions), the approximate KL and
    the clip fraction."""
    log_ratio = new_logprobs - old_logprobs
    ratio = log_ratio.exp()
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_epsilon, 1.0 + clip_epsilon) * advantages
    loss = -torch.minimum(unclipped, clipped).mean()
    with torch.no_grad():
        approx_kl = ((ratio - 1.0) - log_ratio).mean()
        clip_fraction = ((ratio - 1.0).abs() > clip_epsilon).float().mean()
    return loss, approx_kl, clip_fraction


def kl_to_reference(
    distributions: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]
) -> torch.Tensor:
    """Mean over states of KL(reference ‖ distribution), both as log-probability vectors over a
    state's candidates: exact, not a sampled estimate (a state has a few dozen candidates)."""
    divergences = [
        (before.exp() * (before - after)).sum()
        for after, before in zip(distributions, reference, strict=True)
    ]
    return torch.stack(divergences).mean()


def adapted_entropy_coef(coef: float, entropy: float, config: GRPOConfig) -> float:
    """The entropy weight after one optimizer step that measured `entropy`: moved in log space by
    `entropy_coef_rate * (target_entropy - entropy)` (up below the target, down above it) and
    kept within `entropy_coef_bounds`. Log space: the weight can grow from 0.01 to where it
    matters within a few steps, and never changes sign."""
    assert config.target_entropy is not None
    low, high = config.entropy_coef_bounds
    log_coef = math.log(coef) + config.entropy_coef_rate * (config.target_entropy - entropy)
    return min(high, max(low, math.exp(log_coef)))


@dataclasses.dataclass(frozen=True, slots=True)
class _Sample:
    record: ScorerRecord
    old_logprob: float
    advantage: float
    episode_id: str


class GRPOTrainer(Trainer):
    """Trains a `CandidateScorerPolicy` in place from batches of trajectories."""

    kind = "builtin"

    def __init__(self, policy: CandidateScorerPolicy, config: GRPOConfig | None = None) -> None:
        self._policy = policy
        self.config = config or GRPOConfig()
        self.optimizer = torch.optim.Adam(policy.network.parameters(), lr=self.config.learning_rate)
        self.updates = 0
        """Calls of `update` that changed the policy."""
        self.entropy_coef = self.config.entropy_coef
        """Weight of the entropy bonus in the next optimizer step: `entropy_coef`, or its adapted
        value when `target_entropy` is set."""
        self._random = random.Random(self.config.seed)

    @property
    def policy(self) -> CandidateScorerPolicy:
        return self._policy

    def _samples(
        self, trajectories: Sequence[Trajectory], advantages: Mapping[tuple[str, int], float]
    ) -> list[_Sample]:
        """One sample per action that carries a signal (`step_advantages`): every action of an
        episode with an advantage, plus the credited trials of episodes whose group had none
        (all rewards equal)."""
        samples = []
        for trajectory in trajectories:
            for step in trajectory.steps:
                step_advantage = advantages.get((trajectory.episode_id, step.index))
                if step_advantage is None:
                    continue
                if not isinstance(step.record, ScorerRecord) or step.logprob is None:
                    raise TrainerError(
                        f"episode {trajectory.episode_id} step {step.index} has no candidate-scorer "
                        f"record (policy {trajectory.policy_version}); the GRPO trainer learns "
                        "only from trajectories of the built-in policy — export others with "
                        "`rollyard export` (training.export)"
                    )
                samples.append(
                    _Sample(step.record, step.logprob, step_advantage, trajectory.episode_id)
                )
        return samples

    def update(self, trajectories: Sequence[Trajectory]) -> UpdateMetrics:
        """One GRPO update on one iteration's batch (any mix of statuses)."""
        config = self.config
        version_before = self.policy.version
        advantages, stats = group_advantages(trajectories, config)
        samples = self._samples(
            trajectories, step_advantages(trajectories, config, advantages=advantages)
        )
        rewards = [t.reward for t in trajectories if t.trainable and t.reward is not None]
        reward_tensor = torch.tensor(rewards, dtype=torch.float64)
        passed = [t for t in trajectories if t.trainable and t.passed]

        reference: list[torch.Tensor] = []
        if samples and config.kl_coef > 0.0:
            with torch.no_grad():
                reference = self.policy.distributions_of([s.record for s in samples])
        loss_value = policy_loss_value = entropy_value = kl_value = clip_value = grad_value = 0.0
        optimizer_steps = 0
        if samples:
            episode_ids = sorted({s.episode_id for s in samples})
            for _ in range(config.epochs):
                self._random.shuffle(episode_ids)
                chunk = math.ceil(len(episode_ids) / max(1, config.minibatches))
                epoch_kl, epoch_clip, epoch_count = 0.0, 0.0, 0
                for start in range(0, len(episode_ids), chunk):
                    members = set(episode_ids[start : start + chunk])
                    positions = [i for i, s in enumerate(samples) if s.episode_id in members]
                    batch = [samples[i] for i in positions]
                    records = [s.record for s in batch]
                    distributions = self.policy.distributions_of(records)
                    new_logprobs, entropies = chosen_and_entropies(distributions, records)
                    old_logprobs = torch.tensor([s.old_logprob for s in batch])
                    batch_advantages = torch.tensor([s.advantage for s in batch])
                    policy_loss, approx_kl, clip_fraction = clipped_objective(
                        new_logprobs, old_logprobs, batch_advantages, config.clip_epsilon
                    )
                    entropy = entropies.mean()
                    loss = policy_loss - self.entropy_coef * entropy
                    if reference:
                        loss = loss + config.kl_coef * kl_to_reference(
                            distributions, [reference[i] for i in positions]
                        )
                    self.optimizer.zero_grad()
                    loss.backward()  # type: ignore[no-untyped-call]
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        self.policy.network.parameters(), config.max_grad_norm
                    )
                    self.optimizer.step()
                    optimizer_steps += 1
                    if config.target_entropy is not None:
                        self.entropy_coef = adapted_entropy_coef(
                            self.entropy_coef, entropy.item(), config
                        )
                    loss_value, policy_loss_value = loss.item(), policy_loss.item()
                    entropy_value, grad_value = entropy.item(), grad_norm.item()
                    epoch_kl += float(approx_kl) * len(batch)
                    epoch_clip += float(clip_fraction) * len(batch)
                    epoch_count += len(batch)
                kl_value, clip_value = epoch_kl / epoch_count, epoch_clip / epoch_count
            self.policy.mark_updated()
            self.updates += 1

        return UpdateMetrics(
            policy_version_before=version_before,
            policy_version_after=self.policy.version,
            reward_mean=float(reward_tensor.mean()) if rewards else 0.0,
            reward_std=float(reward_tensor.std(unbiased=False)) if rewards else 0.0,
            pass_rate=len(passed) / len(rewards) if rewards else 0.0,
            groups=stats,
            steps_used=len(samples),
            loss=loss_value,
            policy_loss=policy_loss_value,
            entropy=entropy_value,
            approx_kl=kl_value,
            clip_fraction=clip_value,
            grad_norm=grad_value,
            optimizer_steps=optimizer_steps,
        )

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Policy, optimizer and counters: what a checkpoint holds to resume exactly."""
        return {
            "policy": self.policy.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "config": dataclasses.asdict(self.config),
            "updates": self.updates,
            "shuffle_state": self._random.getstate(),
            "entropy_coef": self.entropy_coef,
        }

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
        """Save policy + optimizer to the store under the policy's current version."""
        return store.checkpoints.save(
            run_id,
            self.policy.version,
            self.state_dict(),
            iteration=iteration,
            trained_on_iterations=trained_on_iterations,
            n_episodes=n_episodes,
            parent_policy_version=parent_policy_version,
            metadata={"policy": self.policy.name, "updates": self.updates, "trainer": self.kind},
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.policy.load_state_dict(state["policy"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.updates = int(state["updates"])
        # Checkpoints from before the weight could adapt hold none: it was the configured one.
        self.entropy_coef = float(state.get("entropy_coef", self.config.entropy_coef))
        shuffle_state = state.get("shuffle_state")
        if shuffle_state is not None:
            self._random.setstate(_as_random_state(shuffle_state))


def load_checkpoint(
    store: TrajectoryStore,
    run_id: str,
    policy_version: str,
    *,
    config: GRPOConfig | None = None,
    seed: int = 0,
) -> GRPOTrainer:
    """A trainer (and its policy) restored from a checkpoint `GRPOTrainer.save_checkpoint`
    wrote."""
    state, _ = store.checkpoints.load(run_id, policy_version)
    policy = CandidateScorerPolicy.from_state_dict(state["policy"], seed=seed)
    trainer = GRPOTrainer(policy, config or GRPOConfig(**state["config"]))
    trainer.load_state_dict(state)
    return trainer


def _as_random_state(state: Any) -> tuple[Any, ...]:
    # A state that went through torch.save/load comes back with lists where tuples were.
    version, internal, gauss = state
    return (version, tuple(internal), gauss)
