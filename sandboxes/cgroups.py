"""Per-sandbox control groups on cgroup v1 (one hierarchy per controller) and v2 (unified).

A sandbox gets one group `rollyard/<sandbox_id>` with limits on memory (swap included), pids and
CPU bandwidth. Its processes are killed *through the group*: a `setsid` or double-forked child
escapes a process-group kill but never its cgroup.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from pathlib import Path

from sandboxes.errors import SandboxSetupError, SandboxUnavailableError

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP_PARENT = "rollyard"
V1_CONTROLLERS = ("memory", "pids", "cpu", "freezer")
CFS_PERIOD_US = 100_000


def cgroup_version() -> int:
    """2 when /sys/fs/cgroup is the unified hierarchy, 1 when it holds per-controller mounts."""
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        return 2
    if all((CGROUP_ROOT / c / "cgroup.procs").exists() for c in V1_CONTROLLERS):
        return 1
    raise SandboxUnavailableError(
        "no usable cgroup hierarchy: need cgroup v2 at /sys/fs/cgroup or v1 controllers "
        f"{', '.join(V1_CONTROLLERS)} mounted under it; enable them in the kernel/boot "
        "configuration (or run the container with --cgroupns=host and a writable /sys/fs/cgroup)"
    )


def _write(path: Path, value: str) -> None:
    try:
        path.write_text(value)
    except OSError as error:
        raise SandboxSetupError(f"cannot write {value!r} to {path}: {error}") from error


def _rmdir_retrying(path: Path, timeout_s: float = 2.0) -> None:
    # Right after the last task is killed the group can still report EBUSY for a moment.
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.001)


class SandboxCgroup:
    """The control group of one sandbox; `procs_files` are what a launcher writes its pid into."""

    def __init__(self, sandbox_id: str, *, memory_mb: int, pids: int, cpus: float) -> None:
        self.version = cgroup_version()
        self.name = f"{GROUP_PARENT}/{sandbox_id}"
        if self.version == 1:
            self.dirs = [CGROUP_ROOT / c / self.name for c in V1_CONTROLLERS]
        else:
            _enable_v2_controllers()
            self.dirs = [CGROUP_ROOT / self.name]
        try:
            for directory in self.dirs:
                directory.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise SandboxSetupError(
                f"cannot create cgroup {self.name}: {error}; rollyard needs root and a "
                "writable /sys/fs/cgroup"
            ) from error
        self._set_limits(memory_mb=memory_mb, pids=pids, cpus=cpus)
        self._oom_kills_seen = self.oom_kill_count()

    # -- limits ---------------------------------------------------------------------------------

    def _controller_dir(self, controller: str) -> Path:
        if self.version == 2:
            return self.dirs[0]
        return CGROUP_ROOT / controller / self.name

    def _set_limits(self, *, memory_mb: int, pids: int, cpus: float) -> None:
        memory_bytes = str(int(memory_mb) << 20)
        quota_us = str(max(1000, int(cpus * CFS_PERIOD_US)))
        if self.version == 1:
            memory = self._controller_dir("memory")
            _write(memory / "memory.limit_in_bytes", memory_bytes)
            swap_limit = memory / "memory.memsw.limit_in_bytes"
            if swap_limit.exists():  # without swap accounting the memory limit alone holds
                _write(swap_limit, memory_bytes)
            _write(self._controller_dir("pids") / "pids.max", str(pids))
            cpu = self._controller_dir("cpu")
            _write(cpu / "cpu.cfs_period_us", str(CFS_PERIOD_US))
            _write(cpu / "cpu.cfs_quota_us", quota_us)
        else:
            group = self.dirs[0]
            _write(group / "memory.max", memory_bytes)
            if (group / "memory.swap.max").exists():
                _write(group / "memory.swap.max", "0")
            _write(group / "pids.max", str(pids))
            _write(group / "cpu.max", f"{quota_us} {CFS_PERIOD_US}")

    # -- membership and accounting ----------------------------------------------------------------

    @property
    def procs_files(self) -> list[Path]:
        return [d / "cgroup.procs" for d in self.dirs]

    def pids(self) -> list[int]:
        pids: set[int] = set()
        for procs in self.procs_files:
            with contextlib.suppress(FileNotFoundError):
                pids.update(int(line) for line in procs.read_text().split())
        return sorted(pids)

    def oom_kill_count(self) -> int:
        if self.version == 1:
            path = self._controller_dir("memory") / "memory.oom_control"
        else:
            path = self.dirs[0] / "memory.events"
        try:
            for line in path.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        except FileNotFoundError:
            pass
        return 0

    def take_oom_kills(self) -> int:
        """OOM kills since the last call (the v1 counter is cumulative per group)."""
        now = self.oom_kill_count()
        new, self._oom_kills_seen = now - self._oom_kills_seen, now
        return new

    # -- killing and removal ----------------------------------------------------------------------

    def kill_all(self, timeout_s: float = 5.0) -> None:
        """SIGKILL every process in the group and wait until it is empty."""
        kill_group_dirs(self.dirs, self.version, timeout_s=timeout_s)

    def remove(self) -> None:
        self.kill_all()
        for directory in self.dirs:
            _rmdir_retrying(directory)


def kill_group_dirs(dirs: list[Path], version: int, *, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    if version == 2:
        kill_file = dirs[0] / "cgroup.kill"
        if kill_file.exists():
            with contextlib.suppress(FileNotFoundError):
                kill_file.write_text("1")
    freezer = next((d for d in dirs if d.parent.parent.name == "freezer"), None)
    while True:
        pids: set[int] = set()
        for directory in dirs:
            # ENODEV/ENOENT: the group is being removed, so it is empty anyway
            with contextlib.suppress(FileNotFoundError, OSError):
                pids.update(int(p) for p in (directory / "cgroup.procs").read_text().split())
        if not pids:
            return
        # v1 has no cgroup.kill: freeze first so nothing forks between listing and killing.
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("FROZEN")
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if freezer is not None:
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text("THAWED")
        if time.monotonic() > deadline:
            raise SandboxSetupError(f"processes {sorted(pids)} survived SIGKILL in {dirs[0]}")
        time.sleep(0.001)


def _enable_v2_controllers() -> None:
    # Controllers must be enabled in every ancestor's subtree_control for the leaf to limit.
    parent = CGROUP_ROOT / GROUP_PARENT
    parent.mkdir(exist_ok=True)
    for group in (CGROUP_ROOT, parent):
        control = group / "cgroup.subtree_control"
        enabled = control.read_text().split()
        for controller in ("memory", "pids", "cpu"):
            if controller not in enabled:
                with contextlib.suppress(OSError):
                    control.write_text(f"+{controller}")


def stale_groups(live_ids: set[str]) -> list[tuple[str, list[Path], int]]:
    """Groups under rollyard/ whose sandbox id is not in `live_ids`: (id, dirs, version)."""
    version = cgroup_version()
    found: dict[str, list[Path]] = {}
    parents = (
        [CGROUP_ROOT / c / GROUP_PARENT for c in V1_CONTROLLERS]
        if version == 1
        else [CGROUP_ROOT / GROUP_PARENT]
    )
    for parent in parents:
        if not parent.is_dir():
            continue
        for child in parent.iterdir():
            if child.is_dir() and child.name not in live_ids:
                found.setdefault(child.name, []).append(child)
    return [(sandbox_id, dirs, version) for sandbox_id, dirs in found.items()]


def remove_group_dirs(dirs: list[Path], version: int) -> None:
    kill_group_dirs(dirs, version)
    for directory in dirs:
        _rmdir_retrying(directory)
