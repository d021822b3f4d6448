"""The policy spec: parsing, the checks before any episode, and the policies it builds."""

from __future__ import annotations

import json
import pickle
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_chat_server import ScriptedChatServer, completion, tool_call

from rollyard.errors import EXIT_UNAVAILABLE, EXIT_USAGE, exit_code_for
from training import CandidateScorerPolicy
from training.actions import History, RunCommand
from training.errors import (
    ModelNotServedError,
    PolicyServerError,
    PolicySpecError,
    PolicyUnavailableError,
)
from training.lm.openai_policy import OpenAIPolicy
from training.lm.spec import (
    PolicySpec,
    check_model_dir,
    check_policy_spec,
    parse_policy_spec,
    policy_from_spec,
)


@pytest.fixture
def server() -> Iterator[ScriptedChatServer]:
    scripted = ScriptedChatServer({"served-model": 2048, "other-model": None})
    yield scripted
    scripted.close()


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("builtin", PolicySpec("builtin")),
        (" builtin ", PolicySpec("builtin")),
        (
            "openai:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-0.5B-Instruct",
            PolicySpec("openai", "http://127.0.0.1:8000/v1", "Qwen/Qwen2.5-0.5B-Instruct"),
        ),
        (
            "openai:https://api.example.com/v1/#m",
            PolicySpec("openai", "https://api.example.com/v1", "m"),
        ),
        ("hf:models/tiny", PolicySpec("hf", model_dir="models/tiny")),
    ],
)
def test_specs_parse_to_frozen_values_and_print_back(text: str, spec: PolicySpec) -> None:
    parsed = parse_policy_spec(text)
    assert parsed == spec
    assert parse_policy_spec(str(parsed)) == parsed
    assert pickle.loads(pickle.dumps(parsed)) == parsed


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "is not one of builtin, openai:BASE_URL#MODEL or hf:DIR"),
        ("gpt4", "is not one of"),
        ("openai:http://127.0.0.1:8000/v1", "names no model"),
        ("openai:http://127.0.0.1:8000/v1#", "names no model"),
        ("openai:127.0.0.1:8000#m", "is not an http(s) URL"),
        ("openai:ftp://host/v1#m", "is not an http(s) URL"),
        ("openai:http://host:99999/v1#m", "port"),
        ("openai:http://host/v1#my model", "whitespace"),
        ("hf:", "names no directory"),
        ("HF:models/tiny", "is not one of"),
    ],
)
def test_a_malformed_spec_is_one_line_and_exit_2(text: str, says: str) -> None:
    with pytest.raises(PolicySpecError) as raised:
        parse_policy_spec(text)
    message = str(raised.value)
    assert says in message and "\n" not in message
    assert exit_code_for(raised.value) == EXIT_USAGE


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_an_unreachable_server_fails_the_check_with_exit_3(tmp_path: Path) -> None:
    spec = parse_policy_spec(f"openai:http://127.0.0.1:{_free_port()}/v1#m")
    with pytest.raises(PolicyUnavailableError) as raised:
        check_policy_spec(spec)
    assert "cannot reach the model server" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert exit_code_for(raised.value) == EXIT_UNAVAILABLE


def test_a_model_the_server_does_not_serve_names_those_it_serves(
    server: ScriptedChatServer,
) -> None:
    with pytest.raises(ModelNotServedError) as raised:
        policy_from_spec(f"openai:{server.base_url}#missing-model")
    assert str(raised.value).endswith("it serves: other-model, served-model")
    assert exit_code_for(raised.value) == EXIT_USAGE
    assert server.requests == []  # no chat request went out


def test_the_check_takes_the_context_window_from_the_server(server: ScriptedChatServer) -> None:
    server.answer(completion(tool_call("p", "submit", {})))  # the probe with tools
    policy = policy_from_spec(f"openai:{server.base_url}#served-model")
    assert isinstance(policy, OpenAIPolicy) and policy.context_tokens == 2048
    assert server.requests[0]["max_tokens"] == 1 and server.requests[0]["tools"]
    identity = policy.identity()
    assert (identity.kind, identity.model, identity.version) == (
        "openai",
        "served-model",
        "openai:served-model",
    )
    assert json.loads(identity.sampling or "{}")["temperature"] == 1.0


def test_the_api_key_comes_from_the_environment_and_is_never_pickled(
    server: ScriptedChatServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-123")
    policy = policy_from_spec(f"openai:{server.base_url}#served-model", check=False)
    server.answer(completion(tool_call("c1", "run_command", {"command": "ls"})))
    decision = policy.act(History("Fix it"))
    assert decision.actions == (RunCommand("ls"),)
    assert server.headers[0]["Authorization"] == "Bearer sk-secret-123"
    shipped = pickle.dumps(policy)
    assert b"sk-secret-123" not in shipped
    assert b"sk-secret-123" not in repr(policy.identity()).encode()
    monkeypatch.setenv("OPENAI_API_KEY", "sk-other-456")
    copy = pickle.loads(shipped)
    server.answer(completion(tool_call("c1", "submit", {})))
    copy.act(History("Fix it"))
    assert server.headers[1]["Authorization"] == "Bearer sk-other-456"


def test_a_server_without_tool_calling_fails_the_check_naming_the_flags(
    server: ScriptedChatServer, tmp_path: Path
) -> None:
    server.answer(
        {"object": "error", "message": '"auto" tool choice requires --enable-auto-tool-choice'},
        status=400,
    )
    with pytest.raises(PolicyServerError) as raised:
        check_policy_spec(parse_policy_spec(f"openai:{server.base_url}#served-model"))
    message = str(raised.value)
    assert "--enable-auto-tool-choice --tool-call-parser" in message and "\n" not in message
    assert exit_code_for(raised.value) == EXIT_USAGE


def test_builtin_builds_the_candidate_scorer() -> None:
    assert isinstance(policy_from_spec("builtin"), CandidateScorerPolicy)
    assert CandidateScorerPolicy().identity().kind == "builtin"


def test_a_model_dir_must_hold_config_weights_tokenizer_and_chat_template(tmp_path: Path) -> None:
    with pytest.raises(PolicySpecError, match="no such directory"):
        check_model_dir(tmp_path / "absent")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(PolicySpecError) as raised:
        check_policy_spec(parse_policy_spec(f"hf:{tmp_path}"))
    message = str(raised.value)
    assert "lacks weights" in message and "a tokenizer" in message and "chat template" in message
    (tmp_path / "model.safetensors").write_bytes(b"x")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": ""}))
    with pytest.raises(PolicySpecError, match=r"lacks a chat template \(chat_template"):
        check_model_dir(tmp_path)
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": "{{ x }}"}))
    check_model_dir(tmp_path)
