"""What an agent submits, against the verifier's bounds: sparse and dense size bombs, floods of
files, hostile paths. Each must be refused before a file of it is read, in one line, and an
agent's refused candidate scores 0 with a flag rather than breaking the verifier.

The size bombs run in a bounded driver (outer cgroup, address-space and file-size rlimits, wall
timeout: tests/sandboxes/adversarial_support.py), so a verifier that reads a sparse terabyte
fails the test instead of the machine.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollyard.status import EpisodeStatus
from sandboxes import WorkspaceDiff, open_sandbox
from sandboxes.snapshot import MAX_PATH_BYTES, TreeBounds
from tasks_lib import load_task
from tasks_lib.errors import CandidateBoundsError
from tasks_lib.verify import verify_sandbox
from tasks_lib.verify.candidate import CandidateBounds, CandidateChanges
from tests.sandboxes.adversarial_support import OuterBounds, run_bounded

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(600)]


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    directory = tmp_path_factory.mktemp("tasks")
    generate_demo_tasks(directory, 1, seed=5)
    (task,) = [path for path in directory.iterdir() if (path / "task.toml").is_file()]
    return task


@pytest.fixture
def candidate(task_dir: Path, tmp_path: Path) -> Path:
    """The task's workspace as an agent would leave it: a copy of its snapshot."""
    import shutil

    copy = tmp_path / "candidate"
    shutil.copytree(load_task(task_dir).snapshot_dir, copy, symlinks=True)
    return copy


def _from_directory_in_driver(task_dir: Path, candidate: Path) -> dict:
    script = f"""
from tasks_lib import load_task
from tasks_lib.errors import CandidateError
from tasks_lib.verify.candidate import CandidateChanges
task = load_task({str(task_dir)!r})
started = time.monotonic()
try:
    CandidateChanges.from_directory({str(candidate)!r}, task.snapshot_dir)
    outcome = "accepted"
except CandidateError as error:
    outcome = type(error).__name__ + ": " + str(error)
report(outcome=outcome, elapsed_s=time.monotonic() - started)
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return run_bounded(
        script, env=env, bounds=OuterBounds(timeout_s=240, memory_mb=768, file_size_mb=64)
    )


def test_a_sparse_terabyte_in_a_candidate_is_refused_unread(
    task_dir: Path, candidate: Path
) -> None:
    with open(candidate / "weights.bin", "wb") as handle:
        handle.truncate(1 << 40)
    found = _from_directory_in_driver(task_dir, candidate)
    assert found["outcome"].startswith("CandidateBoundsError: candidate"), found
    assert "sparse" in found["outcome"] or "MB of files" in found["outcome"], found
    # Refused by stat: nothing near the file's size was ever held in memory.
    assert found["maxrss_mb"] < 400 and found["elapsed_s"] < 60, found


def test_dense_bytes_beyond_the_change_budget_are_refused(task_dir: Path, candidate: Path) -> None:
    (candidate / "blob.bin").write_bytes(os.urandom(2 << 20))
    task = load_task(task_dir)
    with pytest.raises(CandidateBoundsError, match="more than 1048576 bytes"):
        CandidateChanges.from_directory(
            candidate, task.snapshot_dir, bounds=CandidateBounds(max_bytes=1 << 20)
        )


def test_a_flood_of_files_is_refused_before_one_is_read(task_dir: Path, candidate: Path) -> None:
    flood = candidate / "flood"
    flood.mkdir()
    for index in range(1_200):
        (flood / f"f{index}").write_bytes(b"x")
    task = load_task(task_dir)
    with pytest.raises(CandidateBoundsError, match="more than 1000 files and directories"):
        CandidateChanges.from_directory(
            candidate, task.snapshot_dir, bounds=CandidateBounds(tree=TreeBounds(max_entries=1000))
        )
    # Within the tree bound, the number of changed files has its own.
    with pytest.raises(CandidateBoundsError, match="changes 1200 files, more than 500"):
        CandidateChanges.from_directory(
            candidate, task.snapshot_dir, bounds=CandidateBounds(max_files=500)
        )


@pytest.mark.parametrize(
    ("path", "reason"),
    [
        ("../outside.py", "'..' component"),
        ("/etc/passwd", "absolute"),
        ("src/./calc.py", "'.' or '..' component"),
        ("a//b.py", "empty"),
        ("evil\nname.py", "control character"),
        ("evil\x1b[2Jname.py", "control character"),
        (os.fsdecode(b"latin\xe9.py"), "not valid UTF-8"),
        ("x" * (MAX_PATH_BYTES + 1), f"longer than {MAX_PATH_BYTES} bytes"),
        ("/".join(["d"] * 65) + ".py", "deeper than 64"),
    ],
)
def test_hostile_paths_in_a_diff_are_refused_before_any_read(path: str, reason: str) -> None:
    reads: list[str] = []

    def read_file(name: str) -> bytes:
        reads.append(name)
        return b""

    with pytest.raises(CandidateBoundsError, match=reason):
        CandidateChanges.from_diff(WorkspaceDiff(added=(path,)), read_file)
    assert reads == []
    with pytest.raises(CandidateBoundsError, match=reason):
        CandidateChanges(deleted=(path,))  # however a candidate is made


def test_a_non_utf8_file_name_in_a_candidate_directory_is_refused(
    task_dir: Path, candidate: Path
) -> None:
    name = os.path.join(os.fsencode(candidate), b"bad\xff.py")
    os.close(os.open(name, os.O_CREAT | os.O_WRONLY, 0o644))
    with pytest.raises(CandidateBoundsError, match="not valid UTF-8"):
        CandidateChanges.from_directory(candidate, load_task(task_dir).snapshot_dir)


def test_the_verify_command_refuses_a_bomb_in_one_line(
    task_dir: Path, candidate: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli import main

    with open(candidate / "core", "wb") as handle:
        handle.truncate(1 << 40)
    code = main(["verify", str(task_dir), str(candidate)])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and "candidate" in err and "core" in err, err


def test_an_agent_flooding_its_workspace_scores_zero_without_breaking_the_verifier(
    task_dir: Path, sandbox_root: Path
) -> None:
    task = load_task(task_dir)
    with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
        made = sandbox.execute("mkdir flood && cd flood && seq 1 10050 | xargs touch", timeout_s=60)
        assert made.ok, made.stderr
        result = verify_sandbox(task, sandbox)
    # Scored as a failed attempt (reward 0, flagged), not a verifier error retried as infra.
    assert result.status == EpisodeStatus.OK and result.reward == 0.0, result.detail
    assert [flag.rule for flag in result.flags] == ["oversized_candidate"]
    assert "more than 10000" in result.detail
