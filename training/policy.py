"""The one policy interface: given the history so far, decide the next actions.

A policy returns a `Decision`: the actions to carry out in order (one for the built-in policy;
every tool call of a reply for a chat model), the log-probability of the decision when the policy
has one, and a record of what the trainer needs to learn from it (`ScorerRecord` for the built-in
torch policy, `ChatRecord` with the exact token ids and sampler logprobs for a language model).
Decisions are frozen values so trajectories pickle across Dask workers unchanged.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import pickle
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

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
    """One language-model turn, token in and token out: what a trainer needs to learn from it
    without re-tokenizing any text (empty tuples where a server sent no ids)."""

    model: str
    prompt_token_ids: tuple[int, ...] = ()
    """The exact ids of the prompt the model read (chat template applied)."""
    completion_token_ids: tuple[int, ...] = ()
    """The ids the model sampled, in order."""
    completion_logprobs: tuple[float, ...] = ()
    """The sampler's log-probability of each sampled id (same length as the ids)."""
    finish_reason: str | None = None
    raw_message: str = ""
    """The assistant message as JSON (`content`, `tool_calls`), so a trainer can replay it."""


PolicyRecord = ScorerRecord | ChatRecord


@dataclasses.dataclass(frozen=True, slots=True)
class Decision:
    """A policy's decision for one turn: the actions to carry out, in order."""

    actions: tuple[Action, ...]
    logprob: float | None = None
    """log π(decision | history) under the policy that chose it; None when it has none."""
    record: PolicyRecord | None = None
    call_ids: tuple[str, ...] = ()
    """A chat model's id for each action's tool call (one per action), empty otherwise."""

    def __post_init__(self) -> None:
        if not self.actions:
            raise ValueError("a decision carries at least one action")
        if self.call_ids and len(self.call_ids) != len(self.actions):
            raise ValueError(
                f"a decision with {len(self.actions)} action(s) has {len(self.call_ids)} call ids"
            )

    @property
    def action(self) -> Action:
        """The decision's only action (for policies that take one per turn)."""
        if len(self.actions) != 1:
            raise ValueError(f"this decision carries {len(self.actions)} actions, not one")
        return self.actions[0]


@dataclasses.dataclass(frozen=True, slots=True)
class PolicyIdentity:
    """What acted, recorded with every episode."""

    kind: str
    """`builtin`, `openai`, `hf`, or another policy class's `kind`."""
    version: str
    """The exact parameters acting: a weights digest or an update count."""
    model: str | None = None
    """The model's name (a served model's id, a model directory's name)."""
    sampling: str | None = None
    """The sampling parameters as JSON (temperature, top_p, max_tokens, ...)."""

    @staticmethod
    def sampling_json(parameters: Mapping[str, Any]) -> str:
        return json.dumps(dict(parameters), sort_keys=True, separators=(",", ":"))


class Policy(abc.ABC):
    """Decides the next actions from the history. Implementations are picklable."""

    kind: ClassVar[str] = "custom"
    """Recorded with every episode (`PolicyIdentity.kind`)."""

    @property
    @abc.abstractmethod
    def version(self) -> str:
        """Names the exact parameters acting (e.g. `candidate-scorer@3`), stored with every
        trajectory so a reward can be traced to the policy that earned it."""

    @abc.abstractmethod
    def act(self, history: History) -> Decision:
        """Decide the next actions. Raises `PolicyError` when none can be chosen."""

    def identity(self) -> PolicyIdentity:
        """What acted (kind, model, version, sampling), recorded with every episode."""
        return PolicyIdentity(kind=self.kind, version=self.version)

    def fork(self) -> Policy:
        """A policy that acts like this one, for an episode in flight beside others: its own
        sampling state (`seed`), so concurrent episodes stay reproducible. The default is a
        pickled copy; policies holding a shared client or model override it to share them."""
        copy: Policy = pickle.loads(pickle.dumps(self))
        return copy

    def seed(self, seed: int) -> None:  # noqa: B027 - optional hook; deterministic policies ignore it
        """Reseed the policy's sampling; the episode runner calls it once per episode so a
        sampled episode is reproducible from its id."""

    def close(self) -> None:  # noqa: B027 - optional hook; most policies hold nothing
        """Release what the policy holds (HTTP connections); idempotent."""


class ScriptedPolicy(Policy):
    """Replays a fixed sequence of actions, then submits: for tests, and to replay a stored
    trajectory's actions against a changed environment. Has no logprobs."""

    kind = "scripted"

    def __init__(self, actions: Sequence[Action], *, version: str = "scripted") -> None:
        self.actions = tuple(actions)
        self._version = version

    @property
    def version(self) -> str:
        return self._version

    def act(self, history: History) -> Decision:
        if history.step_count < len(self.actions):
            return Decision((self.actions[history.step_count],))
        return Decision((Submit(),))
