"""The one trainer interface the loop talks to.

The loop (`training.iteration`, the train flow) samples with `trainer.policy`, hands each
iteration's committed batch to `trainer.update`, and saves `trainer.save_checkpoint` to the
store's checkpoints table with its lineage. Two trainers implement it, chosen by the policy spec
(`training.iteration.new_trainer`, `load_trainer`, `restore_trainer`):
`builtin` trains the candidate scorer (`training.builtin.grpo.GRPOTrainer`); `hf:DIR` trains a
transformers causal LM token by token (`training.lm.trainer.LMTrainer`), and so does
`openai:URL#MODEL` given the served model's weights (`trainer_model`), loading each update's LoRA
adapter into the server. Both trainers take their groups and masks from
`training.advantages.group_advantages`.
"""

from __future__ import annotations

import abc
from collections.abc import Sequence
from typing import TYPE_CHECKING, ClassVar, Protocol

from training.policy import Policy
from training.trajectory import Trajectory

if TYPE_CHECKING:
    from storage import CheckpointInfo, TrajectoryStore


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
