"""The tool actions a coding agent takes, what it observes back, and the history a policy reads.

Actions are the four tool calls every rollyard policy speaks — run a command, read a file, edit a
file by replacing text, submit — whether it is the built-in torch policy, an LLM behind an
OpenAI-compatible endpoint, or a Gymnasium agent sending text. One JSON form (`action_to_json`)
serves all three: it is the tool-call arguments on the wire, the Gymnasium text action and the
stored step.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Collection
from typing import Any

from training.errors import ActionParseError


@dataclasses.dataclass(frozen=True, slots=True)
class RunCommand:
    """Run a shell command in the workspace (`/bin/sh -c`)."""

    command: str
    tool = "run_command"


@dataclasses.dataclass(frozen=True, slots=True)
class ReadFile:
    """Read a workspace file (path relative to the workspace)."""

    path: str
    tool = "read_file"


@dataclasses.dataclass(frozen=True, slots=True)
class EditFile:
    """Replace the one occurrence of `old_text` in a workspace file with `new_text`.

    Like the editors LLM agents use: the edit fails (and changes nothing) unless `old_text`
    occurs exactly once, so an edit is never applied somewhere the agent did not mean."""

    path: str
    old_text: str
    new_text: str
    tool = "edit_file"


@dataclasses.dataclass(frozen=True, slots=True)
class TryEdit:
    """One trial of a fix as one step: make an edit (as `EditFile` does), run `test_command`, and
    keep the edit only if the run passes or fails fewer than `failing_before` tests; otherwise
    the file is put back as it was. The observation is the test run's output and the verdict.

    The built-in policy acts with it: a trial costs one step, and a wrong guess leaves nothing
    behind that a later guess would have to undo."""

    path: str
    old_text: str
    new_text: str
    test_command: str
    failing_before: int
    """Failing tests before the edit (the count the run must go below to keep it)."""
    tool = "try_edit"


@dataclasses.dataclass(frozen=True, slots=True)
class Submit:
    """Declare the task done; the episode ends (terminated) and the verifier runs."""

    tool = "submit"


@dataclasses.dataclass(frozen=True, slots=True)
class InvalidCall:
    """What a language model sent where a tool call belongs and that is none: a reply without any
    tool call (`name` empty, `arguments` the reply's text), or a call naming an unknown tool or
    carrying unreadable arguments. Carrying it out changes nothing; its observation is `error`,
    which says how to call a tool instead, so the model can correct itself."""

    name: str
    arguments: str
    error: str
    tool = "invalid_call"


Action = RunCommand | ReadFile | EditFile | TryEdit | Submit | InvalidCall

TOOL_NAMES = ("run_command", "read_file", "edit_file", "submit")
"""The primitive tools every policy speaks (the tools a chat model is offered)."""
ALL_TOOL_NAMES = (*TOOL_NAMES, "try_edit")
"""Also `try_edit`: edit, test and keep-or-revert in one step (the built-in policy's trials)."""

TRIAL_KEPT = "[edit kept"
TRIAL_REVERTED = "[edit reverted"
"""How a `try_edit` observation's last line starts, so a policy can read the verdict."""


def trial_kept(observation_text: str) -> bool:
    """Whether a `try_edit` observation reports the edit kept (its verdict is the last line)."""
    return TRIAL_KEPT in observation_text[-200:]


_FAILED_COUNT = re.compile(r"(\d+) (?:failed|errors?)\b")


def failing_test_count(output: str, exit_code: int | None) -> int | None:
    """Failing tests (failures plus errors) a pytest run reports in its summary; 0 when it
    exited 0; None when the output says nothing countable (collection interrupted, no summary)."""
    if exit_code == 0:
        return 0
    tail = output[-400:]
    if "Interrupted" in tail or "no tests ran" in tail:
        return None
    counts = [int(n) for n in _FAILED_COUNT.findall(tail)]
    return sum(counts) if counts else None


@dataclasses.dataclass(frozen=True, slots=True)
class Observation:
    """What the environment answered to one action, as the policy sees it."""

    text: str
    """Output shown to the policy (command output, file contents, an edit's outcome), capped."""
    exit_code: int | None = None
    """The command's exit code (`run_command`), 0/1 for a read or edit that worked/failed."""
    truncated: bool = False
    """`text` was cut to the observation cap (or the command's output was)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Turn:
    """One action and the observation it produced."""

    action: Action
    observation: Observation
    call_id: str | None = None
    """The id a language model gave the tool call; its observation goes back under this id."""
    reply_message: str | None = None
    """On the first action of a language model's reply: the reply as the model sent it (an
    OpenAI assistant message as JSON), so the next prompt repeats the model's own words. None on
    the reply's other actions, and for policies that are not chat models."""


@dataclasses.dataclass(frozen=True, slots=True)
class History:
    """Everything a policy has seen in an episode so far: the task instruction, then its turns."""

    instruction: str
    turns: tuple[Turn, ...] = ()

    def append(
        self,
        action: Action,
        observation: Observation,
        *,
        call_id: str | None = None,
        reply_message: str | None = None,
    ) -> History:
        turn = Turn(action, observation, call_id, reply_message)
        return History(self.instruction, (*self.turns, turn))

    @property
    def step_count(self) -> int:
        return len(self.turns)


# -- one JSON form for every action -----------------------------------------------------------


def action_arguments(action: Action) -> dict[str, Any]:
    """The tool-call arguments of `action` (what an LLM puts in `tool_calls[].function`)."""
    match action:
        case RunCommand(command=command):
            return {"command": command}
        case ReadFile(path=path):
            return {"path": path}
        case EditFile(path=path, old_text=old_text, new_text=new_text):
            return {"path": path, "old_text": old_text, "new_text": new_text}
        case TryEdit():
            return {
                "path": action.path,
                "old_text": action.old_text,
                "new_text": action.new_text,
                "test_command": action.test_command,
                "failing_before": action.failing_before,
            }
        case Submit():
            return {}
        case InvalidCall(name=name, arguments=arguments, error=error):
            return {"name": name, "arguments": arguments, "error": error}


def shown(value: object, limit: int = 80) -> str:
    """`repr(value)` cut to `limit` characters: how an error quotes what a model sent, so a
    50 MB argument never becomes a 50 MB message."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def clean_text(text: str) -> str:
    """`text` with every lone surrogate (which no UTF-8 file, command or Parquet column can
    hold) replaced by U+FFFD; other text is returned as it is."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-8", "surrogatepass").decode("utf-8", "replace")
    return text


# The arguments that name a path or go to exec: the kernel takes them as C strings.
_C_STRING_ARGUMENTS = ("path", "command", "test_command")


def action_problem(action: Action) -> str | None:
    """What makes `action` impossible to carry out as sent, or None: a NUL byte in a path or a
    command (the kernel's strings end at NUL), or text that is not valid Unicode (a lone
    surrogate). Checked for every action of every policy before it reaches the sandbox."""
    for key, value in action_arguments(action).items():
        if not isinstance(value, str) or isinstance(action, InvalidCall):
            continue
        if "\x00" in value and key in _C_STRING_ARGUMENTS:
            return (
                f"argument {key!r} of tool {action.tool!r} contains a NUL byte, which no path "
                "or command can hold; remove it"
            )
        if clean_text(value) is not value:
            return (
                f"argument {key!r} of tool {action.tool!r} is not valid Unicode (a lone "
                "surrogate such as \\ud800); send UTF-8 text"
            )
    return None


def action_from_tool_call(
    name: str, arguments: str | dict[str, Any], *, offered: Collection[str] = ALL_TOOL_NAMES
) -> Action:
    """Build an action from a tool name and its arguments (a JSON object or its text); only
    the tools in `offered` are accepted (a chat model is offered `TOOL_NAMES`).

    Raises `ActionParseError` naming what is wrong, so a model's malformed call becomes an
    observation it can correct rather than a crash."""
    if name not in offered:
        raise ActionParseError(f"unknown tool {shown(name)}; use one of {', '.join(offered)}")
    if isinstance(arguments, str):
        try:
            parsed = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as error:
            raise ActionParseError(
                f"arguments of tool {name!r} are not valid JSON ({error.msg}); "
                'send an object such as {"command": "ls"}'
            ) from None
        except (ValueError, RecursionError) as error:  # 5,000-deep nesting, 5,000-digit ints
            raise ActionParseError(
                f"arguments of tool {name!r} cannot be read ({type(error).__name__}: "
                f'{shown(str(error))}); send a flat object such as {{"command": "ls"}}'
            ) from None
    else:
        parsed = arguments
    if not isinstance(parsed, dict):
        raise ActionParseError(
            f"arguments of tool {name!r} must be a JSON object, got {shown(parsed)}"
        )

    def field(key: str) -> str:
        value = parsed.get(key)
        if not isinstance(value, str):
            raise ActionParseError(
                f"tool {name!r} needs a string argument {key!r}; got {shown(value)}"
            )
        return value

    if name == "run_command":
        return RunCommand(field("command"))
    if name == "read_file":
        return ReadFile(field("path"))
    if name == "edit_file":
        return EditFile(field("path"), field("old_text"), field("new_text"))
    if name == "try_edit":
        failing_before = parsed.get("failing_before")
        if not isinstance(failing_before, int) or isinstance(failing_before, bool):
            raise ActionParseError(
                f"tool 'try_edit' needs an integer argument 'failing_before'; got {shown(failing_before)}"
            )
        return TryEdit(
            field("path"),
            field("old_text"),
            field("new_text"),
            field("test_command"),
            failing_before,
        )
    if name == "submit":
        return Submit()
    raise ActionParseError(f"unknown tool {shown(name)}; use one of {', '.join(offered)}")


def action_to_json(action: Action) -> str:
    """`{"tool": ..., <arguments>}` as compact JSON: the stored and Gymnasium text form."""
    return json.dumps({"tool": action.tool, **action_arguments(action)}, ensure_ascii=False)


def action_from_json(text: str) -> Action:
    """Inverse of `action_to_json`; raises `ActionParseError` with what to send instead."""
    try:
        parsed = json.loads(text)
    except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth
        raise ActionParseError(
            'an action is a JSON object such as {"tool": "run_command", "command": "ls"}; '
            f"got {text[:80]!r}"
        ) from None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("tool"), str):
        raise ActionParseError(
            f'an action needs a "tool" field naming one of {", ".join(ALL_TOOL_NAMES)}; '
            f"got {text[:80]!r}"
        )
    tool = parsed.pop("tool")
    if tool == InvalidCall.tool:  # a stored step; no model can call it
        return InvalidCall(
            str(parsed.get("name", "")), str(parsed.get("arguments", "")), str(parsed.get("error"))
        )
    return action_from_tool_call(tool, parsed)


def cap_text(text: str, max_bytes: int) -> tuple[str, bool]:
    """Keep the head and tail of `text` within `max_bytes` of UTF-8, with a marker between them
    saying how many bytes were cut; returns the text and whether it was cut.

    The tail holds pytest's summary and the last traceback frames, the head the first failure,
    so both are worth keeping. The budget is in bytes because that is what bounds a model's
    prompt (a token is at least one byte for byte-level tokenizers) and the store's row size;
    cuts fall on character boundaries, so the result is valid text."""
    data = text.encode("utf-8")
    if len(data) <= max_bytes:
        return text, False
    marker = f"\n[... {len(data) - max_bytes} bytes cut ...]\n"
    keep = max(0, max_bytes - len(marker.encode()))
    head_bytes = keep // 2
    head = data[:head_bytes].decode("utf-8", errors="ignore")
    tail_bytes = keep - len(head.encode())
    tail = data[len(data) - tail_bytes :].decode("utf-8", errors="ignore") if tail_bytes else ""
    capped = head + marker + tail
    if len(capped.encode()) > max_bytes:  # a budget smaller than the marker itself
        capped = data[:max_bytes].decode("utf-8", errors="ignore")
    return capped, True


def history_messages(history: History, *, system_prompt: str | None = None) -> list[dict[str, Any]]:
    """The history as OpenAI chat messages: system, the instruction as the user's message, then
    the turns. Used to prompt chat models and to export batches, so both see one conversation.

    A language model's reply goes back exactly as it sent it (`Turn.reply_message`), and each of
    its tool calls is answered by a `tool` message under the call's id; a reply without any tool
    call is answered by a `user` message (there is no call id to answer under). Turns of other
    policies are rendered as one assistant tool call each, ids `call_<index>`."""
    messages: list[dict[str, Any]] = []
    if system_prompt:
        messages.append({"role": "system", "content": system_prompt})
    messages.append({"role": "user", "content": history.instruction})
    for index, turn in enumerate(history.turns):
        if turn.reply_message is not None:
            reply = json.loads(turn.reply_message)
            messages.append({"role": "assistant", **reply})
        call_id = turn.call_id
        if call_id is None and turn.reply_message is None:
            call_id = f"call_{index}"
            messages.append(
                {
                    "role": "assistant",
                    "content": None,
                    "tool_calls": [
                        {
                            "id": call_id,
                            "type": "function",
                            "function": {
                                "name": turn.action.tool,
                                "arguments": json.dumps(action_arguments(turn.action)),
                            },
                        }
                    ],
                }
            )
        if call_id is None:
            messages.append({"role": "user", "content": turn.observation.text})
        else:
            messages.append(
                {"role": "tool", "tool_call_id": call_id, "content": turn.observation.text}
            )
    return messages
