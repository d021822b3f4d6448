"""The one policy interface: given the history so far, choose the next action.

A policy returns a `Decision`: the action, the log-probability of choosing it when the policy
has one, and a record of what the trainer needs to recompute that log-probability later
(`ScorerRecord` for the built-in torch policy, `ChatRecord` with token ids/logprobs for a served
model). Decisions are frozen values so trajectories pickle across Dask workers unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence

from training.actions import Action, History, Submit


@dataclasses.dataclass(frozen=True, slots=True)
class ScorerRecord:
    """What the candidate-scoring policy saw at one step: enough to recompute the logprob."""

    features: tuple[tuple[float, ...], ...]
    """One feature row per candidate action, in the order they were scored."""
    chosen_index: int
    """Which candidate was taken."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChatRecord:
    """What a chat model returned for one step (empty tuples where the server sent none)."""

    model: str
    completion_token_ids: tuple[int, ...] = ()
    completion_tokens: tuple[str, ...] = ()
    completion_logprobs: tuple[float, ...] = ()
    prompt_token_ids: tuple[int, ...] = ()
    finish_reason: str | None = None
    raw_message: str = ""
    """The assistant message as JSON, so an external trainer can replay it exactly."""


PolicyRecord = ScorerRecord | ChatRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """A policy's choice for one step."""

    action: Action
    logprob: float | None = None
    """log π(action | history) under the policy that chose it; None when it has none."""
    record: PolicyRecord | None = None


class Policy(abc.ABC):
    """Chooses the next action from the history. Implementations are picklable."""

    @property
    @abc.abstractmethod
    def version(self) -> str:
        """Names the exact parameters acting (e.g. `candidate-scorer@3`), stored with every
        trajectory so a reward can be traced to the policy that earned it."""

    @abc.abstractmethod
    def act(self, history: History) -> Decision:
        """Choose the next action. Raises `PolicyError` when no action can be chosen."""

    def seed(self, seed: int) -> None:  # noqa: B027 - optional hook; deterministic policies ignore it
        """Reseed the policy's sampling; the episode runner calls it once per episode so a
        sampled episode is reproducible from its id."""

    def close(self) -> None:  # noqa: B027 - optional hook; most policies hold nothing
        """Release what the policy holds (HTTP connections); idempotent."""


class ScriptedPolicy(Policy):
    """Replays a fixed sequence of actions, then submits: for tests, and to replay a stored
    trajectory's actions against a changed environment. Has no logprobs."""

    def __init__(self, actions: Sequence[Action], *, version: str = "scripted") -> None:
        self.actions = tuple(actions)
        self._version = version

    @property
    def version(self) -> str:
        return self._version

    def act(self, history: History) -> Decision:
        if history.step_count < len(self.actions):
            return Decision(self.actions[history.step_count])
        return Decision(Submit())
