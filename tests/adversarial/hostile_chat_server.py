"""A hostile OpenAI-compatible server on loopback: each episode it answers gets one mode, one
class of hostile answer (NUL bytes, lone surrogates, 5,000-deep JSON, tool calls that are not
objects, tools that were not offered, a 50 MB reply, bad token ids or logprobs, a trickle).

An episode is told apart by its task's instruction (the prompt's first user message), so every
attempt of an episode (recovery runs an infrastructure failure again) meets the same mode: run
one sample of as many tasks as there are modes. Modes go to tasks in the order their first
requests arrive. Every call a
scored mode makes carries an id starting with the mode's name, so a test reads each stored
episode's mode back from its steps' `tool_call_id`s; an infrastructure mode leaves no step and
its episode's error names the cause.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

HUGE_REPLY_BYTES = 50 * 2**20

SCORED_MODES = ("nul", "surrogate", "deep_json", "not_objects", "unoffered", "huge_reply")
"""Modes whose episodes the agent's own doing decides: they end `ok`, scored."""
FORMAT_MODES = ("malformed",)
"""Modes that spend the format budget: `format_error`, scored."""
INFRA_MODES = ("big_ids", "nan_logprobs", "positive_logprobs", "length_mismatch", "trickle")
"""Modes where the server failed: `infra_error`, run again, never stored as `ok`."""
INFRA_CAUSES = {
    "big_ids": "completion token id",
    "nan_logprobs": "logprob nan",
    "positive_logprobs": "logprob 0.5",
    "length_mismatch": "sampled token ids but",
    "trickle": "request deadline",
}
"""What the error of each infrastructure mode's episode says."""


def call(call_id: str, name: str, arguments: Any) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def completion(
    message: dict[str, Any],
    *,
    completion_ids: list[Any] | None = None,
    logprobs: list[Any] | None = None,
) -> dict[str, Any]:
    ids = completion_ids if completion_ids is not None else [11, 12]
    values = logprobs if logprobs is not None else [-0.25] * len(ids)
    return {
        "id": "cmpl-hostile",
        "object": "chat.completion",
        "model": "hostile-model",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", **message},
                "finish_reason": "tool_calls",
                "token_ids": ids,
                "logprobs": {"content": [{"token": "t", "logprob": v} for v in values]},
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)},
    }


def _submit(mode: str) -> dict[str, Any]:
    return completion({"content": None, "tool_calls": [call(f"{mode}-submit", "submit", {})]})


def _deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def _scored_reply(mode: str, turn: int) -> dict[str, Any]:
    """The reply of a scored or format mode at `turn`; its last reply submits."""
    if mode == "nul" and turn == 0:
        calls = [
            call("nul-0", "read_file", {"path": "calc\x00.py"}),
            call("nul-1", "run_command", {"command": "echo hi\x00; touch pwned"}),
            call("nul-2", "edit_file", {"path": "a\x00", "old_text": "x", "new_text": "y"}),
        ]
        return completion({"content": None, "tool_calls": calls})
    if mode == "surrogate" and turn == 0:
        calls = [
            call("surrogate-0", "run_command", '{"command": "echo \\ud800"}'),
            call("surrogate-1", "read_file", {"path": "\udc80.py"}),
        ]
        return completion({"content": "thinking \ud800 hard", "tool_calls": calls})
    if mode == "deep_json" and turn == 0:
        calls = [
            call("deep_json-0", "run_command", _deep(5000)),
            call("deep_json-1", "read_file", '{"path": ' * 5000 + '"x"' + "}" * 5000),
            call("deep_json-2", "run_command", '{"command": ' + "9" * 5000 + "}"),
        ]
        return completion({"content": None, "tool_calls": calls})
    if mode == "not_objects" and turn == 0:
        calls = ["run_command", 7, None, ["submit"], {"id": "not_objects-0", "function": "ls"}]
        return completion({"content": None, "tool_calls": calls})
    if mode == "not_objects" and turn == 1:
        return completion({"content": "x", "tool_calls": "submit"})
    if mode == "unoffered" and turn == 0:
        arguments = {
            "path": "calc.py", "old_text": "a", "new_text": "b",
            "test_command": "touch pwned", "failing_before": 99,
        }  # fmt: skip
        calls = [
            call("unoffered-0", "try_edit", arguments),
            call("unoffered-1", "invalid_call", {"name": "x", "arguments": "", "error": ""}),
            call("unoffered-2", "rm_rf", {}),
        ]
        return completion({"content": None, "tool_calls": calls})
    if mode == "huge_reply" and turn == 0:
        return completion({"content": "huge_reply " + "x" * HUGE_REPLY_BYTES})
    if mode == "malformed":
        bad = [call(f"malformed-{turn}", "run_command", '{"command": ')]
        return completion({"content": None, "tool_calls": bad})
    if mode == "normal" and turn == 0:
        calls = [call("normal-0", "run_command", {"command": "echo hi"})]
        return completion({"content": "normal reply", "tool_calls": calls})
    return _submit(mode)


def _infra_reply(mode: str) -> dict[str, Any]:
    message = {"content": None, "tool_calls": [call(f"{mode}-0", "run_command", "{}")]}
    if mode == "big_ids":
        return completion(message, completion_ids=[11, 2**31 + 5])
    if mode == "nan_logprobs":
        return completion(message, logprobs=[-0.1, float("nan")])
    if mode == "positive_logprobs":
        return completion(message, logprobs=[-0.1, 0.5])
    assert mode == "length_mismatch"
    return completion(message, completion_ids=[11, 12, 13], logprobs=[-0.1])


class HostileChatServer:
    """`GET /v1/models` serves `hostile-model`; `POST /v1/chat/completions` answers each
    episode in its mode (`modes[n]` for the n-th episode seen, `normal` after them);
    `POST /v1/load_lora_adapter` accepts any adapter (the train flow loads its update)."""

    def __init__(self, modes: tuple[str, ...], *, trickle_s: float = 0.25) -> None:
        self.modes = modes
        self.trickle_s = trickle_s
        self.episode_modes: dict[str, str] = {}
        self.requests: dict[str, int] = {}
        """Chat requests answered per mode (replays and retries included)."""
        self.closing = threading.Event()
        self._lock = threading.Lock()
        self._huge: bytes | None = None
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                data = [{"id": "hostile-model", "object": "model", "max_model_len": None}]
                self._send(200, json.dumps({"object": "list", "data": data}).encode())

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                if self.path.rstrip("/").endswith("load_lora_adapter"):
                    self._send(200, b'"ok"')
                    return
                mode, turn = server.mode_of(body)
                if mode == "trickle":
                    self._trickle()
                    return
                self._send(200, server.answer(mode, turn))

            def _trickle(self) -> None:
                # Headers at once, then a byte of whitespace per interval: every read succeeds,
                # so only an overall deadline ends the request. Bounded for the test's sake.
                try:
                    self.send_response(200)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(10**6))
                    self.end_headers()
                    started = time.monotonic()
                    while not server.closing.is_set() and time.monotonic() - started < 120:
                        self.wfile.write(b" ")
                        self.wfile.flush()
                        time.sleep(server.trickle_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up, as it should

            def _send(self, status: int, data: bytes) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    @property
    def spec(self) -> str:
        return f"openai:{self.base_url}#hostile-model"

    def mode_of(self, body: dict[str, Any]) -> tuple[str, int]:
        """The request's episode mode and turn (replies so far); the preflight probe (one
        token asked for) is answered normally."""
        messages = body.get("messages") or []
        turn = sum(1 for m in messages if m.get("role") == "assistant")
        if body.get("max_tokens") == 1:
            return "probe", turn
        instruction = next((str(m.get("content")) for m in messages if m.get("role") == "user"), "")
        with self._lock:
            if instruction not in self.episode_modes:
                taken = len(self.episode_modes)
                self.episode_modes[instruction] = (
                    self.modes[taken] if taken < len(self.modes) else "normal"
                )
            mode = self.episode_modes[instruction]
            self.requests[mode] = self.requests.get(mode, 0) + 1
        return mode, turn

    def answer(self, mode: str, turn: int) -> bytes:
        if mode == "huge_reply" and turn == 0:
            with self._lock:
                if self._huge is None:
                    self._huge = json.dumps(_scored_reply(mode, turn)).encode()
                return self._huge
        if mode in INFRA_MODES:
            return json.dumps(_infra_reply(mode)).encode()
        if mode == "probe":
            return json.dumps(_submit("probe")).encode()
        return json.dumps(_scored_reply(mode, turn)).encode()

    def close(self) -> None:
        self.closing.set()
        self.httpd.shutdown()
        self.httpd.server_close()
