"""The command line's manners: every command's `--help` gives every option help text and shows
its default where it has one; `--version`; the exit codes in the epilogue; `--format` the same
on every command that has it; settings from the environment; shell completion."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.cli import HelpFormatter, build_parser, has_shown_default, main
from flows.output import FORMATS
from rollyard import __version__
from rollyard.errors import EXIT_CODE_MEANINGS

REPO_ROOT = Path(__file__).resolve().parents[2]


def command_paths(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """(the words that name a command, its parser) for the top level and every sub-command."""
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from command_paths(sub, (*path, name))


COMMANDS = list(command_paths(build_parser()))


def squeeze(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


@pytest.mark.parametrize(
    ("path", "parser"), COMMANDS, ids=[" ".join(p) or "rollyard" for p, _ in COMMANDS]
)
def test_every_option_has_help_and_shows_its_default(
    path: tuple[str, ...], parser: argparse.ArgumentParser, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        main([*path, "--help"])
    assert exited.value.code == 0
    shown = squeeze(capsys.readouterr().out)
    formatter = HelpFormatter(parser.prog)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction | argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"rollyard {' '.join(path)}: {name} has no help text"
        expanded = formatter._expand_help(action)
        assert squeeze(expanded) in shown, f"{name}: its help is not in --help"
        if has_shown_default(action):
            assert "default" in expanded.lower(), f"{name}: --help does not show its default"


def test_version_and_exit_codes() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "flows.cli", "--version"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=True,
    )
    assert done.stdout.strip() == f"rollyard {__version__}"
    epilog = squeeze(build_parser().format_help())
    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    for code, meaning in EXIT_CODE_MEANINGS:
        assert f"{code} {squeeze(meaning)}" in epilog
        assert f"| {code} |" in readme or f"| `{code}` |" in readme


def test_every_format_option_offers_the_same_formats() -> None:
    with_format = [
        (path, action)
        for path, parser in COMMANDS
        for action in parser._actions
        if "--format" in action.option_strings
    ]
    assert len(with_format) >= 10
    for path, action in with_format:
        assert tuple(action.choices or ()) == FORMATS, f"rollyard {' '.join(path)} --format"


def test_store_option_follows_rollyard_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from storage import TrajectoryStore

    TrajectoryStore(tmp_path / "elsewhere")
    monkeypatch.setenv("ROLLYARD_STORE", str(tmp_path / "elsewhere"))
    assert main(["query", "SELECT count(*) AS n FROM episodes", "--format", "csv"]) == 0
    assert capsys.readouterr().out == "n\n0\n"
    monkeypatch.setenv("ROLLYARD_STORE", str(tmp_path / "absent"))
    assert main(["query", "SELECT 1"]) == 3
    assert "absent" in capsys.readouterr().err


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_name_every_command(
    shell: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["completion", shell]) == 0
    script = capsys.readouterr().out
    for path, _ in COMMANDS:
        if path:
            assert path[-1] in script
    assert "--retention-hours" in script


def test_every_setting_the_readme_lists_is_read_by_the_settings_model(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollyard.settings import RollyardSettings, settings

    readme = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Configuration", 1)[1].split("\n## ", 1)[0]
    listed = set(re.findall(r"`(ROLLYARD_[A-Z_]+)", section))
    fields = {f"ROLLYARD_{name.upper()}" for name in RollyardSettings.model_fields}
    # ROLLYARD_GATE_<FIELD> and ROLLYARD_CURATE_<FIELD> are families, read as the gate and
    # curate fields.
    singles = {
        name for name in listed if not name.startswith(("ROLLYARD_GATE_", "ROLLYARD_CURATE_"))
    }
    assert singles and singles <= fields, singles - fields
    assert {"ROLLYARD_GATE_", "ROLLYARD_CURATE_"} <= listed
    monkeypatch.setenv("ROLLYARD_GATE_MAX_INFRA_ERROR_RATE", "0.25")
    monkeypatch.setenv("OPENAI_API_KEY", "plain")
    monkeypatch.setenv("ROLLYARD_OPENAI_API_KEY", "wins")
    monkeypatch.setenv("ROLLYARD_SNAPSHOT_CACHE_MB", "12")
    read = settings()
    assert read.gate == {"max_infra_error_rate": "0.25"} and read.snapshot_cache_mb == 12
    assert read.openai_api_key is not None and read.openai_api_key.get_secret_value() == "wins"


def test_a_bad_environment_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("ROLLYARD_SNAPSHOT_CACHE_MB", "lots")
    assert main(["query", "SELECT 1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("rollyard: error: ROLLYARD_SNAPSHOT_CACHE_MB='lots'")
    assert len(err.splitlines()) == 1
