"""The `openai:` policy's client against a scripted server over real HTTP: every tool call of a
reply, token ids and logprobs, retries that honour Retry-After, and one clear line per failure."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest
from scripted_chat_server import ScriptedChatServer, completion, tool_call

from rollyard.errors import EXIT_UNAVAILABLE, exit_code_for
from training.actions import History, InvalidCall, Observation, ReadFile, RunCommand, Submit
from training.errors import (
    ContextExhaustedError,
    PolicyServerError,
    PolicyUnavailableError,
)
from training.lm.conversation import NO_TOOL_CALL, TOOL_SCHEMAS
from training.lm.openai_policy import ClientSettings, OpenAIPolicy
from training.policy import ChatRecord


@pytest.fixture
def server() -> Iterator[ScriptedChatServer]:
    scripted = ScriptedChatServer()
    yield scripted
    scripted.close()


def make_policy(server: ScriptedChatServer, **client: object) -> OpenAIPolicy:
    settings = {"retry_backoff_s": 0.01, "timeout_s": 5.0, "max_retries": 2} | client
    return OpenAIPolicy(server.base_url, "served-model", client=ClientSettings(**settings))  # type: ignore[arg-type]


def test_every_tool_call_of_a_reply_is_an_action_in_order(server: ScriptedChatServer) -> None:
    server.answer(
        completion(
            tool_call("a", "run_command", {"command": "pytest -q"}),
            tool_call("b", "read_file", {"path": "calc.py"}),
            content="Let me look.",
            prompt_ids=(5, 6, 7),
            completion_ids=(40, 41, 42),
        )
    )
    policy = make_policy(server)
    policy.seed(7)
    decision = policy.act(History("Fix calc.py"))
    assert decision.actions == (RunCommand("pytest -q"), ReadFile("calc.py"))
    assert decision.call_ids == ("a", "b")
    record = decision.record
    assert isinstance(record, ChatRecord)
    assert record.prompt_token_ids == (5, 6, 7)
    assert record.completion_token_ids == (40, 41, 42)
    assert record.completion_logprobs == (-0.25, -0.25, -0.25)
    assert decision.logprob == pytest.approx(-0.75)
    assert json.loads(record.raw_message)["content"] == "Let me look."
    sent = server.requests[0]
    assert sent["tools"] == list(TOOL_SCHEMAS) and sent["tool_choice"] == "auto"
    assert sent["logprobs"] is True and sent["return_token_ids"] is True
    assert sent["seed"] == 7 and sent["temperature"] == 1.0


def test_ids_spelled_in_the_logprobs_are_read_when_no_token_ids_come(
    server: ScriptedChatServer,
) -> None:
    server.answer(
        completion(tool_call("a", "submit", {}), completion_ids=(9, 8), spell_ids_in_logprobs=True)
    )
    record = make_policy(server).act(History("x")).record
    assert isinstance(record, ChatRecord)
    assert record.completion_token_ids == (9, 8) and record.prompt_token_ids == ()


def test_observations_go_back_under_their_call_ids(server: ScriptedChatServer) -> None:
    server.answer(
        completion(
            tool_call("a", "run_command", {"command": "ls"}),
            tool_call("b", "read_file", {"path": "x"}),
        )
    )
    server.answer(completion(tool_call("c", "submit", {})))
    policy = make_policy(server)
    history = History("task")
    decision = policy.act(history)
    assert isinstance(decision.record, ChatRecord)
    for position, (action, call_id) in enumerate(
        zip(decision.actions, decision.call_ids, strict=True)
    ):
        history = history.append(
            action,
            Observation(f"out {call_id}", 0),
            call_id=call_id,
            reply_message=decision.record.raw_message if position == 0 else None,
        )
    policy.act(history)
    messages = server.requests[1]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "tool"]
    assert [c["id"] for c in messages[2]["tool_calls"]] == ["a", "b"]
    assert [(m["tool_call_id"], m["content"]) for m in messages[3:]] == [
        ("a", "out a"),
        ("b", "out b"),
    ]


def test_a_reply_without_a_tool_call_is_a_format_error_never_a_submit(
    server: ScriptedChatServer,
) -> None:
    server.answer(completion(content="I think it is done."))
    decision = make_policy(server).act(History("x"))
    assert decision.actions == (InvalidCall("", "I think it is done.", NO_TOOL_CALL),)
    assert not any(isinstance(a, Submit) for a in decision.actions)


def test_a_malformed_call_is_answered_under_its_id(server: ScriptedChatServer) -> None:
    server.answer(
        completion(
            tool_call("a", "rm_rf", {"path": "/"}),
            tool_call("b", "run_command", "{not json"),
            tool_call("c", "read_file", {"path": "ok.py"}),
        )
    )
    decision = make_policy(server).act(History("x"))
    first, second, third = decision.actions
    assert isinstance(first, InvalidCall) and "unknown tool 'rm_rf'" in first.error
    assert isinstance(second, InvalidCall) and "not valid JSON" in second.error
    assert third == ReadFile("ok.py")
    assert decision.call_ids == ("a", "b", "c")


def test_429_waits_as_long_as_retry_after_says(server: ScriptedChatServer) -> None:
    server.answer({"error": {"message": "busy"}}, status=429, headers={"Retry-After": "0.4"})
    server.answer(completion(tool_call("a", "submit", {})))
    started = time.monotonic()
    make_policy(server).act(History("x"))
    assert len(server.requests) == 2
    assert server.answered_at[1] - server.answered_at[0] >= 0.4
    assert time.monotonic() - started < 3


def test_retry_after_is_bounded(server: ScriptedChatServer) -> None:
    server.answer("", status=503, headers={"Retry-After": "3600"})
    server.answer(completion(tool_call("a", "submit", {})))
    started = time.monotonic()
    make_policy(server, max_retry_after_s=0.2).act(History("x"))
    assert 0.2 <= time.monotonic() - started < 5


def test_a_server_that_stays_down_is_unavailable_after_the_retries(
    server: ScriptedChatServer,
) -> None:
    for _ in range(3):
        server.answer({"error": {"message": "overloaded"}}, status=503)
    with pytest.raises(PolicyUnavailableError) as raised:
        make_policy(server, max_retries=2).act(History("x"))
    assert "failed 3 time(s); last: HTTP 503: overloaded" in str(raised.value)
    assert exit_code_for(raised.value) == EXIT_UNAVAILABLE


def test_a_400_for_tools_names_the_vllm_flags(server: ScriptedChatServer) -> None:
    server.answer(
        {
            "object": "error",
            "message": '"auto" tool choice requires --enable-auto-tool-choice and '
            "--tool-call-parser to be set",
            "type": "BadRequestError",
            "code": 400,
        },
        status=400,
    )
    with pytest.raises(PolicyServerError) as raised:
        make_policy(server).act(History("x"))
    message = str(raised.value)
    assert "cannot call tools" in message and "\n" not in message
    assert "start vLLM with --enable-auto-tool-choice --tool-call-parser" in message
    assert len(server.requests) == 1  # a 4xx is not retried


def test_a_reply_that_is_not_json_is_one_line(server: ScriptedChatServer) -> None:
    server.answer("<html>\n<body>Bad gateway page</body>\n</html>")
    with pytest.raises(PolicyServerError) as raised:
        make_policy(server).act(History("x"))
    message = str(raised.value)
    assert "not JSON" in message and "\n" not in message and "Bad gateway page" in message


def test_the_context_window_is_checked_before_the_request(server: ScriptedChatServer) -> None:
    policy = make_policy(server, context_tokens=300)
    # The first answer measures prompt tokens per byte of the messages sent; the next prompt's
    # length is estimated with it before the request goes out.
    server.answer(
        completion(tool_call("a", "run_command", {"command": "ls"}), prompt_ids=tuple(range(250)))
    )
    history = History("x")
    decision = policy.act(history)
    assert server.requests[0]["max_tokens"] == 512
    history = history.append(
        decision.action, Observation("y" * 2000, 0), call_id="a", reply_message=None
    )
    with pytest.raises(ContextExhaustedError, match="the model's context 300"):
        policy.act(history)
    assert len(server.requests) == 1  # it never went out


def test_a_context_error_from_the_server_ends_the_turn_as_exhausted(
    server: ScriptedChatServer,
) -> None:
    server.answer(
        {
            "object": "error",
            "message": "This model's maximum context length is 2048 tokens. However, you "
            "requested 2100 tokens. Please reduce the length of the messages.",
        },
        status=400,
    )
    with pytest.raises(ContextExhaustedError, match="maximum context length is 2048"):
        make_policy(server).act(History("x"))
