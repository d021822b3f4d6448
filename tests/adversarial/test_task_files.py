"""Hostile and careless task directories: `tasks validate` must refuse what the sandbox or the
verifier would refuse later (an oversized or non-UTF-8 instruction.md, links out of the task,
device files, sparse files), by `stat` before reading, so a task that validates can run; and
`tasks checkout` refuses the same. Every command runs as a process under a wall timeout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Outer bounds of each command, sized for a loaded shared host, not expectations.
COMMAND_TIMEOUT_S = 300

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def pristine(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    directory = tmp_path_factory.mktemp("tasks")
    generate_demo_tasks(directory, 1, seed=11)
    (task,) = [path for path in directory.iterdir() if (path / "task.toml").is_file()]
    return task


@pytest.fixture
def task(pristine: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "tasks" / pristine.name
    shutil.copytree(pristine, copy, symlinks=True)
    return copy


def workspace_of(task: Path) -> Path:
    from tasks_lib import load_task

    return load_task(task).snapshot_dir


def validate(task: Path) -> tuple[int, list[str]]:
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "tasks", "validate", str(task)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    assert "Traceback" not in result.stderr, result.stderr
    (line,) = result.stdout.strip().splitlines()
    return result.returncode, json.loads(line)["errors"]


def checkout(task: Path, dest: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", "tasks", "checkout", str(task), str(dest)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def assert_refused(task: Path, tmp_path: Path, *phrases: str) -> None:
    code, errors = validate(task)
    assert code == 1 and len(errors) == 1, errors
    assert all(phrase in errors[0] for phrase in phrases), errors
    dest = tmp_path / "checkout"
    result = checkout(task, dest)
    assert result.returncode == 2, result.stderr
    assert all(phrase in result.stderr for phrase in phrases), result.stderr
    assert "Traceback" not in result.stderr and not dest.exists()


def test_the_pristine_task_validates(task: Path) -> None:
    assert validate(task) == (0, [])


def test_a_huge_sparse_instruction_is_refused_unread(task: Path, tmp_path: Path) -> None:
    with open(task / "instruction.md", "r+b") as handle:
        handle.truncate(50 << 20)
    assert_refused(task, tmp_path, "instruction.md: ", "is larger than 262144 bytes")


def test_a_non_utf8_instruction_is_refused(task: Path, tmp_path: Path) -> None:
    (task / "instruction.md").write_bytes(b"Fix the bug in caf\xe9.py\n")
    assert_refused(task, tmp_path, "instruction.md: ", "is not UTF-8")


def test_an_instruction_linked_to_a_host_file_is_refused(task: Path, tmp_path: Path) -> None:
    (task / "instruction.md").unlink()
    (task / "instruction.md").symlink_to("/etc/hostname")
    assert_refused(task, tmp_path, "symlink instruction.md -> /etc/hostname points outside")


def test_a_test_file_linked_out_of_the_task_is_refused(task: Path, tmp_path: Path) -> None:
    outside = tmp_path / "secret.txt"
    outside.write_text("host secret")
    (task / "tests" / "data.txt").symlink_to(os.path.relpath(outside, task / "tests"))
    assert_refused(task, tmp_path, "symlink tests/data.txt")


def test_a_workspace_link_out_of_the_workspace_is_refused(task: Path, tmp_path: Path) -> None:
    # Inside the task but outside the workspace: the sandbox would refuse it at open.
    workspace = workspace_of(task)
    (workspace / "peek").symlink_to(os.path.relpath(task / "solution", workspace))
    assert_refused(task, tmp_path, "symlink peek")


def test_a_fifo_in_the_workspace_is_refused_without_hanging(task: Path, tmp_path: Path) -> None:
    os.mkfifo(workspace_of(task) / "pipe")
    assert_refused(task, tmp_path, "pipe is not a regular file, directory or symlink")


def test_a_sparse_file_in_the_workspace_is_refused_unread(task: Path, tmp_path: Path) -> None:
    with open(workspace_of(task) / "disk.img", "wb") as handle:
        handle.truncate(1 << 40)
    assert_refused(task, tmp_path, "disk.img")


def test_a_link_inside_the_task_is_fine(task: Path) -> None:
    workspace = workspace_of(task)
    first = next(path for path in workspace.rglob("*.py"))
    (workspace / "alias.py").symlink_to(first.relative_to(workspace))
    assert validate(task) == (0, [])


def run_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def test_one_task_over_a_limit_maximum_leaves_every_other_task_reported(tmp_path: Path) -> None:
    # One bad task once aborted the whole directory with "Limits.wall_time_s must be at most".
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    paths = generate_demo_tasks(tmp_path / "tasks", 3, seed=5)
    bad = paths[1]
    toml = (bad / "task.toml").read_text()
    toml = toml.replace("wall_time_s = 60.0", "wall_time_s = 1e9", 1)
    toml = toml.replace("[agent]\ntimeout_sec = 600.0", "[agent]\ntimeout_sec = 1e12", 1)
    (bad / "task.toml").write_text(toml)
    for command in ("validate", "check"):
        result = run_cli("tasks", command, str(tmp_path / "tasks"))
        assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
        rows = {row["task_id"]: row for row in map(json.loads, result.stdout.splitlines())}
        assert sorted(rows) == sorted(path.name for path in paths), result.stdout
        good = [name for name, row in rows.items() if row["ok"]]
        assert sorted(good) == sorted(path.name for path in paths if path != bad)
        problems = rows[bad.name]["errors" if command == "validate" else "problems"]
        assert problems == [
            "task.toml: agent.timeout_sec = 1000000000000.0: is over its maximum 86,400; "
            "write a number in (0, 86,400]",
            "task.toml: rollyard.limits.wall_time_s = 1000000000.0: is over its maximum 86,400; "
            "write a number in (0, 86,400]",
        ], problems
