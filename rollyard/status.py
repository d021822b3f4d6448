"""Every way an episode can end, which of those judge the policy, and the no-reward rule.

This is the one definition: the verifier, the episode runner, the store's schemas, the quality
gates and the trainers all import it. The rule that matters: only a *trainable* status carries a
reward the trainer learns from; an *infrastructure* status (the sandbox, the verifier, the task or
the policy's server failed) carries no reward at all — never a 0 — and its GRPO group is masked.
The second rule: whatever an agent does ends in a status of `AGENT_STATUSES`, all trainable, so a
failing agent cannot escape its penalty by breaking something, nor wipe its siblings' signal.
"""

from __future__ import annotations

import enum


class EpisodeStatus(enum.StrEnum):
    """How an episode ended."""

    OK = "ok"
    """The policy submitted or used up its step budget, and the verifier scored the workspace."""
    TIMEOUT = "timeout"
    """A budget the policy spent ran out (the episode's wall clock, or a test run's time or
    memory limit inside the verifier): the policy's doing, so the workspace is still scored."""
    POLICY_ERROR = "policy_error"
    """The policy raised (its model crashed, its server rejected a request or answered
    something that is not a chat completion). Never for what a model wrote: a reply's
    malformed or unoffered tool calls are observations, then `format_error`."""
    INFRA_ERROR = "infra_error"
    """The sandbox failed underneath the episode (reset, execute, read, write), or the policy's
    model server stopped answering (unreachable, 5xx or 429 after every retry, no complete
    answer within the request deadline) or answered a token record that cannot be kept (ids
    out of range, logprobs not finite and <= 0): the recovery path runs such an episode again."""
    VERIFIER_ERROR = "verifier_error"
    """The verifier crashed or could not produce a verdict (no report, no reward file)."""
    TASK_ERROR = "task_error"
    """The verifier judged the task itself broken (its tests do not run as declared)."""
    FORMAT_ERROR = "format_error"
    """A language-model policy sent more replies without a usable tool call than its format
    budget allows (`EpisodeConfig.max_format_errors`): the policy's doing, so the workspace is
    still scored and the episode trains (it is how a model learns to call its tools)."""
    CONTEXT_EXHAUSTED = "context_exhausted"
    """The conversation no longer fit the model's context window (prompt plus the least
    completion worth asking for): a budget the policy spent, like `timeout`, so the workspace is
    still scored and the episode trains."""


TRAINABLE_STATUSES: frozenset[EpisodeStatus] = frozenset(
    {
        EpisodeStatus.OK,
        EpisodeStatus.TIMEOUT,
        EpisodeStatus.FORMAT_ERROR,
        EpisodeStatus.CONTEXT_EXHAUSTED,
    }
)
"""Statuses whose reward judges the policy: they must carry a finite reward."""

INFRASTRUCTURE_STATUSES: frozenset[EpisodeStatus] = frozenset(EpisodeStatus) - TRAINABLE_STATUSES
"""Statuses where the environment, not the policy, decided: they must carry no reward."""

AGENT_STATUSES: frozenset[EpisodeStatus] = frozenset(
    {
        EpisodeStatus.OK,
        EpisodeStatus.TIMEOUT,
        EpisodeStatus.FORMAT_ERROR,
        EpisodeStatus.CONTEXT_EXHAUSTED,
    }
)
"""Statuses an agent's own doing can end an episode with — whatever bytes its replies hold, its
tool calls ask for or its commands leave in the workspace. Every one is trainable (none is
masked): an agent's failure is scored as its own, never laundered into an infrastructure status."""
if not AGENT_STATUSES <= TRAINABLE_STATUSES:  # the rule itself, checked where it is stated
    raise AssertionError("every status an agent can cause must be trainable")

ALL_STATUSES: tuple[str, ...] = tuple(status.value for status in EpisodeStatus)
"""Every status's name, in declaration order (the store's schema and the gates use these)."""


def is_trainable(status: str) -> bool:
    """True when an episode that ended with `status` carries a reward the trainer learns from."""
    return status in TRAINABLE_STATUSES


def check_reward(status: str, reward: float | None) -> None:
    """Raise `ValueError` when a status and a reward break the no-reward rule."""
    if status not in ALL_STATUSES:
        raise ValueError(f"unknown episode status {status!r}; expected one of {ALL_STATUSES}")
    if is_trainable(status) and reward is None:
        raise ValueError(f"status {status!r} judges the policy and needs a reward")
    if not is_trainable(status) and reward is not None:
        raise ValueError(f"status {status!r} is an infrastructure failure and carries no reward")
