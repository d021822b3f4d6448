"""What an agent leaves in its own workspace is its doing, scored: FIFOs and sockets, a command
longer than the kernel's argument limit, a huge file it asks to read. None may become an
infrastructure status (which masks its whole GRPO group, wiping its siblings' signal and sparing
a failing agent its penalty), crash the verifier, or take the rollout process's memory.

Episodes run through the real loop (`training.episode.run_episode`) on real bwrap sandboxes and
the real verifier; the memory test runs in a bounded driver (outer cgroup, wall timeout), so a
regression that reads the whole file fails the test instead of the machine.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollyard.status import INFRASTRUCTURE_STATUSES, EpisodeStatus
from sandboxes import Sandbox, host, open_sandbox
from tasks_lib.format.loader import load_task
from tasks_lib.format.model import Task
from tests.sandboxes.adversarial_support import OuterBounds, run_bounded
from tests.training.conftest import write_task
from training.actions import Action, EditFile, RunCommand, Submit
from training.episode import run_episode
from training.policy import ScriptedPolicy
from training.trajectory import EpisodeKey, Trajectory

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(120)]

# the bug tests/training/conftest.py injects into calc.py, and its fix
FIX = EditFile(
    "calc.py",
    "    if value >= high:\n        return value",
    "    if value > high:\n        return high",
)
SPECIAL_FILES = (
    "mkfifo agent.fifo && mkdir -p out && mkfifo out/pipe"
    " && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('agent.sock')\""
    " && test -p agent.fifo && test -S agent.sock"
)


@pytest.fixture
def task(tmp_path: Path) -> Task:
    return load_task(write_task(tmp_path / "task"))


@pytest.fixture
def sandbox(sandbox_root: Path, task: Task) -> Iterator[Sandbox]:
    with open_sandbox(task.snapshot_dir, limits=task.limits) as opened:
        yield opened


def _episode(task: Task, sandbox: Sandbox, actions: list[Action]) -> Trajectory:
    return run_episode(task, ScriptedPolicy(actions), sandbox, key=EpisodeKey("hostile", 0))


def test_fifos_and_sockets_in_the_workspace_are_scored_not_verifier_errors(
    task: Task, sandbox: Sandbox
) -> None:
    fixed = _episode(task, sandbox, [FIX, RunCommand(SPECIAL_FILES), Submit()])
    assert fixed.steps[1].observation.exit_code == 0, fixed.steps[1].observation.text
    assert fixed.status is EpisodeStatus.OK, fixed.error
    assert fixed.reward == 1.0  # the tests' verdict on the workspace, special files left out
    # a failing agent keeps its penalty: scored 0, not masked as an infrastructure failure
    failing = _episode(
        task, sandbox, [RunCommand(SPECIAL_FILES + " && rm calc.py && mkfifo calc.py")]
    )
    assert failing.status is EpisodeStatus.OK, failing.error
    assert failing.reward == 0.0


def test_a_3_mb_command_runs_instead_of_an_infra_error(task: Task, sandbox: Sandbox) -> None:
    padding = "x" * (3 << 20)
    command = RunCommand(f"x={padding}; echo ${{#x}}")
    trajectory = _episode(task, sandbox, [command, FIX, Submit()])
    assert trajectory.status not in INFRASTRUCTURE_STATUSES, trajectory.error
    assert trajectory.status is EpisodeStatus.OK and trajectory.reward == 1.0
    observation = trajectory.steps[0].observation
    assert observation.exit_code == 0 and observation.text.startswith(f"{3 << 20}\n")


def test_an_argv_the_kernel_refuses_is_an_observation(task: Task, sandbox: Sandbox) -> None:
    # a command line that builds an oversized argv inside the sandbox: the shell's own refusal
    command = RunCommand('/bin/echo "$(head -c 300000 /dev/zero | tr "\\0" y)" > /dev/null')
    trajectory = _episode(task, sandbox, [command, FIX, Submit()])
    assert trajectory.status is EpisodeStatus.OK, trajectory.error
    assert trajectory.steps[0].observation.exit_code not in (0, None)
    assert "too long" in trajectory.steps[0].observation.text.lower()


def test_reading_a_450_mb_file_keeps_what_the_observation_keeps(
    sandbox_root: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "calc.py").write_text("x = 1\n")
    script = f"""
from training.actions import ReadFile
from training.episode import apply_action
with open_sandbox({str(workspace)!r}, limits=Limits(cpu_time_s=30)) as sb:
    made = sb.execute("printf HEAD > big.log && truncate -s 450M big.log && printf TAIL >> big.log")
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    started = time.monotonic()
    observation, _ = apply_action(sb, ReadFile("big.log"), timeout_s=10, max_bytes=6000)
    report(made=made.exit_code, before_mb=before_mb, read_s=time.monotonic() - started,
           text=observation.text, truncated=observation.truncated, exit_code=observation.exit_code)
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), host.ROOT_ENV: str(sandbox_root)}
    # 512 MB for the driver: reading the whole file (and decoding it) would need three times that
    result = run_bounded(
        script, env=env, bounds=OuterBounds(memory_mb=512, file_size_mb=512, timeout_s=60)
    )
    assert result["made"] == 0 and result["exit_code"] == 0 and result["truncated"]
    text = result["text"]
    assert text.startswith("HEAD") and text.endswith("TAIL") and len(text.encode()) <= 6000
    marker = re.search(r"\n\[\.\.\. (\d+) bytes cut \.\.\.\]\n", text)
    assert marker is not None, text[:200]
    kept_bytes = len(text.encode()) - len(marker.group(0).encode())
    assert int(marker.group(1)) == (450 << 20) + 4 - kept_bytes  # what was cut, said exactly
    assert result["maxrss_mb"] - result["before_mb"] < 32, result
    assert result["read_s"] < 5, result


def test_a_450_mb_changed_file_is_refused_by_its_size_not_read_whole(
    sandbox_root: Path, tmp_path: Path
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    (workspace / "calc.py").write_text("x = 1\n")
    script = f"""
from tasks_lib.errors import CandidateBoundsError
from tasks_lib.verify.candidate import CandidateBounds, CandidateChanges
with open_sandbox({str(workspace)!r}, limits=Limits(cpu_time_s=30)) as sb:
    made = sb.execute("truncate -s 450M big.log")
    before_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    try:
        CandidateChanges.from_sandbox(sb, bounds=CandidateBounds(max_bytes=1 << 20))
        outcome = "accepted"
    except CandidateBoundsError as error:
        outcome = str(error)
    report(made=made.exit_code, before_mb=before_mb, outcome=outcome)
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), host.ROOT_ENV: str(sandbox_root)}
    result = run_bounded(
        script, env=env, bounds=OuterBounds(memory_mb=512, file_size_mb=512, timeout_s=60)
    )
    assert result["made"] == 0
    assert "big.log" in result["outcome"] and f"{450 << 20} bytes" in result["outcome"]
    assert result["maxrss_mb"] - result["before_mb"] < 32, result
