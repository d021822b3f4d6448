"""The streaming mode's experience buffer: finished GRPO groups arrive in any order, the trainer
takes a batch as soon as one is full, and the staleness bound is enforced per group.

Rules (the train flow's streaming mode, `flows.streaming.train_streaming`, follows them):

- A group is admitted whole (all its samples finished) and waits in arrival order; a partial
  batch stays in the buffer across updates (carried over), it is never padded or flushed.
- A group's lag is the trainer's update count when it is trained on minus the count when it was
  planned (the policy it acted with). A group whose lag would exceed `max_policy_lag` is dropped
  when the next batch is taken: it is committed with the batch it was dropped from (its
  episodes are data, kept once like every other), never trained on, and counted.
- A batch becomes one store iteration: its groups are re-keyed to (run, step, slot) so group
  indices are unique within the step, and committed in one exactly-once shard.
"""

from __future__ import annotations

import dataclasses
from collections import deque

from storage import CommitResult, TrajectoryStore
from training.errors import TrainingSettingsError
from training.trajectory import EpisodeKey, Trajectory

STREAM_SHARD = 0
"""A streaming step commits all its groups as this one shard of its iteration: all or nothing."""


@dataclasses.dataclass(frozen=True, slots=True)
class CompletedGroup:
    """One group whose samples all finished, as it arrived from a worker."""

    trajectories: tuple[Trajectory, ...]
    planned_at_update: int
    """The trainer's update count when the group was planned: its policy."""
    worker: str
    """Where it ran (recorded on its episodes)."""

    def __post_init__(self) -> None:
        if not self.trajectories:
            raise TrainingSettingsError("a completed group needs at least one trajectory")

    def lag_at(self, trainer_updates: int) -> int:
        """Updates the trainer is ahead of this group's policy at `trainer_updates`."""
        return trainer_updates - self.planned_at_update


@dataclasses.dataclass(frozen=True, slots=True)
class StreamBatch:
    """What one training step consumes: `trained` groups (at most `max_policy_lag` behind) and
    the `stale` groups dropped on the way, both committed under the step."""

    trained: tuple[CompletedGroup, ...]
    stale: tuple[CompletedGroup, ...]
    trainer_updates: int
    """The trainer's update count the lags are measured against."""

    @property
    def groups(self) -> tuple[CompletedGroup, ...]:
        return self.trained + self.stale

    @property
    def max_policy_lag(self) -> int:
        return max((g.lag_at(self.trainer_updates) for g in self.trained), default=0)

    @property
    def stale_episodes(self) -> int:
        return sum(len(g.trajectories) for g in self.stale)


class StreamBuffer:
    """Completed groups waiting to be trained on, oldest first (see the module's rules)."""

    def __init__(self, *, batch_groups: int, max_policy_lag: int) -> None:
        if batch_groups < 1:
            raise TrainingSettingsError(f"batch_groups must be >= 1, got {batch_groups}")
        if max_policy_lag < 0:
            raise TrainingSettingsError(f"max_policy_lag must be >= 0, got {max_policy_lag}")
        self.batch_groups = batch_groups
        self.max_policy_lag = max_policy_lag
        self._waiting: deque[CompletedGroup] = deque()
        self._stale: list[CompletedGroup] = []

    def __len__(self) -> int:
        """Groups waiting (stale ones not yet committed included)."""
        return len(self._waiting) + len(self._stale)

    def add(self, group: CompletedGroup) -> None:
        self._waiting.append(group)

    def take_batch(self, trainer_updates: int) -> StreamBatch | None:
        """The next batch if `batch_groups` fresh groups are waiting, else None (the fresh ones
        wait on; the stale ones found meanwhile ride along with the next batch)."""
        fresh: deque[CompletedGroup] = deque()
        for group in self._waiting:
            if group.lag_at(trainer_updates) > self.max_policy_lag:
                self._stale.append(group)
            else:
                fresh.append(group)
        self._waiting = fresh
        if len(fresh) < self.batch_groups:
            return None
        trained = tuple(fresh.popleft() for _ in range(self.batch_groups))
        stale, self._stale = tuple(self._stale), []
        return StreamBatch(trained, stale, trainer_updates)


def rekey_for_step(trajectory: Trajectory, *, run_id: str, step: int, slot: int) -> Trajectory:
    """`trajectory` as episode (run, step, group `slot`) of a streaming step: its id and group id
    follow the new key; what it did (and the seed it sampled with) is unchanged."""
    key = EpisodeKey(
        run_id,
        step,
        group_index=slot,
        sample_index=trajectory.key.sample_index,
        attempt=trajectory.key.attempt,
    )
    return dataclasses.replace(
        trajectory,
        key=key,
        episode_id=key.episode_id(trajectory.task_id),
        group_id=key.group_id(trajectory.task_id),
    )


def step_groups(batch: StreamBatch, *, run_id: str, step: int) -> list[list[Trajectory]]:
    """The batch's groups re-keyed for the step's iteration, in `batch.groups` order (the
    trained ones first)."""
    return [
        [rekey_for_step(t, run_id=run_id, step=step, slot=slot) for t in group.trajectories]
        for slot, group in enumerate(batch.groups)
    ]


def commit_step(
    store: TrajectoryStore, batch: StreamBatch, *, run_id: str, step: int
) -> tuple[list[Trajectory], list[Trajectory], CommitResult]:
    """Commit a step's groups, each episode with its group's lag, as one exactly-once shard.
    Returns (every trajectory of the step, the part to train on, the commit's result)."""
    groups = step_groups(batch, run_id=run_id, step=step)
    episodes = [
        trajectory.to_episode_record(
            worker=group.worker, policy_lag=group.lag_at(batch.trainer_updates)
        )
        for group, trajectories in zip(batch.groups, groups, strict=True)
        for trajectory in trajectories
    ]
    steps = [
        record for trajectories in groups for t in trajectories for record in t.to_step_records()
    ]
    result = store.commit_iteration_shard(
        run_id, step, STREAM_SHARD, episodes=episodes, steps=steps
    )
    every = [t for trajectories in groups for t in trajectories]
    trained = [t for trajectories in groups[: len(batch.trained)] for t in trajectories]
    return every, trained, result
