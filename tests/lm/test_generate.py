"""The in-process generation core: seeded sampling, sampler log-probabilities that a forward pass
recomputes, padded batches equal to single requests, the context check, tool-call parsing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from training.errors import ContextLengthError
from training.lm.generate import (
    LocalGenerator,
    SamplingParams,
    parse_tool_calls,
)
from training.lm.tiny import tool_call_transcripts


@pytest.fixture(scope="module")
def generator(tiny_model_dir: Path) -> LocalGenerator:
    return LocalGenerator.from_pretrained(tiny_model_dir)


def _conversations(count: int) -> list[tuple[list[dict[str, object]], list[dict[str, object]]]]:
    """Held-out conversations of different lengths, each cut before an assistant turn."""
    conversations = []
    for number, transcript in enumerate(tool_call_transcripts(count, seed=4321)):
        cut = 2 + 2 * (number % 3)
        conversations.append((list(transcript.messages[:cut]), list(transcript.tools)))
    return conversations


def _recomputed_logprobs(
    generator: LocalGenerator, prompt_ids: tuple[int, ...], completion_ids: tuple[int, ...]
) -> torch.Tensor:
    """Log-softmax of one unbatched, uncached forward pass over prompt + completion: what a
    trainer computes for the sampled tokens."""
    ids = torch.tensor([list(prompt_ids) + list(completion_ids)])
    with torch.no_grad():
        logits = generator.model(input_ids=ids).logits[0].float()
    start = len(prompt_ids) - 1
    return logits[start : start + len(completion_ids)]


def test_seeded_generation_is_reproducible(generator: LocalGenerator) -> None:
    messages, tools = _conversations(1)[0]
    sampling = SamplingParams(temperature=1.0, seed=11, max_tokens=40)
    first = generator.generate(messages, tools, sampling)
    second = generator.generate(messages, tools, sampling)
    assert first.token_ids == second.token_ids
    assert first.logprobs == second.logprobs
    assert first.prompt_token_ids == second.prompt_token_ids
    others = {
        generator.generate(
            messages, tools, SamplingParams(temperature=1.5, seed=seed, max_tokens=40)
        ).token_ids
        for seed in (1, 2, 3)
    }
    assert len(others) > 1, "different seeds should draw different tokens at temperature 1.5"


def test_sampler_logprobs_equal_a_forward_pass_at_temperature_1(generator: LocalGenerator) -> None:
    messages, tools = _conversations(1)[0]
    completion = generator.generate(
        messages, tools, SamplingParams(temperature=1.0, seed=3, max_tokens=48)
    )
    logits = _recomputed_logprobs(generator, completion.prompt_token_ids, completion.token_ids)
    recomputed = torch.log_softmax(logits, dim=-1)
    sampled = torch.tensor(completion.token_ids)
    expected = recomputed.gather(1, sampled[:, None])[:, 0]
    assert torch.allclose(torch.tensor(completion.logprobs), expected, atol=1e-4, rtol=0)


def test_logprobs_are_of_the_tempered_nucleus_distribution(generator: LocalGenerator) -> None:
    messages, tools = _conversations(1)[0]
    temperature, top_p = 0.7, 0.8
    completion = generator.generate(
        messages,
        tools,
        SamplingParams(temperature=temperature, top_p=top_p, seed=5, max_tokens=32, top_logprobs=3),
    )
    logits = _recomputed_logprobs(generator, completion.prompt_token_ids, completion.token_ids)
    for position, token in enumerate(completion.token_ids):
        probs = torch.softmax(logits[position] / temperature, dim=-1)
        ordered, order = torch.sort(probs, descending=True)
        keep = order[(ordered.cumsum(0) - ordered) < top_p]
        assert token in set(keep.tolist()), "a token outside the nucleus was sampled"
        expected = torch.log(probs[token] / probs[keep].sum())
        assert completion.logprobs[position] == pytest.approx(float(expected), abs=1e-4)
        alternatives = completion.top_logprobs[position]
        assert [alt.token_id for alt in alternatives] == order[: len(alternatives)].tolist()
        assert 1 <= len(alternatives) <= 3


def test_a_padded_batch_gives_each_request_what_it_gets_alone(generator: LocalGenerator) -> None:
    prompts = [
        generator.prompt(messages, tools, SamplingParams(seed=index, max_tokens=12 + 6 * index))
        for index, (messages, tools) in enumerate(_conversations(3))
    ]
    assert len({len(prompt.token_ids) for prompt in prompts}) == 3, "lengths must differ"
    batched = generator.generate_batch(prompts)
    for prompt, together in zip(prompts, batched, strict=True):
        alone = generator.generate_batch([prompt])[0]
        assert together.prompt_token_ids == prompt.token_ids
        assert together.token_ids == alone.token_ids
        assert together.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        assert together.finish_reason == alone.finish_reason


def test_greedy_reply_stops_with_the_end_token_and_reads_as_tool_calls(
    generator: LocalGenerator,
) -> None:
    messages, tools = _conversations(1)[0]
    completion = generator.generate(messages, tools, SamplingParams(temperature=0, max_tokens=200))
    assert completion.finish_reason == "tool_calls", completion.text
    assert completion.token_ids[-1] in generator.stop_token_ids
    assert generator.tokenizer.decode(completion.token_ids[:-1]) == completion.text
    # The reply is exactly what the template renders for it: turns concatenate with no drift.
    assistant = {
        "role": "assistant",
        "content": completion.content,
        "tool_calls": [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in completion.tool_calls
        ],
    }
    rendered = generator.render([*messages, assistant], tools, add_generation_prompt=False)
    prompt_and_reply = generator.tokenizer.decode(
        completion.prompt_token_ids + completion.token_ids
    )
    assert rendered == prompt_and_reply + "\n"


def test_max_tokens_ends_a_reply_with_length(generator: LocalGenerator) -> None:
    messages, tools = _conversations(1)[0]
    completion = generator.generate(messages, tools, SamplingParams(seed=0, max_tokens=3))
    assert completion.finish_reason == "length"
    assert len(completion.token_ids) == len(completion.logprobs) == 3


def test_prompt_from_token_ids_generates_as_the_prompt_from_messages(
    generator: LocalGenerator,
) -> None:
    messages, tools = _conversations(1)[0]
    sampling = SamplingParams(seed=9, max_tokens=20)
    from_messages = generator.prompt(messages, tools, sampling)
    from_ids = generator.prompt_from_token_ids(from_messages.token_ids, sampling)
    assert from_ids == from_messages
    assert generator.tokenizer.decode(from_ids.token_ids) == generator.render(messages, tools)


def test_a_prompt_over_the_context_raises_before_generating(generator: LocalGenerator) -> None:
    too_long = [{"role": "user", "content": "word " * (generator.max_context_tokens + 10)}]
    with pytest.raises(ContextLengthError, match="maximum context length") as raised:
        generator.prompt(too_long)
    assert raised.value.max_context_tokens == generator.max_context_tokens
    assert raised.value.prompt_tokens > generator.max_context_tokens
    fits = [{"role": "user", "content": "hello"}]
    prompt = generator.prompt(fits)
    assert prompt.max_tokens == generator.max_context_tokens - len(prompt.token_ids)
    with pytest.raises(ContextLengthError, match="lower max_tokens"):
        generator.prompt(fits, sampling=SamplingParams(max_tokens=generator.max_context_tokens))


def test_sampling_parameters_are_checked() -> None:
    for bad in (
        {"temperature": -0.1},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"max_tokens": 0},
        {"top_logprobs": 21},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingParams(**bad)  # type: ignore[arg-type]


def test_parse_tool_calls_reports_every_block_and_each_malformed_one() -> None:
    text = (
        "Let me look.\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.py"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "run_command", "arguments": "{\\"command\\": \\"ls\\"}"}\n</tool_call>\n'
        '<tool_call>\n{"name": "edit_file", "arguments": {"path": \n</tool_call>\n'
        '<tool_call>\n["not", "an", "object"]\n</tool_call>\n'
        '<tool_call>\n{"name": "submit", "arguments": [1]}\n</tool_call>\n'
        '<tool_call>\n{"name": "submit", "argu'
    )
    content, calls, malformed = parse_tool_calls(text)
    assert content == "Let me look."
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("read_file", {"path": "a.py"}),
        ("run_command", {"command": "ls"}),
    ]
    assert all(call.id.startswith("call_") for call in calls)
    assert [problem.error.split(" (")[0] for problem in malformed] == [
        "not valid JSON",
        'needs a JSON object with a string "name"',
        '"arguments" must be a JSON object',
        "the <tool_call> block is never closed",
    ]
    assert parse_tool_calls("just text") == ("just text", (), ())
