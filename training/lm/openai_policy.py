"""The `openai:` policy: a model behind an OpenAI-compatible server (vLLM, SGLang, a hosted API).

Requests go out with the tools declared and ask for token ids and logprobs (vLLM's
`return_token_ids`; `return_tokens_as_token_ids` spells each logprob's token as its id), so a
trainer reads the very tokens that were sampled. 429 and 503 are retried honouring `Retry-After`
(bounded), other 5xx and connection errors with exponential backoff; after the last retry the
server counts as unavailable, which the episode runner records as an infra failure to run again.
Every other failure is one line saying what to fix. The API key comes from `OPENAI_API_KEY` or
`ROLLYARD_OPENAI_API_KEY` when the client opens, and is never stored, pickled or logged.
"""

from __future__ import annotations

import dataclasses
import email.utils
import json
import re
import threading
import time
from typing import Any

import httpx

from rollyard.settings import settings
from training.actions import clean_text, shown
from training.errors import (
    ContextExhaustedError,
    ModelNotServedError,
    PolicyServerError,
    PolicyUnavailableError,
    ServedTokensError,
)
from training.lm.conversation import (
    TOOL_SCHEMAS,
    ChatPolicy,
    ChatSampling,
    ChatTurn,
    completion_budget,
)
from training.lm.tokens import sampled_tokens_problem

API_KEY_VARIABLES = ("ROLLYARD_OPENAI_API_KEY", "OPENAI_API_KEY")
"""Where the API key is read from, first found wins."""

_RETRIED_STATUS_CODES = frozenset({408, 425, 429, 500, 502, 503, 504})
_TOOL_FLAGS = (
    "--enable-auto-tool-choice --tool-call-parser <parser> (hermes for Qwen/Hermes models)"
)
_CONTEXT_ERROR = re.compile(r"context length|context window|maximum.*tokens|too long", re.I)


@dataclasses.dataclass(frozen=True, slots=True)
class ClientSettings:
    """How the `openai:` policy talks to its server."""

    timeout_s: float = 120.0
    """Per connect and per read (bounded by what is left of `request_deadline_s`)."""
    request_deadline_s: float | None = None
    """The most one request may take, retries and every read included; None reads
    `ROLLYARD_OPENAI_REQUEST_DEADLINE_S` (default 600) when the policy is made. Checked between
    reads, so a request ends at most one read timeout past it."""
    max_response_bytes: int = 256 * 2**20
    """The largest answer body read; a bigger one is the server's failure."""
    vocab_size: int | None = None
    """The served model's vocabulary, when known (a trainer with the weights says): token ids
    outside it are the server's failure. None checks ids against the int32 column only."""
    max_retries: int = 3
    """Retries after connection errors, timeouts, 429 and 5xx."""
    retry_backoff_s: float = 0.5
    """First retry delay without `Retry-After`; doubles each retry."""
    max_retry_after_s: float = 30.0
    """The longest `Retry-After` honoured; a server asking for more waits this long."""
    context_tokens: int | None = None
    """The model's context window; None takes what `/v1/models` says (vLLM's `max_model_len`)."""
    extra_body: tuple[tuple[str, Any], ...] = ()
    """Server-specific request fields, added to every request."""


@dataclasses.dataclass(frozen=True, slots=True)
class ServedModel:
    """What the server says of the model a spec names (`OpenAIPolicy.check`)."""

    model: str
    context_tokens: int | None
    """`max_model_len` from `/v1/models` (vLLM), None when the server does not say."""
    returns_token_ids: bool | None = None
    """Whether a request with tools came back with prompt and completion token ids (None: not
    asked). Without them episodes still run, but a trainer has no sampled ids to read."""


def api_key_from_environment() -> str | None:
    key = settings().openai_api_key
    return key.get_secret_value() if key is not None and key.get_secret_value() else None


def _one_line(text: str, limit: int = 200) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def _retry_after_s(response: httpx.Response) -> float | None:
    value = response.headers.get("Retry-After")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        moment = email.utils.parsedate_to_datetime(value) if value else None
        return None if moment is None else max(0.0, moment.timestamp() - time.time())


def _server_message(response: httpx.Response) -> str:
    """The error text of an OpenAI-style error body (`{"error": {"message": ...}}`), else the body."""
    try:
        body = response.json()
    except ValueError:
        return _one_line(response.text)
    if isinstance(body, dict):
        error = body.get("error", body)
        message = error.get("message") if isinstance(error, dict) else error
        if message is None and isinstance(body.get("detail"), str | list):
            message = body["detail"]
        return _one_line(str(message if message is not None else body))
    return _one_line(str(body))


def _sleep_until(wait_s: float, deadline: float) -> None:
    """Sleep `wait_s`, or until `deadline` if that comes first."""
    time.sleep(max(0.0, min(wait_s, deadline - time.monotonic())))


def open_client(base_url: str, timeout_s: float) -> httpx.Client:
    """An HTTP client for `base_url` with the API key from the environment, if one is set."""
    key = api_key_from_environment()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(
        base_url=base_url.rstrip("/") + "/",
        headers=headers,
        timeout=httpx.Timeout(timeout_s),
        limits=httpx.Limits(max_connections=256, max_keepalive_connections=64),
    )


def check_served_model(base_url: str, model: str, *, timeout_s: float = 10.0) -> ServedModel:
    """Ask `/v1/models` whether the server serves `model`, before any episode.

    Raises `PolicyUnavailableError` (exit 3) when the server does not answer, `ModelNotServedError`
    (exit 2) naming the models it serves, `PolicyServerError` for any other answer."""
    with open_client(base_url, timeout_s) as client:
        try:
            response = client.get("models")
        except httpx.TransportError as error:
            raise PolicyUnavailableError(
                f"cannot reach the model server at {base_url} ({type(error).__name__}: "
                f"{_one_line(str(error), 100)}); is it running, and is the URL right?"
            ) from None
    if response.status_code in (401, 403):
        raise PolicyServerError(
            f"{base_url} refused the API key (HTTP {response.status_code}); set "
            f"{' or '.join(API_KEY_VARIABLES)}",
            response.status_code,
        )
    if response.status_code >= 400:
        raise PolicyServerError(
            f"{base_url}/models answered HTTP {response.status_code}: {_server_message(response)}",
            response.status_code,
        )
    try:
        listed = response.json()["data"]
        entries = {str(entry["id"]): entry for entry in listed}
    except (ValueError, KeyError, TypeError):
        raise PolicyServerError(
            f"{base_url}/models answered something that is not an OpenAI model list: "
            f"{_one_line(response.text, 100)!r}; is this an OpenAI-compatible /v1 endpoint?",
            response.status_code,
        ) from None
    if model not in entries:
        served = ", ".join(sorted(entries)) or "none"
        raise ModelNotServedError(
            f"{base_url} does not serve model {model!r}; it serves: {served}", None
        )
    context = entries[model].get("max_model_len")
    return ServedModel(model, int(context) if isinstance(context, int) else None)


class OpenAIPolicy(ChatPolicy):
    """Acts with a model behind an OpenAI-compatible chat-completions endpoint."""

    kind = "openai"

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        sampling: ChatSampling | None = None,
        client: ClientSettings | None = None,
        version: str | None = None,
    ) -> None:
        super().__init__(sampling or ChatSampling())
        self.base_url = base_url.rstrip("/")
        self.model = model
        client = client or ClientSettings()
        if client.request_deadline_s is None:  # resolved here, so workers keep the caller's
            deadline_s = settings().openai_request_deadline_s
            client = dataclasses.replace(client, request_deadline_s=deadline_s)
        self.client_settings = client
        self._version = version
        self.context_tokens = self.client_settings.context_tokens
        self._http: httpx.Client | None = None
        self._http_lock = threading.Lock()
        self._tokens_per_byte: float | None = None
        """Prompt tokens per byte of request messages, measured on the last answer: how the
        context check estimates a prompt's length without the server's tokenizer."""

    @property
    def version(self) -> str:
        return self._version or f"openai:{self.model}"

    @property
    def model_name(self) -> str:
        return self.model

    def check(self) -> ServedModel:
        """Before any episode: `check_served_model`, then one request with the tools declared
        and a one-token completion, so a server started without tool calling fails here, in
        one line, rather than in every episode. The context window `/v1/models` reports is
        used from then on."""
        served = check_served_model(self.base_url, self.model)
        if self.context_tokens is None:
            self.context_tokens = served.context_tokens
        probe = self.request_body([{"role": "user", "content": "ping"}], seed=0, max_tokens=1)
        turn = self._turn(self._post(probe))
        return dataclasses.replace(
            served, returns_token_ids=bool(turn.prompt_token_ids and turn.completion_token_ids)
        )

    def _client(self) -> httpx.Client:
        with self._http_lock:  # episodes in flight share one connection pool
            if self._http is None:
                self._http = open_client(self.base_url, self.client_settings.timeout_s)
            return self._http

    def request_body(
        self, messages: list[dict[str, Any]], *, seed: int | None, max_tokens: int
    ) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": messages,
            "tools": list(TOOL_SCHEMAS),
            "tool_choice": "auto",
            "temperature": self.sampling.temperature,
            "top_p": self.sampling.top_p,
            "max_tokens": max_tokens,
            "logprobs": True,
            # vLLM: the prompt's and the completion's token ids, and each logprob's token as
            # "token_id:<id>" (the ids also arrive that way from servers without the first).
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
        }
        if seed is not None:
            body["seed"] = seed
        body.update(dict(self.client_settings.extra_body))
        return body

    def _estimated_prompt_tokens(self, messages: list[dict[str, Any]]) -> tuple[int, int] | None:
        if self._tokens_per_byte is None or self.context_tokens is None:
            return None
        size = len(json.dumps(messages, ensure_ascii=False).encode())
        return int(size * self._tokens_per_byte) + 1, size

    def complete(self, messages: list[dict[str, Any]], *, seed: int | None) -> ChatTurn:
        max_tokens = self.sampling.max_tokens
        estimate = self._estimated_prompt_tokens(messages)
        if estimate is not None:
            max_tokens = completion_budget(
                estimate[0],
                self.context_tokens,
                max_tokens=max_tokens,
                min_tokens=self.min_completion_tokens,
            )
        payload = self._post(self.request_body(messages, seed=seed, max_tokens=max_tokens))
        turn = self._turn(payload)
        usage = payload.get("usage") or {}
        prompt_tokens = len(turn.prompt_token_ids) or usage.get("prompt_tokens")
        if isinstance(prompt_tokens, int) and prompt_tokens > 0:
            size = len(json.dumps(messages, ensure_ascii=False).encode())
            self._tokens_per_byte = prompt_tokens / max(size, 1)
        return turn

    def _post(self, body: dict[str, Any]) -> dict[str, Any]:
        settings = self.client_settings
        where = f"{self.base_url}/chat/completions"
        deadline_s = settings.request_deadline_s or float("inf")
        deadline = time.monotonic() + deadline_s
        last_problem = "no attempt made"
        for attempt in range(settings.max_retries + 1):
            remaining_s = deadline - time.monotonic()
            if remaining_s <= 0:
                break
            try:
                response = self._read_answer(body, deadline, min(settings.timeout_s, remaining_s))
            except httpx.TransportError as error:  # refused, reset, timed out: retry
                last_problem = f"{type(error).__name__}: {_one_line(str(error), 100)}"
                if attempt < settings.max_retries:
                    _sleep_until(settings.retry_backoff_s * 2**attempt, deadline)
                continue
            if response.status_code in _RETRIED_STATUS_CODES:
                last_problem = f"HTTP {response.status_code}: {_server_message(response)}"
                if attempt < settings.max_retries:
                    wait_s = _retry_after_s(response)
                    if wait_s is None:
                        wait_s = settings.retry_backoff_s * 2**attempt
                    _sleep_until(min(wait_s, settings.max_retry_after_s), deadline)
                continue
            if response.status_code >= 400:
                raise self._rejected(response, body)
            return self._payload(response)
        if time.monotonic() >= deadline:
            raise PolicyUnavailableError(
                f"{where} gave no complete answer within the request deadline of "
                f"{deadline_s:g}s (ROLLYARD_OPENAI_REQUEST_DEADLINE_S); last: {last_problem}",
                None,
            )
        raise PolicyUnavailableError(
            f"{where} failed {settings.max_retries + 1} time(s); last: {last_problem}",
            None,
        )

    def _read_answer(
        self, body: dict[str, Any], deadline: float, timeout_s: float
    ) -> httpx.Response:
        """One attempt, its body read chunk by chunk so neither a trickle past `deadline` nor
        a body past `max_response_bytes` is waited for or held; raises `ReadTimeout` then."""
        limit = self.client_settings.max_response_bytes
        timeout = httpx.Timeout(timeout_s)
        with self._client().stream("POST", "chat/completions", json=body, timeout=timeout) as got:
            chunks: list[bytes] = []
            size = 0
            for chunk in got.iter_bytes():
                size += len(chunk)
                chunks.append(chunk)
                if time.monotonic() > deadline:
                    raise httpx.ReadTimeout("the request deadline passed while reading the answer")
                if size > limit:
                    raise PolicyUnavailableError(
                        f"{self.base_url}/chat/completions answered more than {limit} bytes "
                        "(ClientSettings.max_response_bytes); the server is not answering "
                        "as a chat completion should",
                        got.status_code,
                    )
        # The chunks are decoded already: the copy must not decode them again.
        headers = [(k, v) for k, v in got.headers.items() if k.lower() != "content-encoding"]
        return httpx.Response(got.status_code, headers=headers, content=b"".join(chunks))

    def _payload(self, response: httpx.Response) -> dict[str, Any]:
        where = f"{self.base_url}/chat/completions"
        try:
            payload = response.json()
        except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
            raise PolicyServerError(
                f"{where} answered HTTP {response.status_code} with a body that is not "
                f"JSON: {_one_line(response.text[:300], 100)!r}; is the base URL an OpenAI-"
                "compatible /v1 endpoint?",
                response.status_code,
            ) from None
        if not isinstance(payload, dict) or not payload.get("choices"):
            raise PolicyServerError(
                f"{where} answered JSON without `choices`: {_one_line(shown(payload, 300), 100)}",
                response.status_code,
            )
        return payload

    def _rejected(self, response: httpx.Response, body: dict[str, Any]) -> Exception:
        """The one-line error for a 4xx the server will answer the same way every time."""
        status, message = response.status_code, _server_message(response)
        where = f"{self.base_url}/chat/completions"
        if status in (401, 403):
            return PolicyServerError(
                f"{where} refused the API key (HTTP {status}); set "
                f"{' or '.join(API_KEY_VARIABLES)}",
                status,
            )
        if status == 404 and self.model in message:
            return ModelNotServedError(f"{where}: model {self.model!r} not served: {message}", 404)
        if "tool" in message.lower():
            return PolicyServerError(
                f"{where} cannot call tools (HTTP {status}: {message}); start vLLM with "
                f"{_TOOL_FLAGS}",
                status,
            )
        if _CONTEXT_ERROR.search(message):
            return ContextExhaustedError(
                f"the prompt no longer fits the model's context (HTTP {status}: {message})",
                None,
                self.context_tokens,
            )
        return PolicyServerError(f"{where} rejected the request (HTTP {status}): {message}", status)

    def _turn(self, payload: dict[str, Any]) -> ChatTurn:
        """The first choice as a turn; its token ids and logprobs checked before anything keeps
        them (`sampled_tokens_problem`): a bad record is the server's failure, `ServedTokensError`."""
        where = f"{self.base_url}/chat/completions"
        choices = payload["choices"]
        choice = choices[0] if isinstance(choices, list) else None
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(choice, dict) or not isinstance(message, dict | None):
            raise PolicyServerError(
                f"{where} answered a choice that is not a chat message: "
                f"{_one_line(shown(choices, 300), 100)}",
                None,
            )
        entries = (
            (choice.get("logprobs") or {}).get("content")
            if isinstance(choice.get("logprobs"), dict | None)
            else None
        )
        entries = entries if isinstance(entries, list) else []
        logprobs = [e.get("logprob") if isinstance(e, dict) else e for e in entries]
        completion_ids = choice.get("token_ids")
        if not isinstance(completion_ids, list):
            spelled = [str(e.get("token", "")) if isinstance(e, dict) else "" for e in entries]
            completion_ids = [
                int(token[9:])
                for token in spelled
                if token.startswith("token_id:") and token[9:].isdigit() and len(token) < 40
            ]
            if len(completion_ids) != len(spelled):
                completion_ids = []
        prompt_ids = payload.get("prompt_token_ids") or choice.get("prompt_token_ids") or []
        if not isinstance(prompt_ids, list):
            prompt_ids = [prompt_ids]
        problem = sampled_tokens_problem(
            prompt_ids, completion_ids, logprobs, vocab_size=self.client_settings.vocab_size
        )
        if problem is not None:
            raise ServedTokensError(f"{where} answered an unusable token record: {problem}")
        model = payload.get("model")
        finish = choice.get("finish_reason")
        return ChatTurn(
            model=clean_text(model)[:200] if isinstance(model, str) and model else self.model,
            message=message or {},
            prompt_token_ids=tuple(prompt_ids),
            completion_token_ids=tuple(completion_ids),
            completion_logprobs=tuple(float(lp or 0.0) for lp in logprobs),  # numbers, checked
            finish_reason=clean_text(finish)[:40] if isinstance(finish, str) else None,
        )

    def close(self) -> None:
        with self._http_lock:
            if self._http is not None:
                self._http.close()
                self._http = None

    def __getstate__(self) -> dict[str, Any]:
        # Sockets and locks stay in their process; the key is read from the environment again.
        state = {name: getattr(self, name) for name in ("sampling", "min_completion_tokens")}
        state |= {
            "base_url": self.base_url,
            "model": self.model,
            "client_settings": self.client_settings,
            "version": self._version,
            "context_tokens": self.context_tokens,
            "seed": self._seed,
        }
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(  # type: ignore[misc]
            state["base_url"],
            state["model"],
            sampling=state["sampling"],
            client=state["client_settings"],
            version=state["version"],
        )
        self.min_completion_tokens = state["min_completion_tokens"]
        self.context_tokens = state["context_tokens"]
        self._seed = state["seed"]
