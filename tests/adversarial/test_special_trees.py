"""`rollyard verify TASK TREE` over trees that are no workspace: /dev, /proc, /sys, /, and a
directory holding a device node, a FIFO or a socket. Each is refused before a file of it is read,
in one line, with the reason `rollyard sandbox run` gives for the same tree (one shared check).
Every command runs as a process under a wall timeout, so a verifier that blocks opening a FIFO
fails the test instead of hanging it."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
# Outer bound of each command, sized for a loaded shared host, not an expectation.
COMMAND_TIMEOUT_S = 120

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    (task,) = generate_demo_tasks(tmp_path_factory.mktemp("tasks"), 1, seed=3)
    return task


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
        stdin=subprocess.DEVNULL,
    )


def with_fifo(tree: Path) -> None:
    os.mkfifo(tree / "pipe")


def with_socket(tree: Path) -> None:
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(tree / "pipe"))
    listener.close()  # the socket file stays


def with_device_node(tree: Path) -> None:
    try:
        os.mknod(tree / "pipe", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("this host does not let the tests make a device node (no CAP_MKNOD)")


def refusal(result: subprocess.CompletedProcess[str]) -> str:
    """The reason of a one-line refusal, without its `rollyard: error: <what>` head."""
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and not result.stdout, result
    return lines[0].split(" ", 3)[3]


@pytest.mark.parametrize("tree", ["/dev", "/proc", "/sys", "/", "/dev/shm"])
def test_verify_refuses_a_system_tree_as_sandbox_run_does(task_dir: Path, tree: str) -> None:
    # /dev once scored 0.0 with status ok: the verifier had walked and read files under /dev.
    verified = cli("verify", str(task_dir), tree)
    assert verified.stderr.startswith(f"rollyard: error: candidate {tree} is a system path")
    assert refusal(verified) == refusal(cli("sandbox", "run", tree, "--", "true"))


@pytest.mark.parametrize(
    "make_special", [with_fifo, with_socket, with_device_node], ids=["fifo", "socket", "device"]
)
def test_verify_refuses_a_tree_holding_a_special_file_as_sandbox_run_does(
    task_dir: Path, tmp_path: Path, make_special: Callable[[Path], None]
) -> None:
    import shutil

    from tasks_lib import load_task

    tree = tmp_path / "candidate"
    shutil.copytree(load_task(task_dir).snapshot_dir, tree, symlinks=True)
    (tree / "src").mkdir(exist_ok=True)
    make_special(tree / "src")
    verified = cli("verify", str(task_dir), str(tree))
    assert f"candidate {tree}: src/pipe is not a regular file" in verified.stderr, verified
    assert refusal(verified) == refusal(cli("sandbox", "run", str(tree), "--", "true"))
