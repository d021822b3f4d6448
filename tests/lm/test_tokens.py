"""A trainer's input from stored turns: merged when each prompt extends the last, else per turn;
either way the sampled ids and only those carry the loss."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from training.lm.tokens import TurnTokens, extends_previous_turns, training_sequences

ids = st.lists(st.integers(0, 50_000), min_size=1, max_size=12).map(tuple)


@st.composite
def growing_conversations(draw: st.DrawFn) -> list[TurnTokens]:
    """Turns whose prompts extend the previous prompt + completion by new (tool) tokens."""
    turns, prompt = [], draw(ids)
    for _ in range(draw(st.integers(1, 5))):
        completion = draw(ids)
        logprobs = tuple(-float(i % 7) / 10 for i in range(len(completion)))
        turns.append(TurnTokens(prompt, completion, logprobs))
        prompt = prompt + completion + draw(ids)
    return turns


@given(growing_conversations())
def test_a_growing_conversation_is_one_sequence_whose_masked_ids_are_the_sampled_ones(
    turns: list[TurnTokens],
) -> None:
    assert extends_previous_turns(turns)
    (sequence,) = training_sequences(turns)
    assert sequence.input_ids == turns[-1].prompt_token_ids + turns[-1].completion_token_ids
    sampled = [i for i, m in zip(sequence.input_ids, sequence.loss_mask, strict=True) if m]
    assert sampled == [i for t in turns for i in t.completion_token_ids]
    logprobs = [p for p, m in zip(sequence.sampler_logprobs, sequence.loss_mask, strict=True) if m]
    assert logprobs == [p for t in turns for p in t.completion_logprobs]


def test_turns_whose_prompt_drifted_stay_apart() -> None:
    first = TurnTokens((1, 2), (3, 4), (-0.1, -0.2))
    # The template re-rendered the reply as (3, 5): not the ids the model sampled.
    second = TurnTokens((1, 2, 3, 5, 9), (7,), (-0.3,))
    assert not extends_previous_turns([first, second])
    one, two = training_sequences([first, second])
    assert (one.input_ids, one.loss_mask) == ((1, 2, 3, 4), (False, False, True, True))
    assert (two.input_ids, two.loss_mask) == ((1, 2, 3, 5, 9, 7), (False,) * 5 + (True,))
    assert two.sampler_logprobs[-1] == -0.3


def test_a_turn_left_out_of_the_loss_stays_as_context() -> None:
    first = TurnTokens((1, 2), (3, 4), (-0.1, -0.2))
    second = TurnTokens((1, 2, 3, 4, 8), (6,), (-0.3,))
    (merged,) = training_sequences([first, second], [False, True])
    assert merged.input_ids == (1, 2, 3, 4, 8, 6)
    assert merged.loss_mask == (False,) * 5 + (True,)
    drifted = TurnTokens((1, 2, 3, 5, 9), (7,), (-0.3,))
    (kept,) = training_sequences([first, drifted], [False, True])
    assert (kept.input_ids, kept.loss_mask) == ((1, 2, 3, 5, 9, 7), (False,) * 5 + (True,))
    with pytest.raises(ValueError, match="2 trained flags for 1 turns"):
        training_sequences([first], [True, False])
