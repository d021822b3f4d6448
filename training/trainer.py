"""The one trainer interface the loop talks to, and how a run's trainer is chosen and restored.

The loop (`training.iteration`, the train flow) samples with `trainer.policy`, hands each
iteration's committed batch to `trainer.update`, and saves `trainer.save_checkpoint` to the
store's checkpoints table with its lineage. Two trainers implement it, chosen by the policy spec:
`builtin` trains the candidate scorer (`training.builtin.grpo.GRPOTrainer`); `hf:DIR` trains a
transformers causal LM token by token (`training.lm.trainer.LMTrainer`), and so does
`openai:URL#MODEL` given the served model's weights (`trainer_model`), loading each update's LoRA
adapter into the server. Both trainers take their groups and masks from
`training.advantages.group_advantages`.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar, Protocol

from training.errors import TrainingSettingsError
from training.policy import Policy
from training.trajectory import Trajectory

if TYPE_CHECKING:
    from storage import CheckpointInfo, TrajectoryStore
    from training.lm.conversation import ChatSampling
    from training.lm.trainer import LMTrainerConfig


class TrainerMetrics(Protocol):
    """What one update did, as rows for the store's metrics table."""

    def as_dict(self) -> dict[str, float]: ...


class Trainer(abc.ABC):
    """Learns from batches of trajectories; its `policy` is what the rollout side acts with."""

    kind: ClassVar[str]
    """Recorded in every checkpoint's metadata (`trainer`), so a run resumes with its trainer."""
    updates: int
    """Calls of `update` that changed the policy (the policy's version counter)."""

    @property
    @abc.abstractmethod
    def policy(self) -> Policy:
        """The policy after the last update: what the next rollouts act with."""

    @abc.abstractmethod
    def update(self, trajectories: Sequence[Trajectory]) -> TrainerMetrics:
        """One update on one iteration's committed batch (any mix of statuses)."""

    @abc.abstractmethod
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
        """Record the trainer's state in the store's checkpoints table under the policy's
        current version (once: replaying it is a no-op), with its lineage."""


def new_trainer(
    policy_spec: str,
    *,
    seed: int,
    weights_dir: str | Path | None = None,
    lm_config: LMTrainerConfig | None = None,
    sampling: ChatSampling | None = None,
    trainer_model: str | Path | None = None,
) -> Trainer:
    """A fresh trainer for the policy a spec names. `weights_dir` is where an LM trainer writes
    each update's weights (an HF directory per version); `trainer_model` is the local copy of
    the weights an `openai:` server serves (trained as LoRA, adapters loaded into the server)."""
    from training.lm.spec import parse_policy_spec

    spec = parse_policy_spec(policy_spec)
    if spec.kind == "builtin":
        from training.builtin.grpo import GRPOConfig, GRPOTrainer
        from training.builtin.scorer_policy import CandidateScorerPolicy

        return GRPOTrainer(CandidateScorerPolicy(seed=seed), GRPOConfig(seed=seed))
    from training.lm.spec import check_model_dir
    from training.lm.trainer import LMTrainer, LMTrainerConfig, LoraSettings, ServedAdapters

    if weights_dir is None:
        raise TrainingSettingsError(f"training {policy_spec} needs a directory for new weights")
    config = lm_config or LMTrainerConfig(seed=seed)
    if spec.kind == "hf":
        assert spec.model_dir is not None
        check_model_dir(spec.model_dir)
        return LMTrainer.from_model_dir(
            spec.model_dir, weights_dir=weights_dir, config=config, sampling=sampling
        )
    assert spec.base_url is not None and spec.model is not None
    if trainer_model is None:
        raise TrainingSettingsError(
            f"training {policy_spec} needs the served model's weights on this machine: give "
            "--trainer-model DIR (the directory the server loaded)"
        )
    check_model_dir(trainer_model)
    if config.lora is None:
        config = dataclasses.replace(config, lora=LoraSettings())
    return LMTrainer.from_model_dir(
        trainer_model,
        weights_dir=weights_dir,
        config=config,
        sampling=sampling,
        served=ServedAdapters(spec.base_url, spec.model),
    )


def load_trainer(
    store: TrajectoryStore,
    run_id: str,
    policy_version: str,
    *,
    seed: int = 0,
    sampling: ChatSampling | None = None,
) -> Trainer:
    """The trainer (and its policy) a checkpoint of either trainer holds."""
    info = next(
        (c for c in store.checkpoints.recorded(run_id) if c.policy_version == policy_version),
        None,
    )
    kind = info.metadata.get("trainer", "builtin") if info is not None else "builtin"
    if kind == "lm":
        from training.lm.trainer import LMTrainer

        return LMTrainer.load_checkpoint(store, run_id, policy_version, sampling=sampling)
    from training.builtin.grpo import load_checkpoint

    return load_checkpoint(store, run_id, policy_version, seed=seed)
