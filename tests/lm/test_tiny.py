"""The tiny model directory: it loads like any user's model, its tokenizer round-trips text, its
chat template renders tools and tool calls and reads back, and it acts with tool calls."""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from transformers import AutoModelForCausalLM, AutoTokenizer

from training.errors import ModelDirError
from training.lm.conversation import SYSTEM_PROMPT, TOOL_SCHEMAS
from training.lm.generate import LocalGenerator, SamplingParams, parse_tool_calls
from training.lm.tiny import (
    IM_END,
    SIGNATURES_CHAT_TEMPLATE,
    TOOL_CALL_END,
    TOOL_CALL_START,
    TinyModelSize,
    Transcript,
    build_tiny_model,
    context_dependent_tokens,
    phase_lr_factor,
    tool_call_transcripts,
    transcript_token_ids,
)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture(scope="module")
def untrained_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tokenizer of a freshly built tiny model (seconds: no fine-tune), for the tests of
    rendering and token bookkeeping, which need no trained weights."""
    size = TinyModelSize(hidden_size=32, intermediate_size=64, num_hidden_layers=1)
    return AutoTokenizer.from_pretrained(
        build_tiny_model(tmp_path_factory.mktemp("untrained") / "model", size=size)
    )


def test_model_dir_loads_with_plain_from_pretrained(tiny_model_dir: Path) -> None:
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (tiny_model_dir / name).is_file(), name
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    assert type(model).__name__ == "Qwen2ForCausalLM"
    parameters = sum(parameter.numel() for parameter in model.parameters())
    assert 100_000 < parameters <= 10_000_000
    assert tokenizer.chat_template
    assert tokenizer.eos_token == IM_END
    assert model.config.eos_token_id == tokenizer.eos_token_id
    # The tool-call tags are single tokens (vLLM's hermes parser looks them up) that stay in
    # decoded text, unlike the control tokens.
    for tag in (TOOL_CALL_START, TOOL_CALL_END):
        ids = tokenizer.encode(tag, add_special_tokens=False)
        assert len(ids) == 1
        assert tokenizer.decode(ids, skip_special_tokens=True) == tag


@settings(max_examples=60, deadline=None)
@given(text=st.text(max_size=200))
def test_tokenizer_round_trips_any_text(tokenizer: Any, text: str) -> None:
    ids = tokenizer.encode(text, add_special_tokens=False)
    # Byte-level BPE: nothing is unknown; Qwen2's NFC normalizer is the one change to the text.
    assert tokenizer.decode(ids) == unicodedata.normalize("NFC", text)


def test_tokenizer_round_trips_task_code_and_tool_call_json(tokenizer: Any) -> None:
    transcript = tool_call_transcripts(1, seed=5)[0]
    for message in transcript.messages:
        for text in [message.get("content") or ""] + [
            call["function"]["arguments"] for call in message.get("tool_calls") or ()
        ]:
            assert tokenizer.decode(tokenizer.encode(text, add_special_tokens=False)) == text


def test_chat_template_renders_tools_and_round_trips_tool_calls(tiny_model_dir: Path) -> None:
    generator = LocalGenerator.from_pretrained(tiny_model_dir)
    run_tests = {"command": "python -m pytest tests"}
    edit = {"path": "pkg/mod.py", "old_text": 'x = "a"\n', "new_text": "x = 'é'\n"}
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Fix the bug."},
        {
            "role": "assistant",
            "content": "Two things first.",
            "tool_calls": [
                # arguments as OpenAI sends them (JSON text) and as transformers users do (a dict)
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "run_command", "arguments": json.dumps(run_tests)},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "edit_file", "arguments": edit},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "1 failed\n[exit code 1]"},
        {"role": "tool", "tool_call_id": "call_b", "content": "edited pkg/mod.py"},
    ]
    text = generator.render(messages, TOOL_SCHEMAS, add_generation_prompt=True)
    for schema in TOOL_SCHEMAS:
        assert json.dumps(schema, ensure_ascii=False) in text
    assert SYSTEM_PROMPT in text
    assert text.count("<tool_response>") == 2
    assert text.endswith("<|im_start|>assistant\n")
    # The assistant turn reads back as the same content and calls.
    reply = text.split("<|im_start|>assistant\n")[1].split(IM_END)[0]
    content, calls, malformed = parse_tool_calls(reply)
    assert content == "Two things first."
    assert not malformed
    assert [(call.name, json.loads(call.arguments)) for call in calls] == [
        ("run_command", run_tests),
        ("edit_file", edit),
    ]
    assert len({call.id for call in calls}) == 2


def test_chat_template_renders_each_turn_as_the_previous_rendering_plus_the_new_one(
    tokenizer: Any,
) -> None:
    for transcript in tool_call_transcripts(3, seed=7):
        # Raises if a turn's rendering is not the previous one plus the new turn.
        ids, trained = transcript_token_ids(tokenizer, transcript)
        full = tokenizer.apply_chat_template(
            list(transcript.messages), tools=list(transcript.tools), tokenize=False
        )
        assert tokenizer.decode(ids) == full.removesuffix("\n")
        replies = tokenizer.decode([token for token, t in zip(ids, trained, strict=True) if t])
        assistant_turns = sum(1 for m in transcript.messages if m["role"] == "assistant")
        assert replies.count(IM_END) == assistant_turns


def test_the_signatures_template_declares_each_tool_in_one_line_and_renders_turns_alike(
    untrained_tokenizer: Any,
) -> None:
    tokenizer = untrained_tokenizer
    schemas_template = tokenizer.chat_template
    transcript = tool_call_transcripts(1, seed=7)[0]
    messages, tools = list(transcript.messages), list(transcript.tools)
    with_schemas = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
    try:
        tokenizer.chat_template = SIGNATURES_CHAT_TEMPLATE
        with_signatures = tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)
        ids, _ = transcript_token_ids(tokenizer, transcript)  # raises unless prefix-stable
    finally:
        tokenizer.chat_template = schemas_template
    system, _, conversation = with_signatures.partition("<|im_end|>\n")
    assert system.endswith(
        "Tools:\nrun_command(command)\nread_file(path)\nedit_file(path, old_text, new_text)\n"
        "submit()"
    )
    assert SYSTEM_PROMPT in system and "{" not in system
    # Everything after the system turn (instruction, calls, tool results) is rendered alike.
    assert with_schemas.endswith(conversation)
    assert len(ids) < len(transcript_token_ids(tokenizer, transcript)[0]) - 300


def test_build_refuses_an_unknown_tool_declaration(tmp_path: Path) -> None:
    with pytest.raises(ModelDirError, match=r"tool_declarations must be one of \['schemas'"):
        build_tiny_model(tmp_path / "model", tool_declarations="xml")
    assert not (tmp_path / "model").exists()


def _edit_transcript(instruction: str, file_text: str, old: str, new: str) -> Transcript:
    def call(name: str, arguments: dict[str, str]) -> dict[str, Any]:
        function = {"name": name, "arguments": json.dumps(arguments)}
        return {"role": "assistant", "content": "", "tool_calls": [{"function": function}]}

    edit = {"path": "app/settings.py", "old_text": old, "new_text": new}
    return Transcript(
        (
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": instruction},
            call("read_file", {"path": "app/settings.py"}),
            {"role": "tool", "content": file_text},
            call("edit_file", edit),
            {"role": "tool", "content": "edited app/settings.py"},
        ),
        TOOL_SCHEMAS,
    )


def test_context_dependent_tokens_are_those_only_the_prompt_decides(
    untrained_tokenizer: Any,
) -> None:
    tokenizer = untrained_tokenizer
    transcripts = [
        _edit_transcript(
            "Set `raw` to True.", "raw = False\ncopy = True\n", "raw = False\n", "raw = True\n"
        ),
        _edit_transcript(
            "Set `copy` to False.", "raw = False\ncopy = True\n", "copy = True\n", "copy = False\n"
        ),
    ]
    encoded = [transcript_token_ids(tokenizer, transcript) for transcript in transcripts]
    marked = context_dependent_tokens(encoded)
    for (ids, trained), dependent in zip(encoded, marked, strict=True):
        assert all(t for t, d in zip(trained, dependent, strict=True) if d)  # replies only
        texts = [tokenizer.decode([i]) for i, d in zip(ids, dependent, strict=True) if d]
        # The read_file turn is the same in both; in the edit, the first token that differs
        # is the flag's name (what follows it, the reply itself then decides).
        assert texts in (["raw"], ["copy"])
    assert context_dependent_tokens(encoded[:1]) == [[False] * len(encoded[0][0])]


def test_each_fine_tune_phase_warms_up_and_decays_on_its_own() -> None:
    two_phases = [phase_lr_factor(step, 40, 20) for step in range(40)]
    # the second phase starts again from a tenth of the rate, not from where the first ended
    assert two_phases[0] == two_phases[20] == pytest.approx(0.1)
    assert two_phases[:20] == two_phases[20:]  # two phases of 20 steps: one shape twice
    assert two_phases[19] < 0.01 and two_phases[39] < 0.01
    one_phase = [phase_lr_factor(step, 40, 0) for step in range(40)]
    assert one_phase[0] == pytest.approx(0.1) and one_phase[20] == pytest.approx(0.5)


def test_build_refuses_a_non_empty_directory(tmp_path: Path) -> None:
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "file").write_text("x")
    with pytest.raises(ModelDirError, match="not empty"):
        build_tiny_model(tmp_path / "taken")
    assert [path.name for path in tmp_path.iterdir()] == ["taken"]


def test_fine_tuned_model_answers_with_well_formed_tool_calls(tiny_model_dir: Path) -> None:
    generator = LocalGenerator.from_pretrained(tiny_model_dir)
    # Held-out conversations (another seed than the fine-tune's), cut before each assistant turn.
    prompts = []
    for transcript in tool_call_transcripts(4, seed=1234):
        messages = list(transcript.messages)
        for cut in (2, 4, 6):
            prompts.append(
                generator.prompt(
                    messages[:cut],
                    transcript.tools,
                    SamplingParams(temperature=1.0, seed=cut, max_tokens=160),
                )
            )
    completions = generator.generate_batch(prompts)
    well_formed = [
        c for c in completions if c.finish_reason == "tool_calls" and not c.malformed_tool_calls
    ]
    assert len(well_formed) >= 0.75 * len(completions), [c.text for c in completions]
    assert {call.name for c in well_formed for call in c.tool_calls} <= set(
        tool["function"]["name"] for tool in TOOL_SCHEMAS
    )
