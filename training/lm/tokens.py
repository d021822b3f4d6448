"""A trainer's input from stored turns, token in / token out: never a re-tokenized text.

Each turn of a language-model episode stores the exact prompt ids the model read, the ids it
sampled and the sampler's logprob of each (`ChatRecord`, the steps table's `prompt_token_ids`,
`token_ids`, `logprobs`). The trainer's input is defined from those ids alone:

- per turn: `prompt_token_ids + completion_token_ids`, the loss on the completion only;
- merged, when every turn's prompt begins with the previous turn's prompt and completion (the
  prefix property: the chat template re-rendered the model's earlier replies to the very ids it
  sampled): the last turn's prompt and completion, the loss on every turn's completion span.

`training_sequences` merges when the prefix property holds and keeps turns apart otherwise, so
no token a model did not sample is ever trained as if it had (re-tokenization drift).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from training.actions import InvalidCall
from training.policy import ChatRecord
from training.trajectory import Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class TurnTokens:
    """One language-model turn as sampled."""

    prompt_token_ids: tuple[int, ...]
    completion_token_ids: tuple[int, ...]
    completion_logprobs: tuple[float, ...]

    def __post_init__(self) -> None:
        if len(self.completion_logprobs) != len(self.completion_token_ids):
            raise ValueError(
                f"a turn has {len(self.completion_token_ids)} sampled ids but "
                f"{len(self.completion_logprobs)} logprobs; the sampler's record is incomplete"
            )


TOKEN_ID_MAX = 2**31 - 1
"""The largest id the steps table's `int32` token columns hold."""
LOGPROB_MIN = -3.4e38
"""The most negative logprob the steps table's `float32` column holds as a finite number."""


def _problem_ids(ids: Sequence[object], what: str, vocab_size: int | None) -> str | None:
    limit = TOKEN_ID_MAX if vocab_size is None else vocab_size - 1
    for position, token in enumerate(ids):
        if not isinstance(token, int) or isinstance(token, bool) or not 0 <= token <= limit:
            where = "the int32 column" if vocab_size is None else f"a vocabulary of {vocab_size}"
            return f"{what} id {token!r} at position {position} is not an integer in 0..{limit} ({where})"
    return None


def sampled_tokens_problem(
    prompt_ids: Sequence[object],
    completion_ids: Sequence[object],
    logprobs: Sequence[object],
    *,
    vocab_size: int | None = None,
) -> str | None:
    """What makes a turn's token record unfit to store or train on, or None: an id that is
    not an integer in the tokenizer's range (or, the vocabulary unknown, the int32 column's),
    a logprob that is not a finite number <= 0 within float32, or sampled ids and logprobs of
    different lengths. A served answer is input: it is checked before anything keeps it."""
    for ids, what in ((prompt_ids, "prompt token"), (completion_ids, "completion token")):
        problem = _problem_ids(ids, what, vocab_size)
        if problem is not None:
            return problem
    for position, logprob in enumerate(logprobs):
        number = isinstance(logprob, int | float) and not isinstance(logprob, bool)
        if not number or not LOGPROB_MIN <= logprob <= 0.0:  # type: ignore[operator]
            return (
                f"logprob {logprob!r} at position {position} is not a finite number "
                f"in {LOGPROB_MIN:g}..0"
            )
    if completion_ids and len(logprobs) != len(completion_ids):
        return f"{len(completion_ids)} sampled token ids but {len(logprobs)} logprobs"
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class TrainingSequence:
    """What a token-level trainer feeds the model: ids, which of them were sampled (the loss
    mask) and the sampler's logprob at each sampled position (0.0 elsewhere)."""

    input_ids: tuple[int, ...]
    loss_mask: tuple[bool, ...]
    sampler_logprobs: tuple[float, ...]


def trajectory_turns(trajectory: Trajectory) -> list[TurnTokens]:
    """The turns of an episode in order, from its steps' `ChatRecord`s."""
    return [
        TurnTokens(r.prompt_token_ids, r.completion_token_ids, r.completion_logprobs)
        for r in (step.record for step in trajectory.steps)
        if isinstance(r, ChatRecord)
    ]


def stored_turns(step_rows: Iterable[Mapping[str, Any]]) -> list[TurnTokens]:
    """The turns of one episode from its rows of the steps table (any order): the rows that
    carry a turn's tokens, ordered by turn."""
    carrying = [row for row in step_rows if row.get("prompt_token_ids")]
    carrying.sort(key=lambda row: (row["turn"], row["step"]))
    return [
        TurnTokens(
            tuple(row["prompt_token_ids"]),
            tuple(row["token_ids"] or ()),
            tuple(row["logprobs"] or ()),
        )
        for row in carrying
    ]


def extends_previous_turns(turns: Sequence[TurnTokens]) -> bool:
    """Whether every turn's prompt begins with the previous turn's prompt and completion."""
    for before, after in itertools.pairwise(turns):
        sampled = before.prompt_token_ids + before.completion_token_ids
        if after.prompt_token_ids[: len(sampled)] != sampled:
            return False
    return True


def _sequence(ids: tuple[int, ...], spans: Sequence[tuple[int, TurnTokens]]) -> TrainingSequence:
    """`ids` with each turn's completion marked as sampled from its start position."""
    mask = [False] * len(ids)
    logprobs = [0.0] * len(ids)
    for start, turn in spans:
        for offset, logprob in enumerate(turn.completion_logprobs):
            mask[start + offset] = True
            logprobs[start + offset] = logprob
    return TrainingSequence(ids, tuple(mask), tuple(logprobs))


def training_sequences(
    turns: Sequence[TurnTokens], trained: Sequence[bool] | None = None
) -> list[TrainingSequence]:
    """One sequence for the episode when the prefix property holds, else one per turn.
    `trained[i]` False keeps turn i's completion out of the loss mask (it stays in the merged
    sequence as context for the turns after it); None trains every turn."""
    if not turns:
        return []
    keep = list(trained) if trained is not None else [True] * len(turns)
    if len(keep) != len(turns):
        raise ValueError(f"{len(keep)} trained flags for {len(turns)} turns")
    if extends_previous_turns(turns):
        last = turns[-1]
        ids = last.prompt_token_ids + last.completion_token_ids
        spans = [
            (len(turn.prompt_token_ids), turn) for turn, k in zip(turns, keep, strict=True) if k
        ]
        return [_sequence(ids, spans)]
    return [
        _sequence(
            turn.prompt_token_ids + turn.completion_token_ids,
            [(len(turn.prompt_token_ids), turn)],
        )
        for turn, k in zip(turns, keep, strict=True)
        if k
    ]


def malformed_turns(trajectory: Trajectory) -> list[bool]:
    """Per turn of `trajectory_turns`, whether the reply held no usable tool call (every action
    it made was an `InvalidCall`): a reply that changed nothing in the workspace."""
    actions: dict[int, list[object]] = {}
    for step in trajectory.steps:
        actions.setdefault(step.turn_index, []).append(step.action)
    return [
        all(isinstance(action, InvalidCall) for action in actions[step.turn_index])
        for step in trajectory.steps
        if isinstance(step.record, ChatRecord)
    ]
