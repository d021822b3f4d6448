"""What one episode produced: a frozen, picklable `Trajectory` with a stable id and a status.

A trajectory carries everything the trainer, the store and an external trainer need: the task id
and version, the snapshot digest, the policy version, every step (action, capped observation,
exit code, durations, log-probability and policy record) and the verifier's verdict, under one of
the statuses of `rollyard.status`. It converts to the store's `EpisodeRecord` / `StepRecord` rows.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

from rollyard.status import EpisodeStatus, check_reward, is_trainable
from training.actions import Action, History, Observation, action_to_json
from training.policy import ChatRecord, PolicyIdentity, PolicyRecord

if TYPE_CHECKING:
    from storage.records import EpisodeRecord, StepRecord

__all__ = ["EpisodeKey", "EpisodeStatus", "Step", "Trajectory"]


@dataclasses.dataclass(frozen=True, slots=True)
class EpisodeKey:
    """Where an episode sits in a run; its id is derived from this and the task id, so a replayed
    rollout gets the same id as the original."""

    run_id: str
    iteration: int
    group_index: int = 0
    """Which group of the iteration (one group = one task sampled G times)."""
    sample_index: int = 0
    """Which sample of its group."""
    attempt: int = 0
    """Retry number of the same sample after an infra failure."""

    def episode_id(self, task_id: str) -> str:
        from storage.records import episode_id_for

        return episode_id_for(
            self.run_id, self.iteration, task_id, self.group_index, self.sample_index, self.attempt
        )

    def group_id(self, task_id: str) -> str:
        """Samples of one group share it: the unit of group-relative advantages."""
        return f"{self.run_id}/{self.iteration}/{self.group_index}/{task_id}"

    def seed(self, base_seed: int, task_id: str) -> int:
        """The episode's sampling seed: a function of the run's seed and the episode id."""
        digest = hashlib.sha256(f"{base_seed}\x1f{self.episode_id(task_id)}".encode()).digest()
        return int.from_bytes(digest[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


@dataclasses.dataclass(frozen=True, slots=True)
class Step:
    """One action of an episode and what came back."""

    index: int
    action: Action
    observation: Observation
    duration_s: float
    """Time the environment took to carry out the action (sandbox execution, file I/O)."""
    policy_s: float
    """Time the policy took to choose it."""
    timed_out: bool = False
    """The command hit its per-step time limit."""
    logprob: float | None = None
    """log π of the decision this step's action belongs to; on the decision's first step only."""
    record: PolicyRecord | None = None
    """The policy's record of the decision (a chat turn's token ids); on its first step only."""
    turn: int | None = None
    """Which decision of the episode the action came from (a chat reply with several tool calls
    makes several steps of one turn); None means the step's own index."""
    call_id: str | None = None
    """A chat model's id for the tool call."""
    reply_message: str | None = None
    """A chat model's reply as it sent it (JSON), on the first step of the turn."""

    @property
    def turn_index(self) -> int:
        return self.index if self.turn is None else self.turn


@dataclasses.dataclass(frozen=True, slots=True)
class Trajectory:
    """One episode, end to end."""

    episode_id: str
    group_id: str
    key: EpisodeKey
    task_id: str
    task_version: str
    instruction: str
    snapshot_digest: str
    sandbox_backend: str
    policy_version: str
    status: EpisodeStatus
    steps: tuple[Step, ...]
    terminated: bool
    """The policy submitted."""
    truncated: bool
    """A budget ended the episode (max steps or wall clock)."""
    reward: float | None
    """The verifier's reward; None when there is no verdict (error statuses)."""
    partial_credit: float | None = None
    passed: bool | None = None
    fixed_fraction: float | None = None
    """Share of the task's fail-to-pass tests that pass after the episode (0 for an untouched
    workspace, unlike `partial_credit`, which counts the tests that passed all along)."""
    flags: tuple[str, ...] = ()
    """Reward-hack and guard flags the verifier raised."""
    rewards: Mapping[str, float] | None = None
    """The verifier's named rewards (a Harbor task's `reward.json`); `reward` is the primary one
    among them. None where the verifier named none or gave no verdict."""
    error: str | None = None
    """What went wrong, for every status but `ok`."""
    seed: int = 0
    wall_s: float = 0.0
    sandbox_s: float = 0.0
    policy_s: float = 0.0
    verify_s: float = 0.0
    started_at_s: float = 0.0
    """Unix time the episode started."""
    policy: PolicyIdentity | None = None
    """What acted (kind, model, sampling); `policy_version` repeats its version."""
    task_family: str | None = None

    def __post_init__(self) -> None:
        # The no-reward rule, where every trajectory is made: an infrastructure failure that
        # carried a 0 would teach the policy that the sandbox's crash was its fault.
        check_reward(self.status, self.reward)

    @property
    def trainable(self) -> bool:
        """The reward judges the policy: the trainer learns from this episode."""
        return is_trainable(self.status)

    def history(self) -> History:
        """The history as the policy saw it after the last step."""
        history = History(self.instruction)
        for step in self.steps:
            history = history.append(
                step.action,
                step.observation,
                call_id=step.call_id,
                reply_message=step.reply_message,
            )
        return history

    # -- store rows ----------------------------------------------------------------------------

    def to_episode_record(
        self, *, worker: str | None = None, policy_lag: int | None = None
    ) -> EpisodeRecord:
        from datetime import UTC, datetime

        from storage.records import EpisodeRecord

        started = datetime.fromtimestamp(self.started_at_s, UTC) if self.started_at_s else None
        finished = (
            datetime.fromtimestamp(self.started_at_s + self.wall_s, UTC)
            if self.started_at_s
            else None
        )
        return EpisodeRecord(
            episode_id=self.episode_id,
            run_id=self.key.run_id,
            iteration=self.key.iteration,
            task_id=self.task_id,
            task_version=self.task_version,
            policy_version=self.policy_version,
            snapshot_digest=self.snapshot_digest,
            sandbox_backend=self.sandbox_backend,
            status=str(self.status),
            group_index=self.key.group_index,
            sample_index=self.key.sample_index,
            attempt=self.key.attempt,
            policy_lag=policy_lag,
            reward=self.reward,
            partial_credit=self.partial_credit,
            passed=self.passed,
            flags=self.flags,
            terminated=self.terminated,
            truncated=self.truncated,
            n_steps=len(self.steps),
            started_at=started,
            finished_at=finished,
            wall_s=self.wall_s,
            sandbox_s=self.sandbox_s,
            policy_s=self.policy_s,
            verify_s=self.verify_s,
            worker=worker,
            error=self.error,
            policy_kind=self.policy.kind if self.policy else None,
            policy_model=self.policy.model if self.policy else None,
            sampling=self.policy.sampling if self.policy else None,
            task_family=self.task_family,
            instruction=self.instruction,
            fixed_fraction=self.fixed_fraction,
            rewards=dict(self.rewards) if self.rewards else None,
        )

    def to_step_records(self) -> list[StepRecord]:
        """One row per action. A chat turn's token ids, sampler logprobs and reply go on the
        turn's first row (`turn` groups the rows of one reply); the built-in policy's choice
        logprob goes in `logprobs` as one value."""
        from storage.records import StepRecord

        rows = []
        for step in self.steps:
            record = step.record
            chat = record if isinstance(record, ChatRecord) else None
            logprobs: tuple[float, ...] | None = None
            if chat is not None:
                logprobs = chat.completion_logprobs or None
            elif step.logprob is not None:
                logprobs = (step.logprob,)
            rows.append(
                StepRecord(
                    episode_id=self.episode_id,
                    step=step.index,
                    action_kind=step.action.tool,
                    action_text=action_to_json(step.action),
                    observation=step.observation.text,
                    exit_code=step.observation.exit_code,
                    duration_s=step.duration_s,
                    token_ids=(chat.completion_token_ids or None) if chat else None,
                    logprobs=logprobs,
                    turn=step.turn_index,
                    tool_call_id=step.call_id,
                    prompt_token_ids=(chat.prompt_token_ids or None) if chat else None,
                    finish_reason=chat.finish_reason if chat else None,
                    reply_message=step.reply_message,
                )
            )
        return rows
