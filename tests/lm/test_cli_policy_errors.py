"""Bad policy input through the `rollyard` command: a malformed spec, an unreachable server, a
model the server does not serve, a server that answers 400 for tools, a reply that is not JSON,
a language-model spec given to `train`. Each is one line naming what to fix, with its exit code,
before anything runs: the store directory stays as it was (no table, no Prefect home, no demo
tasks). The servers are real HTTP servers on loopback (scripted answers)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_chat_server import ScriptedChatServer, completion, tool_call

from flows.cli import main
from rollyard.errors import EXIT_UNAVAILABLE, EXIT_USAGE
from tasks_lib import generate_demo_tasks


@pytest.fixture
def server() -> Iterator[ScriptedChatServer]:
    scripted = ScriptedChatServer()
    yield scripted
    scripted.close()


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("tasks")
    generate_demo_tasks(root, 1, seed=3)
    return root


def _closed_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def run_cli(argv: list[str], store: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run the command; check that it wrote nothing under the store and said one line."""
    code = main([*argv, "--store", str(store)])
    err = capsys.readouterr().err.strip()
    assert not store.exists(), f"the command wrote {sorted(p.name for p in store.iterdir())}"
    assert err.startswith("rollyard: error: ") and "\n" not in err, err
    return code, err


def test_a_malformed_spec_exits_2_naming_the_forms(
    tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for spec, expected in (
        ("openai:http://127.0.0.1:8000/v1", "names no model"),
        ("openai:localhost:8000#m", "is not an http(s) URL"),
        ("gpt-4", "builtin, openai:BASE_URL#MODEL or hf:DIR"),
        (f"hf:{tmp_path / 'absent'}", "no such directory"),
    ):
        code, err = run_cli(
            ["evaluate", "--tasks", str(tasks_dir), "--policy", spec], tmp_path / "store", capsys
        )
        assert code == EXIT_USAGE and expected in err, err


def test_an_unreachable_server_exits_3(
    tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"openai:http://127.0.0.1:{_closed_port()}/v1#tiny"
    code, err = run_cli(
        ["evaluate", "--tasks", str(tasks_dir), "--policy", spec], tmp_path / "store", capsys
    )
    assert code == EXIT_UNAVAILABLE and "cannot reach the model server" in err


def test_a_model_the_server_does_not_serve_exits_2_naming_what_it_serves(
    server: ScriptedChatServer, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = f"openai:{server.base_url}#other-model"
    code, err = run_cli(
        ["evaluate", "--tasks", str(tasks_dir), "--policy", spec], tmp_path / "store", capsys
    )
    assert code == EXIT_USAGE
    assert "does not serve model 'other-model'" in err and "served-model" in err
    assert server.requests == []  # refused before any chat request


def test_a_server_answering_400_for_tools_exits_2_naming_the_flags(
    server: ScriptedChatServer, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.answer(
        {
            "error": {
                "message": '"auto" tool choice requires --enable-auto-tool-choice and '
                "--tool-call-parser to be set",
                "type": "BadRequestError",
                "code": 400,
            }
        },
        status=400,
    )
    spec = f"openai:{server.base_url}#served-model"
    code, err = run_cli(
        ["evaluate", "--tasks", str(tasks_dir), "--policy", spec], tmp_path / "store", capsys
    )
    assert code == EXIT_USAGE
    assert "cannot call tools" in err and "--enable-auto-tool-choice --tool-call-parser" in err


def test_a_reply_that_is_not_json_exits_2(
    server: ScriptedChatServer, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.answer("<html>502 Bad Gateway</html>", status=200)
    spec = f"openai:{server.base_url}#served-model"
    code, err = run_cli(
        ["evaluate", "--tasks", str(tasks_dir), "--policy", spec], tmp_path / "store", capsys
    )
    assert code == EXIT_USAGE and "not JSON" in err and "Bad Gateway" in err


def test_training_a_served_model_without_its_weights_here_is_refused_before_anything_runs(
    server: ScriptedChatServer, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    server.answer(completion(tool_call("a", "submit", {})))
    spec = f"openai:{server.base_url}#served-model"
    code, err = run_cli(
        ["train", "--tasks", str(tasks_dir), "--policy", spec], tmp_path / "store", capsys
    )
    assert code == EXIT_USAGE and "--trainer-model DIR" in err and "rollyard evaluate" in err
    code, err = run_cli(["demo", "--policy", spec], tmp_path / "store", capsys)
    assert code == EXIT_USAGE and "--trainer-model DIR" in err
    code, err = run_cli(
        ["demo", "--policy", spec, "--trainer-model", str(tmp_path / "absent")],
        tmp_path / "store",
        capsys,
    )
    assert code == EXIT_USAGE and "no such directory" in err
    code, err = run_cli(["demo", "--policy", "openai:nohash"], tmp_path / "store", capsys)
    assert code == EXIT_USAGE and "names no model" in err
    assert server.requests == []  # refused before the server was asked anything
