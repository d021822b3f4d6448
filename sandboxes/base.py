"""The one small interface every sandbox backend implements, and the values it exchanges.

A sandbox is opened over a *snapshot* (a directory holding a task's initial workspace). Commands
run inside it with the workspace as their working directory; file edits persist between commands
until `reset()`, which brings the workspace back to the pristine snapshot. `diff()` reports what
changed. Network is off, or reaches only the hosts `Limits.allowed_hosts` lists, through the
egress proxy (`sandboxes.egress`).
"""

from __future__ import annotations

import abc
import contextlib
import dataclasses
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from sandboxes.errors import InvalidLimitsError, SandboxClosedError

WORKSPACE_MOUNT = "/workspace"
"""Where the workspace appears inside every sandbox (and the working directory of commands)."""


LIMIT_MAXIMA: dict[str, int] = {
    # A day: no single command of an episode or a verification runs longer.
    "wall_time_s": 86_400,
    # A week of CPU seconds: a day on every core a sandbox may have on a large host.
    "cpu_time_s": 604_800,
    # 1 TiB: beyond any host rollyard runs on; larger numbers are typos.
    "memory_mb": 1 << 20,
    # Well above any test suite; the kernel's own pid space is 32768 on many hosts.
    "pids": 65_536,
    "cpus": 256,
    # tmpfs layers: charged to the sandbox's memory, so bounded like it.
    "disk_mb": 1 << 20,
    # Captured in memory, twice (stdout and stderr).
    "output_bytes": 64 << 20,
    "workspace_mb": 64 << 10,
    "workspace_files": 1_000_000,
}
"""The largest value each `Limits` field accepts; the CLI's sandbox flags share them."""


@dataclasses.dataclass(frozen=True, slots=True)
class Limits:
    """Resource limits of one sandbox. Every field can be overridden; network is off unless
    `allowed_hosts` lists hosts, which are then reached through the egress proxy only."""

    wall_time_s: float = 60.0
    """Default wall-clock limit of one `execute` (its `timeout_s` argument overrides it)."""
    cpu_time_s: float = 120.0
    """CPU seconds one `execute` may use in all (RLIMIT_CPU per process, rounded up)."""
    memory_mb: int = 1024
    """Memory of all processes of the sandbox together (cgroup), workspace writes included."""
    pids: int = 256
    """Processes and threads alive at once (cgroup pids controller)."""
    cpus: float = 1.0
    """CPU bandwidth in cores (cgroup CFS quota)."""
    disk_mb: int = 512
    """Bytes the workspace may grow by (size of the copy-on-write upper layer), and of /tmp."""
    output_bytes: int = 1_000_000
    """Captured bytes per stream (stdout, stderr); beyond it the head and tail are kept."""
    workspace_mb: int = 1024
    """Size of the snapshot a sandbox opens over, apparent and allocated bytes each (checked by
    `stat` before any file is read or copied)."""
    workspace_files: int = 50_000
    """Entries (files, directories, links) of the snapshot a sandbox opens over."""
    allowed_hosts: tuple[str, ...] = ()
    """Hosts the sandbox's commands may reach, only through rollyard's egress proxy (HTTP and
    HTTPS via `HTTP_PROXY`; `*.domain` for its subdomains); empty: no network at all. See
    `sandboxes.egress`."""

    def __post_init__(self) -> None:
        for host in self.allowed_hosts:
            if not isinstance(host, str) or not host.strip() or any(c in host for c in " /\\@\0"):
                raise InvalidLimitsError(
                    f"Limits.allowed_hosts holds {host!r}, which is not a host name; "
                    "list names such as pypi.org or *.example.com"
                )
        for field in dataclasses.fields(self):
            if field.name == "allowed_hosts":
                continue
            value = getattr(self, field.name)
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise InvalidLimitsError(f"Limits.{field.name} must be a number, got {value!r}")
            if not math.isfinite(value) or value <= 0:
                raise InvalidLimitsError(
                    f"Limits.{field.name} must be a positive number, got {value!r}; "
                    "raise it or leave the default"
                )
            maximum = LIMIT_MAXIMA[field.name]
            if value > maximum:
                raise InvalidLimitsError(
                    f"Limits.{field.name} must be at most {maximum}, got {value!r}"
                )

    def replace(self, **changes: float | tuple[str, ...]) -> Limits:
        return dataclasses.replace(self, **changes)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True)
class ExecResult:
    """What one command did. `exit_code` is the shell convention: 128+N when killed by signal N."""

    exit_code: int
    stdout: str
    stderr: str
    duration_s: float
    timed_out: bool = False
    """The wall-clock limit ended it (everything in the sandbox was killed)."""
    oom_killed: bool = False
    """The memory limit killed a process of the sandbox during this command."""
    output_truncated: bool = False
    """stdout or stderr exceeded `Limits.output_bytes`; the head and tail were kept."""

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.oom_killed


@dataclasses.dataclass(frozen=True, slots=True)
class WorkspaceDiff:
    """Changes of the workspace against its snapshot, as sorted POSIX paths relative to it."""

    added: tuple[str, ...] = ()
    modified: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()

    @property
    def changed_paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.added, *self.modified, *self.deleted}))

    def __bool__(self) -> bool:
        return bool(self.added or self.modified or self.deleted)


class Sandbox(abc.ABC):
    """An isolated, resource-limited workspace over a snapshot.

    Use as a context manager (or call `close()`, which is idempotent). Any operation after
    `close()` raises `SandboxClosedError`.
    """

    backend_name: str = "abstract"

    def __init__(self, snapshot: Path, snapshot_digest: str, limits: Limits) -> None:
        self.snapshot = snapshot
        self.snapshot_digest = snapshot_digest
        self.limits = limits
        self._closed = False

    # -- the interface -------------------------------------------------------------------------

    @abc.abstractmethod
    def execute(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        """Run `command` (a string for `/bin/sh -c`, or an argv list) in the workspace.

        Every process the command started is gone when this returns, daemons included.
        """

    @abc.abstractmethod
    def read_file(self, path: str) -> bytes:
        """Bytes of a workspace file (`path` relative to the workspace, or under /workspace)."""

    @abc.abstractmethod
    def write_file(self, path: str, data: str | bytes) -> None:
        """Create or replace a workspace file, creating parent directories."""

    @abc.abstractmethod
    def diff(self) -> WorkspaceDiff:
        """Added, modified and deleted files against the snapshot."""

    @abc.abstractmethod
    def reset(self) -> None:
        """Return the workspace to the pristine snapshot (cost independent of its size)."""

    @abc.abstractmethod
    def _close(self) -> None:
        """Release every host resource; called once by `close()`."""

    # -- lifecycle -----------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._close()

    def _timeout_for(self, timeout_s: float | None) -> float:
        """The wall-clock limit of one `execute`: its argument, else `Limits.wall_time_s`."""
        if timeout_s is None:
            return self.limits.wall_time_s
        if not 0 < timeout_s <= LIMIT_MAXIMA["wall_time_s"]:
            raise ValueError(
                f"timeout_s must be positive and at most {LIMIT_MAXIMA['wall_time_s']}, "
                f"got {timeout_s!r}"
            )
        return timeout_s

    def _check_open(self, operation: str) -> None:
        if self._closed:
            raise SandboxClosedError(
                f"Cannot call {operation}() on a closed {self.backend_name} sandbox; "
                "open a new one (or acquire one from a SandboxPool)"
            )

    def __enter__(self) -> Self:
        self._check_open("__enter__")
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def __del__(self) -> None:
        # A forgotten sandbox must not keep mounts and cgroups alive; for an owner SIGKILLed
        # before it gets here, its supervisor (and the next start-up sweep) reclaim them.
        with contextlib.suppress(Exception):
            self.close()
