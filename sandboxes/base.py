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
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from sandboxes.egress import ENTRY_FORM, HostPort
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
    """`host:port` entries (a bare host: ports 80 and 443; `*.domain` for its subdomains) the
    sandbox's commands may reach, only through rollyard's egress proxy; empty: no network at
    all. See `sandboxes.egress`."""

    def __post_init__(self) -> None:
        for host in self.allowed_hosts:
            try:
                HostPort.parse(host)
            except ValueError as error:
                raise InvalidLimitsError(f"Limits.allowed_hosts: {error}; {ENTRY_FORM}") from None
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


INLINE_COMMAND_MAX_BYTES = 64 << 10
"""UTF-8 bytes of a string command passed on the shell's command line; a longer one reaches the
shell as a script file. The kernel refuses one argument over 128 KiB (`MAX_ARG_STRLEN`) and a
command line over `ARG_MAX`, so a long command in argv would never start."""

REFUSED_COMMAND_EXIT_CODE = 126
"""Exit code of a command the kernel refused to start (its argument list too long, a NUL byte in
it), as a shell reports a command it cannot execute."""


def refused_command(reason: str) -> ExecResult:
    """What a command the kernel cannot start did: an observation for whoever sent it (exit 126,
    `reason` on stderr), not a failure of the sandbox."""
    return ExecResult(REFUSED_COMMAND_EXIT_CODE, "", reason + "\n", 0.0)


def argv_too_long_result(argv: Sequence[str]) -> ExecResult:
    """`refused_command` for an argument list the kernel refused as too long (E2BIG)."""
    size_bytes = sum(len(os.fsencode(part)) + 1 for part in argv)
    return refused_command(
        f"argument list too long ({size_bytes} bytes in {len(argv)} arguments): the kernel "
        "refuses it; pass long input on stdin or in a file, or run it as one shell command string"
    )


MAX_ARG_BYTES = 32 * 4096
"""The kernel's limit on one argument, its NUL included (`MAX_ARG_STRLEN`)."""


def argv_over_kernel_limit(argv: Sequence[str]) -> bool:
    """Whether the kernel would refuse `argv` (E2BIG): one argument over `MAX_ARG_BYTES`, or
    all of them, with their pointers, over `ARG_MAX` less room for the environment."""
    sizes = [len(os.fsencode(part)) + 1 for part in argv]
    room_bytes = os.sysconf("SC_ARG_MAX") - (64 << 10)
    return max(sizes, default=0) > MAX_ARG_BYTES or sum(sizes) + 8 * len(sizes) > room_bytes


def command_refusal(command: str | Sequence[str]) -> str | None:
    """Why no command line can carry `command` (a NUL byte, a lone surrogate), or None."""
    for part in [command] if isinstance(command, str) else command:
        try:
            encoded = os.fsencode(str(part))
        except UnicodeEncodeError:
            return "the command holds a lone surrogate, which is not text; send valid UTF-8"
        if b"\0" in encoded:
            return "the command holds a NUL byte, which no command line can carry; remove it"
    return None


def _cut_marker(cut_bytes: int) -> str:
    # The marker `training.actions.cap_text` puts between a head and a tail, so a file read by its
    # ends reads like any other capped observation.
    return f"\n[... {cut_bytes} bytes cut ...]\n"


@dataclasses.dataclass(frozen=True, slots=True)
class FileEnds:
    """The first and last bytes of a workspace file, read without its middle
    (`Sandbox.read_file_ends`): all of it when it fits, `tail` empty."""

    head: bytes
    tail: bytes
    size_bytes: int
    """The file's size when it was read (`stat`), kept bytes and cut ones together."""

    @staticmethod
    def plan(size_bytes: int, max_bytes: int) -> tuple[int, int]:
        """Bytes of head and tail to read of a file of `size_bytes` so that head, cut marker
        and tail together fit `max_bytes` of text (the marker sized for the largest cut)."""
        if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes <= 0:
            raise ValueError(f"max_bytes must be a positive integer, got {max_bytes!r}")
        if size_bytes <= max_bytes:
            return size_bytes, 0
        keep = max(0, max_bytes - len(_cut_marker(size_bytes).encode()))
        return keep // 2, keep - keep // 2

    @classmethod
    def of(cls, data: bytes, max_bytes: int) -> FileEnds:
        """The ends of `data` (a whole file already in memory) within `max_bytes`."""
        head_bytes, tail_bytes = cls.plan(len(data), max_bytes)
        tail = data[len(data) - tail_bytes :] if tail_bytes else b""
        return cls(data[:head_bytes], tail, len(data))

    @property
    def truncated(self) -> bool:
        return len(self.head) + len(self.tail) < self.size_bytes

    def text(self) -> str:
        """The ends as text, a marker saying how many bytes were cut between them; characters
        split by the cut are dropped, bytes that are not UTF-8 replaced."""
        if not self.truncated:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        cut_bytes = self.size_bytes - len(self.head) - len(self.tail)
        head = _drop_split_character(self.head, at_end=True).decode("utf-8", errors="replace")
        tail = _drop_split_character(self.tail, at_end=False).decode("utf-8", errors="replace")
        return head + _cut_marker(cut_bytes) + tail


def _drop_split_character(data: bytes, *, at_end: bool) -> bytes:
    """`data` without the partial UTF-8 character a cut left at its end (or start)."""
    if at_end:
        # Back over continuation bytes to the last lead byte; drop it if its character is short.
        for back in range(1, min(4, len(data)) + 1):
            byte = data[-back]
            if byte & 0xC0 != 0x80:
                need = 2 if byte >> 5 == 0b110 else 3 if byte >> 4 == 0b1110 else 4
                if byte >= 0xC0 and back < need:
                    return data[:-back]
                return data
        return data
    start = 0
    while start < min(3, len(data)) and data[start] & 0xC0 == 0x80:
        start += 1
    return data[start:]


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

    def read_file_ends(self, path: str, *, max_bytes: int) -> FileEnds:
        """The head and tail of a workspace file within `max_bytes` (`FileEnds.plan`), memory
        bounded by what is kept, not by the file's size. The backends read only the ends; this
        default, for wrappers of another sandbox, reads the whole file."""
        FileEnds.plan(0, max_bytes)  # a bad max_bytes raises before anything is read
        return FileEnds.of(self.read_file(path), max_bytes)

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
