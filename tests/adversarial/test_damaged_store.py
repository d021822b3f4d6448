"""A damaged store under every command that reads one: same-size garbage in a Parquet data file, a
truncated data file, a deleted data file and a garbage Delta log entry each give exactly one line
on stderr and exit 4, no traceback, and leave the store as it was. One small store is built per
module and copied per case."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.cli import main
from rollyard.errors import EXIT_DAMAGED
from storage import TrajectoryStore
from tests.storage.shard_data import make_shard

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(600)]

REPO_ROOT = Path(__file__).resolve().parents[2]


def garbage(data: Path, log: Path) -> None:
    data.write_bytes(os.urandom(data.stat().st_size))  # what a bad disk leaves: the size holds


def truncated(data: Path, log: Path) -> None:
    content = data.read_bytes()
    data.write_bytes(content[: len(content) // 2])


def deleted(data: Path, log: Path) -> None:
    data.unlink()


def garbage_log_entry(data: Path, log: Path) -> None:
    log.write_bytes(b"{this is not a Delta action\n" + os.urandom(64))


DAMAGES: dict[str, Callable[[Path, Path], None]] = {
    "garbage": garbage,
    "truncated": truncated,
    "deleted": deleted,
    "garbage_log_entry": garbage_log_entry,
}

# Every command of flows/commands that reads a store; STORE and TASKS stand for the paths.
COMMANDS: dict[str, list[str]] = {
    "query sql": ["query", "--store", "STORE", "SELECT count(*) FROM episodes"],
    "query named": ["query", "--store", "STORE", "--named", "reward_curve"],
    "report": ["report", "--store", "STORE"],
    "export": ["export", "--store", "STORE", "--out", "OUT"],
    "store check": ["store", "check", "--store", "STORE", "--grace-s", "0"],
    "store compact": ["store", "compact", "--store", "STORE"],
    "store vacuum": ["store", "vacuum", "--store", "STORE"],
    "store duckdb-file": ["store", "duckdb-file", "OUT", "--store", "STORE"],
    "review queue": ["review", "queue", "--store", "STORE"],
    "review show": ["review", "show", "--store", "STORE", "some-episode"],
    "review record": ["review", "record", "--store", "STORE", "some-episode", "agree"],
    "review agreement": ["review", "agreement", "--store", "STORE"],
    "review gate": ["review", "gate", "--store", "STORE"],
    "curate explain": ["curate", "--store", "STORE", "--explain", "task-0"],
    "audit": ["audit", "--store", "STORE", "--tasks", "TASKS", "--run-id", "run"],
    "train resume": [
        "train",
        "--store",
        "STORE",
        "--tasks",
        "TASKS",
        "--run-id",
        "run",
        "--resume",
    ],
    "evaluate": ["evaluate", "--store", "STORE", "--tasks", "TASKS"],
}


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("damaged") / "store"
    store = TrajectoryStore(root)
    for shard in range(2):
        episodes, steps = make_shard("run", 0, shard)
        store.commit_iteration_shard("run", 0, shard, episodes=episodes, steps=steps)
    return root


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    directory = tmp_path_factory.mktemp("tasks")
    generate_demo_tasks(directory, 1, seed=3)
    return directory


def damaged_copy(pristine: Path, damage: str, into: Path) -> Path:
    root = into / "store"
    shutil.copytree(pristine, root)
    data = sorted((root / "episodes").rglob("*.parquet"))[0]
    log = sorted((root / "episodes" / "_delta_log").glob("*.json"))[-1]
    DAMAGES[damage](data, log)
    return root


def snapshot_of(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize("damage", sorted(DAMAGES))
@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_a_damaged_store_is_one_line_and_exit_4(
    command: str,
    damage: str,
    pristine: Path,
    tasks_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    root = damaged_copy(pristine, damage, tmp_path)
    before = snapshot_of(root)
    paths = {"STORE": str(root), "TASKS": str(tasks_dir), "OUT": str(tmp_path / "out")}
    code = main([paths.get(arg, arg) for arg in COMMANDS[command]])  # a traceback fails here
    err = capsys.readouterr().err.strip()
    assert code == EXIT_DAMAGED, (code, err)
    assert len(err.splitlines()) == 1, err
    assert "store check" in err or "store repair" in err or "restore it" in err, err
    assert snapshot_of(root) == before  # nothing written: no report, commit, lease or Prefect DB
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("damage", "argv"),
    [("garbage", ["report", "--store"]), ("truncated", ["export", "--out", "OUT", "--store"])],
)
def test_the_issues_cases_in_a_process_of_their_own(
    damage: str, argv: list[str], pristine: Path, tmp_path: Path
) -> None:
    root = damaged_copy(pristine, damage, tmp_path)
    argv = [str(tmp_path / "out") if a == "OUT" else a for a in argv]
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", *argv, str(root)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    err = result.stderr.strip()
    assert result.returncode == EXIT_DAMAGED, (result.returncode, err[-2000:])
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
