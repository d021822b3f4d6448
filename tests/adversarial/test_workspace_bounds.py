"""Size bombs and bad roots handed to a sandbox as its workspace: they must be refused by `stat`
before any file is read or copied, in one line, leaving nothing in the snapshot cache.

Opening runs in a bounded driver (outer cgroup, RLIMIT_FSIZE, wall timeout: see
tests/sandboxes/adversarial_support.py), so a regression that copies a sparse gigabyte or walks
the root file system fails the test instead of filling the disk.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from flows.cli import main
from sandboxes import Limits, SnapshotError, host, open_sandbox
from sandboxes.errors import InvalidLimitsError
from sandboxes.snapshot import SnapshotCache
from tests.sandboxes.adversarial_support import OuterBounds, run_bounded

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(60)]


def _open_in_driver(sandbox_root: Path, workspace: Path, limits: str = "Limits()") -> dict:
    """Open a sandbox over `workspace` in a bounded driver; what it raised, and how long it
    took."""
    script = f"""
from sandboxes import SandboxError
started = time.monotonic()
try:
    with open_sandbox({str(workspace)!r}, limits={limits}) as sb:
        outcome = "opened"
except SandboxError as error:
    outcome = type(error).__name__ + ": " + str(error)
report(outcome=outcome, elapsed_s=time.monotonic() - started)
"""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), host.ROOT_ENV: str(sandbox_root)}
    return run_bounded(script, env=env, bounds=OuterBounds(timeout_s=30, file_size_mb=64))


def _cache_is_empty(sandbox_root: Path) -> bool:
    snapshots = host.HostLayout(sandbox_root).snapshots
    return not snapshots.exists() or list(snapshots.iterdir()) == []


def test_a_sparse_terabyte_is_refused_unread(sandbox_root: Path, workspace: Path) -> None:
    with open(workspace / "holes.bin", "wb") as handle:
        handle.truncate(1 << 40)
    report = _open_in_driver(sandbox_root, workspace)
    assert report["outcome"].startswith("SnapshotError") and "sparse" in report["outcome"]
    assert report["elapsed_s"] < 5, report
    assert _cache_is_empty(sandbox_root)


def test_a_sparse_file_within_the_size_limit_is_not_expanded(
    sandbox_root: Path, workspace: Path
) -> None:
    # 8 MB apparent, 4 KB allocated: inside workspace_mb, yet a copy would write it all out.
    with open(workspace / "holes.bin", "wb") as handle:
        handle.seek((8 << 20) - 4096)
        handle.write(b"x" * 4096)
    report = _open_in_driver(sandbox_root, workspace)
    assert "sparse" in report["outcome"], report
    assert _cache_is_empty(sandbox_root)


def test_dense_bytes_beyond_the_limit_are_refused(sandbox_root: Path, workspace: Path) -> None:
    (workspace / "data.bin").write_bytes(os.urandom(3 << 20))
    report = _open_in_driver(sandbox_root, workspace, "Limits(workspace_mb=2)")
    assert "more than 2 MB of files" in report["outcome"], report
    assert _cache_is_empty(sandbox_root)


def test_many_small_files_are_refused_before_they_are_read(
    sandbox_root: Path, workspace: Path
) -> None:
    # One more entry than the default bound (50,000), the directory included.
    many = workspace / "many"
    many.mkdir()
    for index in range(Limits().workspace_files):
        os.close(os.open(many / f"f{index}", os.O_CREAT | os.O_WRONLY, 0o644))
    report = _open_in_driver(sandbox_root, workspace)
    assert "more than 50000 files and directories" in report["outcome"], report
    assert report["elapsed_s"] < 10, report
    assert _cache_is_empty(sandbox_root)


def test_deep_nesting_and_long_paths_are_refused(sandbox_root: Path, workspace: Path) -> None:
    deep = workspace / "deep"
    deep.mkdir()
    os.makedirs(deep / "/".join(["d"] * 70))
    report = _open_in_driver(sandbox_root, workspace)
    assert "nested deeper than 64" in report["outcome"], report

    (deep / "d").rename(workspace / "moved")
    long = workspace / "long"
    os.makedirs(long / "/".join(["n" * 200] * 6))
    report = _open_in_driver(sandbox_root, workspace)
    assert "longer than 1024 bytes" in report["outcome"], report
    assert _cache_is_empty(sandbox_root)


@pytest.mark.parametrize("root", ["/", "/proc", "/proc/self", "/sys/fs/cgroup", "/usr", "/etc"])
def test_system_paths_are_refused_as_workspaces(
    sandbox_root: Path, root: str, capsys: pytest.CaptureFixture[str]
) -> None:
    report = run_bounded(
        f"""
import contextlib, io
from flows.cli import main
err = io.StringIO()
with contextlib.redirect_stderr(err):
    code = main(["sandbox", "run", {root!r}, "--", "true"])
report(code=code, stderr=err.getvalue())
""",
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), host.ROOT_ENV: str(sandbox_root)},
        bounds=OuterBounds(timeout_s=30, file_size_mb=64),
    )
    assert report["code"] == 2, report
    assert report["stderr"].count("\n") == 1 and "is a system path" in report["stderr"], report
    assert _cache_is_empty(sandbox_root)


def test_the_sandbox_state_directory_is_refused_as_a_workspace(sandbox_root: Path) -> None:
    with pytest.raises(SnapshotError, match="own state directory"):
        open_sandbox(sandbox_root)


@pytest.mark.parametrize(
    "flag",
    [
        "--timeout-s=1e12",
        "--memory-mb=99999999999",
        "--cpus=1000",
        "--pids=10000000",
        "--disk-mb=99999999999",
        "--output-bytes=1000000000000",
        "--cpu-time-s=1e9",
        "--workspace-mb=1000000",
        "--workspace-files=100000000",
        "--timeout-s=nan",
        "--timeout-s=inf",
    ],
)
def test_numeric_flags_beyond_their_maximum_are_refused(
    workspace: Path, flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["sandbox", "run", flag, str(workspace), "--", "true"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert len(err.strip().splitlines()) == 1 and flag.split("=")[0] in err, err


def test_limits_and_timeouts_beyond_their_maximum_are_refused(
    sandbox_root: Path, workspace: Path
) -> None:
    for field, value in (("wall_time_s", 1e12), ("memory_mb", 99_999_999_999), ("cpus", 1000)):
        with pytest.raises(InvalidLimitsError, match=f"{field} must be at most"):
            Limits(**{field: value})
    with open_sandbox(workspace) as sandbox, pytest.raises(ValueError, match="at most 86400"):
        sandbox.execute("true", timeout_s=1e12)


def test_the_snapshot_cache_evicts_least_recently_used_entries_not_in_use(
    sandbox_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspaces = []
    for index in range(3):
        workspace = tmp_path / f"ws{index}"
        workspace.mkdir()
        (workspace / "data.bin").write_bytes(os.urandom(1 << 20) + bytes([index]))
        workspaces.append(workspace)
    cache = SnapshotCache(host.HostLayout(sandbox_root).snapshots)
    for workspace in workspaces[:2]:
        open_sandbox(workspace).close()
    held = open_sandbox(workspaces[2])  # mounted: never evicted
    try:
        entries = cache.entries()
        assert len(entries) == 3 and [e.mounted for e in entries].count(True) == 1
        old = time.time() - 3600
        by_age = sorted(entries, key=lambda e: e.mounted)  # unmounted first, in opening order
        for age, entry in enumerate(by_age):
            os.utime(cache.directory / f"{entry.name}.used", (old + age, old + age))

        assert main(["sandbox", "cache", "list", "--format", "json"]) == 0
        listed = capsys.readouterr()
        rows = [json.loads(line) for line in listed.out.splitlines()]
        assert len(rows) == 3 and [row["in_use"] for row in rows].count(True) == 1
        assert "3 entries" in listed.err

        # Room for two: the least recently used unmounted entry goes.
        evicted = cache.prune(2 * (1 << 20) + (64 << 10), grace_s=60)
        assert [e.name for e in evicted] == [by_age[0].name]
        assert main(["sandbox", "cache", "prune", "--max-mb", "0", "--format", "json"]) == 0
        assert json.loads(capsys.readouterr().out)["evicted"] == 1
        remaining = cache.entries()
        assert [e.name for e in remaining] == [by_age[2].name] and remaining[0].mounted
        assert held.execute("cat data.bin | wc -c").stdout.strip() == str((1 << 20) + 1)
    finally:
        held.close()
