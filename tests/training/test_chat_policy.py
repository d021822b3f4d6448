"""The OpenAI-compatible chat policy against a real HTTP server on loopback.

The server below is this suite's one stand-in: a small chat-completions endpoint speaking the
wire format (request JSON in, `choices[].message.tool_calls` and `logprobs` out), scripted per
test. Everything on the client side — httpx, retries, timeouts, parsing — is the real code.
"""

from __future__ import annotations

import json
import pickle
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from training.actions import History, Observation, ReadFile, RunCommand, Submit
from training.chat_policy import ChatPolicy, ChatPolicySettings
from training.errors import PolicyError, PolicyServerError
from training.policy import ChatRecord


class StandInServer:
    """Answers POST /v1/chat/completions with the next scripted (status, body, delay_s)."""

    def __init__(self) -> None:
        self.script: list[tuple[int, Any, float]] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                server.requests.append(json.loads(self.rfile.read(length)))
                server.headers.append(dict(self.headers))
                status, body, delay_s = server.script.pop(0) if server.script else (500, "empty", 0)
                time.sleep(delay_s)
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client timed out and left

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def completion(
    tool: str | None, arguments: dict[str, Any] | str | None = None, *, logprobs: bool = True
) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": None if tool else "All done."}
    if tool:
        args = arguments if isinstance(arguments, str) else json.dumps(arguments or {})
        message["tool_calls"] = [
            {"id": "call_9", "type": "function", "function": {"name": tool, "arguments": args}}
        ]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if tool else "stop",
    }
    if logprobs:
        choice["logprobs"] = {
            "content": [
                {"token": "token_id:11", "logprob": -0.5, "bytes": None, "top_logprobs": []},
                {"token": "token_id:12", "logprob": -0.25, "bytes": None, "top_logprobs": []},
            ]
        }
    return {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": "served-model",
        "choices": [choice],
        "prompt_token_ids": [1, 2, 3],
    }


@pytest.fixture
def server() -> Iterator[StandInServer]:
    stand_in = StandInServer()
    yield stand_in
    stand_in.close()


def settings(server: StandInServer, **changes: Any) -> ChatPolicySettings:
    values: dict[str, Any] = {
        "base_url": server.base_url,
        "model": "served-model",
        "api_key": "k-123",
        "retry_backoff_s": 0.01,
        "timeout_s": 2.0,
    }
    values.update(changes)
    return ChatPolicySettings(**values)


HISTORY = History("Fix calc.py").append(RunCommand("pytest -q"), Observation("1 failed", 1))


def test_tool_call_becomes_the_action_with_tokens_and_logprobs(server: StandInServer) -> None:
    server.script.append((200, completion("read_file", {"path": "calc.py"}), 0))
    policy = ChatPolicy(settings(server))
    policy.seed(7)
    decision = policy.act(HISTORY)

    assert decision.action == ReadFile("calc.py")
    assert decision.logprob == pytest.approx(-0.75)
    record = decision.record
    assert isinstance(record, ChatRecord)
    assert record.completion_token_ids == (11, 12) and record.prompt_token_ids == (1, 2, 3)
    assert record.finish_reason == "tool_calls" and record.model == "served-model"

    request = server.requests[0]
    assert (
        request["model"] == "served-model" and request["logprobs"] is True and request["seed"] == 7
    )
    assert [tool["function"]["name"] for tool in request["tools"]] == [
        "run_command",
        "read_file",
        "edit_file",
        "submit",
    ]
    roles = [message["role"] for message in request["messages"]]
    assert roles == ["system", "user", "assistant", "tool"]
    assert request["messages"][3]["content"] == "1 failed"
    assert server.headers[0]["Authorization"] == "Bearer k-123"
    policy.close()


def test_settings_come_from_the_environment(
    server: StandInServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_CHAT_BASE_URL", server.base_url)
    monkeypatch.setenv("ROLLYARD_CHAT_MODEL", "env-model")
    server.script.append((200, completion("submit", logprobs=False), 0))
    policy = ChatPolicy()
    assert policy.version == "chat:env-model"
    decision = policy.act(History("x"))
    assert decision.action == Submit() and decision.logprob is None
    assert server.requests[0]["model"] == "env-model"


def test_a_reply_without_tool_call_submits(server: StandInServer) -> None:
    server.script.append((200, completion(None), 0))
    assert ChatPolicy(settings(server)).act(HISTORY).action == Submit()


def test_retries_on_server_errors_and_timeouts_then_succeeds(server: StandInServer) -> None:
    server.script += [
        (503, "overloaded", 0),
        (200, completion("run_command", {"command": "ls"}), 1.0),  # slower than the timeout
        (200, completion("run_command", {"command": "ls"}), 0),
    ]
    policy = ChatPolicy(settings(server, timeout_s=0.3, max_retries=3))
    assert policy.act(HISTORY).action == RunCommand("ls")
    assert len(server.requests) == 3


def test_gives_up_after_retries_and_does_not_retry_client_errors(server: StandInServer) -> None:
    server.script += [(500, "boom", 0)] * 3
    with pytest.raises(PolicyServerError, match="failed 3 time") as raised:
        ChatPolicy(settings(server, max_retries=2)).act(HISTORY)
    assert raised.value.status_code == 500
    error = pickle.loads(pickle.dumps(raised.value))
    assert isinstance(error, PolicyServerError) and error.status_code == 500

    server.script.append((400, '{"error": "bad request"}', 0))
    with pytest.raises(PolicyServerError, match="not retried"):
        ChatPolicy(settings(server)).act(HISTORY)
    assert len(server.requests) == 4


def test_unusable_tool_calls_are_policy_errors(server: StandInServer) -> None:
    server.script += [
        (200, completion("delete_everything", {}), 0),
        (200, completion("read_file", "{not json"), 0),
        (200, {"object": "chat.completion"}, 0),
    ]
    policy = ChatPolicy(settings(server))
    with pytest.raises(PolicyError, match="unknown tool"):
        policy.act(HISTORY)
    with pytest.raises(PolicyError, match="not valid JSON"):
        policy.act(HISTORY)
    with pytest.raises(PolicyServerError, match="without `choices`"):
        policy.act(HISTORY)


def test_connection_refused_is_a_server_error_and_the_policy_pickles(server: StandInServer) -> None:
    base_url = server.base_url
    server.close()
    policy = ChatPolicy(ChatPolicySettings(base_url=base_url, max_retries=1, retry_backoff_s=0.01))
    with pytest.raises(PolicyServerError, match="ConnectError"):
        policy.act(HISTORY)
    copy = pickle.loads(pickle.dumps(policy))
    assert copy.version == policy.version
