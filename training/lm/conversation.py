"""The agent loop's language-model side, shared by every chat policy (`openai:`, `hf:`).

The history goes out as chat messages with the four tools declared as JSON schemas; the reply
comes back as a `Decision` carrying every tool call in order (parallel tool calls). A reply with
no usable tool call becomes an `InvalidCall` whose observation says how to call a tool — the
episode runner counts those against `EpisodeConfig.max_format_errors` — never a silent submit.
Each turn's exact prompt ids, sampled ids and sampler logprobs go into its `ChatRecord`.
"""

from __future__ import annotations

import abc
import dataclasses
import json
from typing import Any

from training.actions import (
    TOOL_NAMES,
    Action,
    History,
    InvalidCall,
    action_from_tool_call,
    action_problem,
    cap_text,
    clean_text,
    history_messages,
    shown,
)
from training.errors import ActionParseError, ContextExhaustedError
from training.policy import ChatRecord, Decision, Policy, PolicyIdentity

SYSTEM_PROMPT = (
    "You are a software engineer fixing a repository inside a sandbox. Use the tools: "
    "run_command to run shell commands (for example the tests), read_file to read a file, "
    "edit_file to replace one exact occurrence of old_text with new_text, and submit when the "
    "task is done. You may call several tools in one reply; they run in order."
)


def _function(name: str, description: str, *parameters: str) -> dict[str, Any]:
    # Parameter names say what they are; descriptions of them would only lengthen every prompt.
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {parameter: {"type": "string"} for parameter in parameters},
                "required": list(parameters),
            },
        },
    }


TOOL_SCHEMAS: tuple[dict[str, Any], ...] = (
    _function(
        "run_command",
        "Run a shell command in the workspace and see its output and exit code.",
        "command",
    ),
    _function("read_file", "Read a file of the workspace (path relative to it).", "path"),
    _function(
        "edit_file",
        "Replace the single occurrence of old_text in a file with new_text.",
        "path",
        "old_text",
        "new_text",
    ),
    _function("submit", "Declare the task done."),
)
"""The tools every chat policy is offered, as OpenAI function-tool JSON schemas."""
assert tuple(schema["function"]["name"] for schema in TOOL_SCHEMAS) == TOOL_NAMES

TRY_EDIT_SCHEMA: dict[str, Any] = {
    "type": "function",
    "function": {
        "name": "try_edit",
        "description": "Replace old_text with new_text in a file, run test_command, and keep the "
        "edit only if fewer than failing_before tests fail; otherwise put the file back.",
        "parameters": {
            "type": "object",
            "properties": {
                "path": {"type": "string"},
                "old_text": {"type": "string"},
                "new_text": {"type": "string"},
                "test_command": {"type": "string"},
                "failing_before": {"type": "integer"},
            },
            "required": ["path", "old_text", "new_text", "test_command", "failing_before"],
        },
    },
}
"""The built-in policy's trial as a tool schema, for exports of its episodes (chat models are
not offered it)."""

NO_TOOL_CALL = (
    "Your reply called no tool. Reply with a tool call: run_command, read_file, edit_file, or "
    "submit when the task is done."
)
"""The observation a reply without any tool call gets (`EpisodeConfig.max_format_errors`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ChatSampling:
    """How a chat policy samples every turn; recorded with every episode. Each request's seed
    comes from the episode's (`ChatPolicy.request_seed`), so it is not a field here."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 512
    """Completion tokens asked for per turn (fewer when the context window is nearly full)."""

    def __post_init__(self) -> None:
        if self.temperature < 0 or not 0 < self.top_p <= 1 or self.max_tokens < 1:
            raise ValueError(
                f"sampling needs temperature >= 0, 0 < top_p <= 1 and max_tokens >= 1; got {self}"
            )

    def to_json(self) -> str:
        return PolicyIdentity.sampling_json(dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True, slots=True)
class ChatTurn:
    """What a model backend returned for one request, token in and token out."""

    model: str
    message: dict[str, Any]
    """The assistant message: `content` and `tool_calls` (OpenAI form, arguments as JSON text)."""
    prompt_token_ids: tuple[int, ...] = ()
    completion_token_ids: tuple[int, ...] = ()
    completion_logprobs: tuple[float, ...] = ()
    finish_reason: str | None = None
    format_problems: tuple[str, ...] = ()
    """What is wrong with tool-call blocks that did not parse, when the backend says (the
    `hf:` generator does; a server folds such a reply into plain content)."""


def completion_budget(
    prompt_tokens: int, context_tokens: int | None, *, max_tokens: int, min_tokens: int
) -> int:
    """Completion tokens to ask for: `max_tokens`, fewer when the prompt leaves less room in
    the context window. Raises `ContextExhaustedError` when fewer than `min_tokens` are left —
    the rule that ends an episode that no longer fits, before a request is sent."""
    if context_tokens is None:
        return max_tokens
    room = context_tokens - prompt_tokens
    if room < min_tokens:
        raise ContextExhaustedError(
            f"the prompt is {prompt_tokens} tokens and the model's context {context_tokens}: "
            f"{max(room, 0)} left, fewer than the {min_tokens} a turn needs",
            prompt_tokens,
            context_tokens,
        )
    return min(max_tokens, room)


REPLY_MAX_BYTES = 65_536
"""UTF-8 bytes of one reply a chat policy keeps, stores and sends back in the next prompt: its
content is cut to this with a marker (as observations are), and a tool call whose arguments do
not fit in what is left becomes an `InvalidCall`. A served reply is bounded by `max_tokens`
only if the server honours it."""
MAX_CALLS_PER_REPLY = 32
"""Tool calls of one reply read; the rest are dropped (the step budget ends far sooner)."""
_MAX_CALL_ID_CHARS = 64


def _json_bytes(text: str) -> int:
    """Bytes `text` takes in the stored and re-sent reply (JSON escapes: a NUL takes six)."""
    return len(json.dumps(text, ensure_ascii=False).encode())


def _cap_content(content: str, max_bytes: int) -> str:
    """`content` cut (head and tail, with a marker) until its JSON form fits `max_bytes`."""
    capped, _ = cap_text(content, max_bytes)
    for _ in range(4):  # escapes can make the JSON form up to six times the text
        size = _json_bytes(capped)
        if size <= max_bytes:
            break
        capped, _ = cap_text(content, len(capped.encode()) * max_bytes // size - 64)
    return capped


def _call_id(raw: object, fallback: str) -> str:
    """The model's call id when it is short text, else `fallback` (the id is sent back)."""
    if isinstance(raw, str) and 0 < len(raw) <= _MAX_CALL_ID_CHARS and clean_text(raw) is raw:
        return raw
    return fallback


def _read_call(call: object, index: int, budget_bytes: int) -> tuple[str, str, Action]:
    """One entry of `tool_calls` as (name, arguments text, action); anything unusable — not
    an object, a name not offered, arguments that are not a flat JSON object, too long, or
    naming a path with a NUL byte — is an `InvalidCall` saying what to send instead."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        text = cap_text(clean_text(shown(call, 200)), 200)[0]
        return "", text, InvalidCall("", text, NOT_A_CALL.format(index=index, got=text))
    raw_name = function.get("name")
    name = clean_text(raw_name)[:_MAX_CALL_ID_CHARS] if isinstance(raw_name, str) else ""
    raw = function.get("arguments")
    if isinstance(raw, str):
        arguments = clean_text(raw)
    else:  # some servers send the object itself
        try:
            arguments = clean_text(json.dumps(raw if raw is not None else {}, ensure_ascii=False))
        except (ValueError, TypeError, RecursionError):
            arguments = shown(raw, 200)
    size = _json_bytes(arguments)
    if size > budget_bytes:
        kept = cap_text(arguments, 200)[0]
        error = (
            f"tool call not carried out: its arguments are {size} bytes, more than the "
            f"{budget_bytes} left of the reply's byte budget; send a smaller call"
        )
        return name, kept, InvalidCall(name, kept, error)
    try:
        action = action_from_tool_call(name, arguments, offered=TOOL_NAMES)
    except ActionParseError as error:
        return name, arguments, InvalidCall(name, arguments, f"tool call not carried out: {error}")
    problem = action_problem(action)
    if problem is not None:
        return (
            name,
            arguments,
            InvalidCall(name, arguments, f"tool call not carried out: {problem}"),
        )
    return name, arguments, action


NOT_A_CALL = (
    "tool call #{index} not carried out: it is not an object with a `function` holding `name` "
    "and `arguments` (got {got})"
)


def decision_from_turn(
    turn: ChatTurn, *, call_id_prefix: str, reply_max_bytes: int = REPLY_MAX_BYTES
) -> Decision:
    """The reply as a decision: every tool call in order (one the runner cannot read becomes an
    `InvalidCall` answered under its id), or one `InvalidCall` when there is none. Whatever the
    reply holds, this returns: the reply is the model's, its mistakes are observations."""
    raw_content = turn.message.get("content")
    if raw_content is not None and not isinstance(raw_content, str):
        raw_content = shown(raw_content, reply_max_bytes)
    content = (
        None if raw_content is None else _cap_content(clean_text(raw_content), reply_max_bytes)
    )
    budget_bytes = reply_max_bytes - (_json_bytes(content) if content else 0)
    calls = turn.message.get("tool_calls") or []
    problems = list(turn.format_problems)
    if not isinstance(calls, list):
        problems.append(f"tool_calls is not a list but {shown(calls, 60)}")
        calls = []
    actions: list[Action] = []
    call_ids: list[str] = []
    sent_calls = []
    for index, call in enumerate(calls[:MAX_CALLS_PER_REPLY]):
        name, arguments, action = _read_call(call, index, budget_bytes)
        budget_bytes = max(0, budget_bytes - _json_bytes(arguments))
        raw_id = call.get("id") if isinstance(call, dict) else None
        call_id = _call_id(raw_id, f"{call_id_prefix}_{index}")
        actions.append(action)
        call_ids.append(call_id)
        sent_calls.append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}
        )
    # What goes back into the next prompt: the reply as read, with the ids the answers use.
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if sent_calls:
        message["tool_calls"] = sent_calls
    else:
        explained = NO_TOOL_CALL
        if problems:
            explained = f"Your tool call could not be read ({'; '.join(problems)}). {NO_TOOL_CALL}"
        actions.append(InvalidCall("", content or "", explained))
    record = ChatRecord(
        model=turn.model,
        prompt_token_ids=turn.prompt_token_ids,
        completion_token_ids=turn.completion_token_ids,
        completion_logprobs=turn.completion_logprobs,
        finish_reason=turn.finish_reason,
        raw_message=json.dumps(message, ensure_ascii=False),
    )
    logprob = sum(turn.completion_logprobs) if turn.completion_logprobs else None
    return Decision(tuple(actions), logprob, record, tuple(call_ids))


class ChatPolicy(Policy):
    """A language model acting through tool calls; subclasses say how a request is answered
    (`openai:` over HTTP, `hf:` in-process) and check the context window their own way."""

    def __init__(self, sampling: ChatSampling, *, min_completion_tokens: int = 16) -> None:
        self.sampling = sampling
        self.min_completion_tokens = min_completion_tokens
        self.reply_max_bytes = REPLY_MAX_BYTES
        self._seed: int | None = None

    @property
    @abc.abstractmethod
    def model_name(self) -> str:
        """The model's name, recorded with every episode."""

    def identity(self) -> PolicyIdentity:
        return PolicyIdentity(self.kind, self.version, self.model_name, self.sampling.to_json())

    def fork(self) -> ChatPolicy:
        """A copy sharing this policy's client or model (thread-safe), with its own seed."""
        clone = object.__new__(type(self))
        clone.__dict__.update(self.__dict__)
        return clone

    def seed(self, seed: int) -> None:
        self._seed = seed

    def request_seed(self, history: History) -> int | None:
        """The sampling seed of the request for this history: the episode's seed and the turn."""
        if self._seed is None:
            return None
        return (self._seed + len(history.turns)) % 2**31

    def act(self, history: History) -> Decision:
        messages = history_messages(history, system_prompt=SYSTEM_PROMPT)
        turn = self.complete(messages, seed=self.request_seed(history))
        return decision_from_turn(
            turn, call_id_prefix=f"call_{len(history.turns)}", reply_max_bytes=self.reply_max_bytes
        )

    @abc.abstractmethod
    def complete(self, messages: list[dict[str, Any]], *, seed: int | None) -> ChatTurn:
        """Answer one chat request with the tools declared. Raises `ContextExhaustedError` when
        the prompt leaves too little room (`completion_budget`), `PolicyError` otherwise."""
