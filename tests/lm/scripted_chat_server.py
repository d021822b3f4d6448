"""A scripted OpenAI-compatible server on loopback, for the failure paths a real model never takes
on demand (429 with Retry-After, a 400 for tools, a body that is not JSON, a reply with two tool
calls). It speaks the wire format over real HTTP; the client under test is the real one."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedChatServer:
    """`GET /v1/models` lists `models`; `POST /v1/chat/completions` answers with the next
    scripted (status, body, headers, delay_s), or 500 once the script is used up."""

    def __init__(self, models: dict[str, int | None] | None = None) -> None:
        self.models = models if models is not None else {"served-model": 4096}
        self.script: list[tuple[int, Any, dict[str, str], float]] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.answered_at: list[float] = []
        self.in_flight = 0
        self.max_in_flight = 0
        self._lock = threading.Lock()
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.rstrip("/") != "/v1/models":
                    self._send(404, {"error": {"message": "not found"}}, {})
                    return
                data = [
                    {"id": name, "object": "model", "max_model_len": context}
                    for name, context in server.models.items()
                ]
                self._send(200, {"object": "list", "data": data}, {})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0))
                with server._lock:
                    server.requests.append(json.loads(self.rfile.read(length)))
                    server.headers.append(dict(self.headers))
                    server.answered_at.append(time.monotonic())
                    status, body, headers, delay_s = (
                        server.script.pop(0) if server.script else (500, "script used up", {}, 0.0)
                    )
                    server.in_flight += 1
                    server.max_in_flight = max(server.max_in_flight, server.in_flight)
                time.sleep(delay_s)
                self._send(status, body, headers)
                with server._lock:
                    server.in_flight -= 1

            def _send(self, status: int, body: Any, headers: dict[str, str]) -> None:
                data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up and left

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def answer(
        self,
        body: Any,
        status: int = 200,
        headers: dict[str, str] | None = None,
        delay_s: float = 0.0,
    ) -> None:
        self.script.append((status, body, headers or {}, delay_s))

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def tool_call(call_id: str, name: str, arguments: dict[str, Any] | str) -> dict[str, Any]:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": text}}


def completion(
    *calls: dict[str, Any],
    content: str | None = None,
    prompt_ids: tuple[int, ...] = (1, 2, 3),
    completion_ids: tuple[int, ...] = (11, 12),
    spell_ids_in_logprobs: bool = False,
    prompt_tokens: int | None = None,
) -> dict[str, Any]:
    """A chat completion as vLLM sends it with `return_token_ids` (or, `spell_ids_in_logprobs`,
    with the ids only in the logprobs' `token_id:<id>` tokens)."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    logprobs = [
        {"token": f"token_id:{i}" if spell_ids_in_logprobs else f"t{i}", "logprob": -0.25}
        for i in completion_ids
    ]
    choice: dict[str, Any] = {
        "index": 0,
        "message": message,
        "finish_reason": "tool_calls" if calls else "stop",
        "logprobs": {"content": logprobs},
    }
    body: dict[str, Any] = {
        "id": "cmpl-1",
        "object": "chat.completion",
        "model": "served-model",
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_tokens or len(prompt_ids),
            "completion_tokens": len(completion_ids),
        },
    }
    if not spell_ids_in_logprobs:
        choice["token_ids"] = list(completion_ids)
        body["prompt_token_ids"] = list(prompt_ids)
    return body
