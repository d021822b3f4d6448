"""A policy served behind an OpenAI-compatible chat-completions endpoint (vLLM, SGLang, ...).

The history goes out as chat messages with the four tools declared; the model's first tool call
is the action. Token ids and log-probabilities are recorded when the server returns them
(`logprobs: true`; vLLM's `return_token_ids` / `return_tokens_as_token_ids` add ids), so the
exported batches can train the served model elsewhere. Endpoint, model and key come from
settings (`ROLLYARD_CHAT_*` environment variables, or a `ChatPolicySettings` value).
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from training.actions import (
    TOOL_NAMES,
    Action,
    History,
    Submit,
    action_from_tool_call,
    history_messages,
)
from training.errors import ActionParseError, PolicyError, PolicyServerError
from training.policy import ChatRecord, Decision, Policy

SYSTEM_PROMPT = (
    "You are a software engineer fixing a repository inside a sandbox. Use the tools: "
    "run_command to run shell commands (for example the tests), read_file to read a file, "
    "edit_file to replace one exact occurrence of old_text with new_text, and submit when the "
    "task is done. Call exactly one tool per turn."
)

TOOL_SCHEMAS: list[dict[str, Any]] = [
    {
        "type": "function",
        "function": {
            "name": "run_command",
            "description": "Run a shell command in the workspace and see its output.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string"}},
                "required": ["command"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "read_file",
            "description": "Read a file of the workspace (path relative to it).",
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}},
                "required": ["path"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "edit_file",
            "description": "Replace the single occurrence of old_text in a file with new_text.",
            "parameters": {
                "type": "object",
                "properties": {
                    "path": {"type": "string"},
                    "old_text": {"type": "string"},
                    "new_text": {"type": "string"},
                },
                "required": ["path", "old_text", "new_text"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "submit",
            "description": "Declare the task done.",
            "parameters": {"type": "object", "properties": {}},
        },
    },
]
assert tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS) == TOOL_NAMES

_RETRY_STATUS_CODES = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


class ChatPolicySettings(BaseSettings):
    """Where the served model is and how to talk to it (environment: `ROLLYARD_CHAT_<FIELD>`)."""

    model_config = SettingsConfigDict(env_prefix="ROLLYARD_CHAT_", extra="ignore")

    base_url: str = Field(
        default="http://127.0.0.1:8000/v1",
        description="Endpoint root; `/chat/completions` is appended.",
    )
    model: str = Field(default="default", description="Model name the server serves.")
    api_key: SecretStr | None = Field(
        default=None, description="Bearer token, if the server wants one."
    )
    timeout_s: float = Field(default=120.0, gt=0, description="Per-request timeout.")
    max_retries: int = Field(
        default=3, ge=0, description="Retries on connection errors, timeouts, 429 and 5xx."
    )
    retry_backoff_s: float = Field(
        default=0.5, ge=0, description="First retry delay; doubles each retry."
    )
    temperature: float = Field(default=1.0, ge=0)
    max_tokens: int = Field(default=1024, gt=0, description="Completion tokens per step.")
    logprobs: bool = Field(default=True, description="Ask for token log-probabilities.")
    extra_body: dict[str, Any] = Field(
        default_factory=dict,
        description='Server-specific request fields, e.g. {"return_token_ids": true} for vLLM.',
    )
    policy_version: str | None = Field(
        default=None, description="Version recorded with trajectories (default: chat:<model>)."
    )


class ChatPolicy(Policy):
    """Chooses actions by asking an OpenAI-compatible chat endpoint for a tool call.

    A reply without a tool call is taken as `submit` (the model says it is done); a tool call
    that names no known tool or carries unreadable arguments raises `PolicyError`."""

    def __init__(
        self,
        settings: ChatPolicySettings | None = None,
        *,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.settings = settings or ChatPolicySettings()
        self._transport = transport
        self._client: httpx.Client | None = None
        self._seed: int | None = None

    @property
    def version(self) -> str:
        return self.settings.policy_version or f"chat:{self.settings.model}"

    def seed(self, seed: int) -> None:
        # Sent as the request's `seed`: servers that honour it make sampling reproducible.
        self._seed = seed % (2**31)

    def _http(self) -> httpx.Client:
        if self._client is None:
            headers = {}
            if self.settings.api_key is not None:
                headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
            self._client = httpx.Client(
                base_url=self.settings.base_url.rstrip("/") + "/",
                headers=headers,
                timeout=httpx.Timeout(self.settings.timeout_s),
                transport=self._transport,
            )
        return self._client

    def request_body(self, history: History) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.settings.model,
            "messages": history_messages(history, system_prompt=SYSTEM_PROMPT),
            "tools": TOOL_SCHEMAS,
            "tool_choice": "auto",
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
        }
        if self.settings.logprobs:
            body["logprobs"] = True
        if self._seed is not None:
            body["seed"] = self._seed
        body.update(self.settings.extra_body)
        return body

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        last_problem = "no attempt made"
        last_status: int | None = None
        for attempt in range(self.settings.max_retries + 1):
            if attempt:
                time.sleep(self.settings.retry_backoff_s * 2 ** (attempt - 1))
            try:
                response = self._http().post("chat/completions", json=body)
            except httpx.TransportError as error:  # connect errors and timeouts: retry
                last_problem, last_status = f"{type(error).__name__}: {error}", None
                continue
            if response.status_code in _RETRY_STATUS_CODES:
                last_problem = f"HTTP {response.status_code}: {response.text[:200]}"
                last_status = response.status_code
                continue
            if response.status_code >= 400:
                raise PolicyServerError(
                    f"{self.settings.base_url} answered HTTP {response.status_code} "
                    f"(not retried): {response.text[:300]}",
                    response.status_code,
                )
            try:
                payload = response.json()
            except json.JSONDecodeError:
                raise PolicyServerError(
                    f"{self.settings.base_url} answered a body that is not JSON: "
                    f"{response.text[:200]!r}",
                    response.status_code,
                ) from None
            if not isinstance(payload, dict) or not payload.get("choices"):
                raise PolicyServerError(
                    f"{self.settings.base_url} answered without `choices`: {str(payload)[:200]}",
                    response.status_code,
                )
            return payload
        raise PolicyServerError(
            f"{self.settings.base_url} failed {self.settings.max_retries + 1} time(s); "
            f"last: {last_problem}. Is the server up, and is ROLLYARD_CHAT_BASE_URL right?",
            last_status,
        )

    def act(self, history: History) -> Decision:
        payload = self._post(self.request_body(history))
        choice = payload["choices"][0]
        message = choice.get("message") or {}
        tool_calls = message.get("tool_calls") or []
        action: Action
        if tool_calls:
            function = tool_calls[0].get("function") or {}
            try:
                action = action_from_tool_call(
                    str(function.get("name")), function.get("arguments") or "{}"
                )
            except ActionParseError as error:
                raise PolicyError(
                    f"model {self.settings.model} made an unusable tool call: {error}"
                ) from error
        else:
            action = Submit()
        record = _chat_record(self.settings.model, payload, choice, message)
        logprob = sum(record.completion_logprobs) if record.completion_logprobs else None
        return Decision(action, logprob, record)

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def __getstate__(self) -> dict[str, Any]:
        # The HTTP client holds sockets; each process opens its own.
        return {"settings": self.settings, "transport": None, "seed": self._seed}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.settings = state["settings"]
        self._transport = state["transport"]
        self._client = None
        self._seed = state["seed"]


def _chat_record(
    model: str, payload: dict[str, Any], choice: dict[str, Any], message: dict[str, Any]
) -> ChatRecord:
    tokens: list[str] = []
    logprobs: list[float] = []
    token_ids: list[int] = []
    for entry in (choice.get("logprobs") or {}).get("content") or []:
        token = str(entry.get("token", ""))
        tokens.append(token)
        logprobs.append(float(entry.get("logprob", 0.0)))
        # vLLM's return_tokens_as_token_ids spells each token "token_id:<id>"
        if token.startswith("token_id:") and token[9:].isdigit():
            token_ids.append(int(token[9:]))
    explicit_ids = choice.get("token_ids")
    if isinstance(explicit_ids, list):
        token_ids = [int(i) for i in explicit_ids]
    prompt_ids = payload.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
    return ChatRecord(
        model=str(payload.get("model") or model),
        completion_token_ids=tuple(token_ids),
        completion_tokens=tuple(tokens),
        completion_logprobs=tuple(logprobs),
        prompt_token_ids=tuple(int(i) for i in prompt_ids),
        finish_reason=choice.get("finish_reason"),
        raw_message=json.dumps(message, ensure_ascii=False),
    )
