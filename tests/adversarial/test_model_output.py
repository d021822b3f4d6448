"""A model's output and a server's answer, read by the real parser and validator: every hostile
mode of `hostile_chat_server` ends as an observation to the model, the episode's own format
error, or — for a server's broken token record or a trickle — the server's failure; never an
uncaught exception, never text the store cannot hold, never more kept than the reply cap."""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from rollyard.status import AGENT_STATUSES, INFRASTRUCTURE_STATUSES, TRAINABLE_STATUSES
from tests.adversarial.hostile_chat_server import (
    HUGE_REPLY_BYTES,
    INFRA_CAUSES,
    INFRA_MODES,
    HostileChatServer,
    _infra_reply,
    _scored_reply,
)
from training.actions import (
    TOOL_NAMES,
    InvalidCall,
    ReadFile,
    RunCommand,
    Submit,
    action_from_json,
    action_from_tool_call,
)
from training.episode import refuse_unusable
from training.errors import ActionParseError, PolicyUnavailableError, ServedTokensError
from training.lm.conversation import (
    MAX_CALLS_PER_REPLY,
    NO_TOOL_CALL,
    REPLY_MAX_BYTES,
    SYSTEM_PROMPT,
    TOOL_SCHEMAS,
    decision_from_turn,
)
from training.lm.openai_policy import ClientSettings, OpenAIPolicy
from training.lm.tokens import TOKEN_ID_MAX, sampled_tokens_problem
from training.policy import ChatRecord, Decision

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(60)]


@pytest.fixture(scope="module")
def reader() -> Iterator[OpenAIPolicy]:
    """A policy whose answer parsing is used on bodies as a server would send them."""
    policy = OpenAIPolicy(
        "http://127.0.0.1:9/v1", "hostile-model", client=ClientSettings(request_deadline_s=5)
    )
    yield policy
    policy.close()


def decide(reader: OpenAIPolicy, body: dict[str, Any]) -> Decision:
    """The body through JSON (as the wire carries it), the answer reader and the parser."""
    payload = json.loads(json.dumps(body))
    return decision_from_turn(reader._turn(payload), call_id_prefix="call_0")


def storable(decision: Decision) -> None:
    """What the store keeps of the reply is text Parquet can hold (no lone surrogate)."""
    record = decision.record
    assert isinstance(record, ChatRecord)
    texts = [record.raw_message, record.model]
    for action in decision.actions:
        if isinstance(action, InvalidCall):
            texts += [action.name, action.arguments, action.error]
    pa.array(texts, pa.string())  # raises on text UTF-8 cannot encode
    assert len(record.raw_message.encode()) <= REPLY_MAX_BYTES + 4096


def test_a_nul_byte_in_a_path_or_a_command_is_an_observation(reader: OpenAIPolicy) -> None:
    decision = decide(reader, _scored_reply("nul", 0))
    assert len(decision.actions) == 3
    for action in decision.actions:
        assert isinstance(action, InvalidCall) and "NUL byte" in action.error
    storable(decision)


def test_lone_surrogates_are_refused_and_never_reach_the_store(reader: OpenAIPolicy) -> None:
    decision = decide(reader, _scored_reply("surrogate", 0))
    assert [type(a) for a in decision.actions] == [InvalidCall, InvalidCall]
    assert all("not valid Unicode" in a.error for a in decision.actions)  # type: ignore[union-attr]
    assert "\ufffd" in decision.record.raw_message  # type: ignore[union-attr]
    storable(decision)


def test_5000_deep_json_and_5000_digit_numbers_are_read_errors(reader: OpenAIPolicy) -> None:
    decision = decide(reader, _scored_reply("deep_json", 0))
    assert len(decision.actions) == 3
    for action in decision.actions:
        assert isinstance(action, InvalidCall) and "not carried out" in action.error
        assert len(action.error) < 600
    storable(decision)
    with pytest.raises(ActionParseError):
        action_from_json("[" * 5000 + "]" * 5000)


@pytest.mark.parametrize("calls", [["run_command", 7, None, ["submit"]], "submit", {"a": 1}, 3])
def test_tool_calls_that_are_not_objects_are_observations(reader: OpenAIPolicy, calls: Any) -> None:
    body = _scored_reply("not_objects", 0)
    body["choices"][0]["message"]["tool_calls"] = calls
    decision = decide(reader, body)
    assert decision.actions and all(isinstance(a, InvalidCall) for a in decision.actions)
    storable(decision)


def test_a_tool_that_was_not_offered_is_not_carried_out(reader: OpenAIPolicy) -> None:
    decision = decide(reader, _scored_reply("unoffered", 0))
    assert [type(a) for a in decision.actions] == [InvalidCall] * 3
    for action in decision.actions:
        assert "unknown tool" in action.error  # type: ignore[union-attr]
        assert "try_edit" not in action.error.split("use one of")[1]  # type: ignore[union-attr]
    with pytest.raises(ActionParseError, match="unknown tool"):
        action_from_tool_call("try_edit", "{}", offered=TOOL_NAMES)
    # and nothing a chat model reads advertises a tool it is not offered
    offered = " ".join([SYSTEM_PROMPT, NO_TOOL_CALL, json.dumps(TOOL_SCHEMAS)])
    assert "try_edit" not in offered and "invalid_call" not in offered


def test_a_50_mb_reply_is_kept_capped_with_a_marker(reader: OpenAIPolicy) -> None:
    decision = decide(reader, _scored_reply("huge_reply", 0))
    (action,) = decision.actions
    assert isinstance(action, InvalidCall) and action.arguments.startswith("huge_reply")
    assert len(action.arguments.encode()) <= REPLY_MAX_BYTES
    cut = re.search(r"\[\.\.\. (\d+) bytes cut \.\.\.\]", action.arguments)
    assert cut is not None and int(cut.group(1)) > HUGE_REPLY_BYTES - REPLY_MAX_BYTES
    storable(decision)


def test_huge_arguments_many_calls_and_long_ids_are_bounded(reader: OpenAIPolicy) -> None:
    big = {"command": "echo " + "y" * (2 * REPLY_MAX_BYTES)}
    calls = [
        {"id": "i" * 10_000, "type": "function", "function": {"name": "run_command",
         "arguments": json.dumps(big)}},
        *({"id": f"c{i}", "type": "function", "function": {"name": "submit", "arguments": "{}"}}
          for i in range(1000)),
    ]  # fmt: skip
    body = _scored_reply("normal", 0)
    body["choices"][0]["message"]["tool_calls"] = calls
    decision = decide(reader, body)
    assert len(decision.actions) == MAX_CALLS_PER_REPLY
    first = decision.actions[0]
    assert isinstance(first, InvalidCall) and "bytes" in first.error
    assert decision.call_ids[0] == "call_0_0" and decision.actions[1] == Submit()
    storable(decision)


def test_malformed_calls_are_observations_that_spend_the_format_budget(
    reader: OpenAIPolicy,
) -> None:
    decision = decide(reader, _scored_reply("malformed", 0))
    (action,) = decision.actions
    assert isinstance(action, InvalidCall) and "not valid JSON" in action.error


@pytest.mark.parametrize("mode", [m for m in INFRA_MODES if m != "trickle"])
def test_a_broken_token_record_is_the_servers_failure(reader: OpenAIPolicy, mode: str) -> None:
    with pytest.raises(ServedTokensError, match=INFRA_CAUSES[mode]) as raised:
        reader._turn(json.loads(json.dumps(_infra_reply(mode))))
    assert isinstance(raised.value, PolicyUnavailableError)  # infra_error: replayed, masked


@pytest.mark.parametrize(
    ("prompt", "completion", "logprobs", "cause"),
    [
        ([1, TOKEN_ID_MAX + 1], [], [], "prompt token id"),
        ([-1], [], [], "prompt token id"),
        ([1], [1.5], [-0.1], "completion token id"),
        ([1], [True], [-0.1], "completion token id"),
        ([1], ["3"], [-0.1], "completion token id"),
        ([1], [3], [math.inf], "logprob"),
        ([1], [3], [-math.inf], "logprob"),
        ([1], [3], [-1e39], "logprob"),  # finite in float64, -inf in the float32 column
        ([1], [3], [None], "logprob"),
        ([1], [3], [1e-9], "logprob"),
        ([1], [3, 4], [-0.1], "2 sampled token ids but 1 logprobs"),
    ],
)
def test_the_token_validator_names_each_problem(
    prompt: list[Any], completion: list[Any], logprobs: list[Any], cause: str
) -> None:
    problem = sampled_tokens_problem(prompt, completion, logprobs)
    assert problem is not None and cause in problem


def test_the_token_validator_knows_the_vocabulary_and_passes_good_records() -> None:
    assert sampled_tokens_problem([1, 2], [3], [-0.5]) is None
    assert sampled_tokens_problem([], [], []) is None
    assert sampled_tokens_problem([1], [3], [0.0], vocab_size=4) is None
    problem = sampled_tokens_problem([1], [4], [-0.5], vocab_size=4)
    assert problem is not None and "vocabulary of 4" in problem


def test_every_policy_s_unusable_action_is_refused_before_the_sandbox() -> None:
    for action in (RunCommand("ls\x00"), ReadFile("a\x00b"), RunCommand("echo \ud800")):
        refused = refuse_unusable(action)
        assert isinstance(refused, InvalidCall)
        pa.array([refused.arguments, refused.error], pa.string())
    assert refuse_unusable(RunCommand("ls")) == RunCommand("ls")
    assert refuse_unusable(ReadFile("notes\ud7ff.txt")) == ReadFile("notes\ud7ff.txt")


def test_a_trickling_server_ends_at_the_request_deadline() -> None:
    server = HostileChatServer(("trickle",), trickle_s=0.2)
    policy = OpenAIPolicy(
        server.base_url,
        "hostile-model",
        client=ClientSettings(request_deadline_s=1.5, timeout_s=10, max_retries=3),
    )
    try:
        started = time.monotonic()
        with pytest.raises(PolicyUnavailableError, match=r"request deadline of 1\.5s"):
            policy.complete([{"role": "user", "content": "fix it"}], seed=7)
        elapsed_s = time.monotonic() - started
        assert 1.4 < elapsed_s < 3.0, elapsed_s
    finally:
        policy.close()
        server.close()


def test_the_deadline_is_a_setting_with_a_default(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROLLYARD_OPENAI_REQUEST_DEADLINE_S", raising=False)
    assert OpenAIPolicy("http://h/v1", "m").client_settings.request_deadline_s == 600.0
    monkeypatch.setenv("ROLLYARD_OPENAI_REQUEST_DEADLINE_S", "2.5")
    policy = OpenAIPolicy("http://h/v1", "m")
    assert policy.client_settings.request_deadline_s == 2.5
    import pickle

    monkeypatch.delenv("ROLLYARD_OPENAI_REQUEST_DEADLINE_S")
    assert pickle.loads(pickle.dumps(policy)).client_settings.request_deadline_s == 2.5


def test_the_status_rule_every_status_an_agent_can_cause_is_trainable() -> None:
    assert AGENT_STATUSES <= TRAINABLE_STATUSES
    assert not AGENT_STATUSES & INFRASTRUCTURE_STATUSES
