"""The writer lease of a local store: at most one training run (or repair) writes to a store at a
time, and a second one is refused with one line naming the holder.

The lease is a lock file, `<store>/writer.lease`, locked with `flock` and holding a JSON line
naming its holder (pid, host, run id, start time, what it is doing). The kernel drops an `flock`
when its holder dies, by any signal, so a killed run never blocks the next one: the next writer
finds the file unlocked, says whose stale lease it takes over, and rewrites it. Released on exit,
the file is removed. The lock is what decides; the JSON is only what the refusal says.

Why a lease on the whole store and not per run: the store keeps the embedded Prefect server's
database under itself (`flows.runtime.prefect_home_for`), which two servers must not initialise
at once, and two writers of one run would run the same iteration twice. `flock` holds on a local
file system; object-storage stores are not leased (their commits stay exactly-once per shard).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from rollyard.errors import EXIT_UNAVAILABLE
from storage.errors import StoreError

LEASE_FILE = "writer.lease"

_log = logging.getLogger(__name__)


class LeaseHeldError(StoreError):
    """Another live process holds the store's writer lease; the message names it."""

    exit_code = EXIT_UNAVAILABLE


@dataclass(frozen=True, slots=True)
class LeaseHolder:
    """Who holds (or last held) a lease, as its lease file says."""

    pid: int
    host: str
    run_id: str
    purpose: str
    started_at: float
    """Seconds since the epoch."""

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.started_at))
        return (
            f"pid {self.pid} on {self.host} ({self.purpose}, run {self.run_id!r}, since {started})"
        )

    @classmethod
    def parse(cls, text: str) -> LeaseHolder | None:
        """The holder a lease file names; None for an empty or unreadable file (a writer killed
        while it wrote the file)."""
        try:
            data = json.loads(text)
            return cls(
                pid=int(data["pid"]),
                host=str(data["host"]),
                run_id=str(data["run_id"]),
                purpose=str(data["purpose"]),
                started_at=float(data["started_at"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


@dataclass(frozen=True, slots=True)
class LeaseState:
    """What `inspect` found: no lease file, a lease held by a live process, or a stale one."""

    path: Path
    exists: bool
    held: bool
    holder: LeaseHolder | None


# Leases this process holds, by lease path: taking one again in the same process (the CLI around
# `run_training`, then the flow itself) nests instead of locking against itself.
_held: dict[Path, tuple[int, int]] = {}
_held_lock = threading.Lock()


def lease_path(store_root: str | os.PathLike[str]) -> Path:
    return Path(store_root) / LEASE_FILE


def inspect(store_root: str | os.PathLike[str]) -> LeaseState:
    """Whether the store's lease file exists, whether a live process holds it, and whom it names;
    takes nothing (a free lock is let go at once)."""
    path = lease_path(store_root)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return LeaseState(path, exists=False, held=False, holder=None)
    try:
        holder = LeaseHolder.parse(_read(fd))
        if path.absolute() in _held:
            return LeaseState(path, exists=True, held=True, holder=holder)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return LeaseState(path, exists=True, held=True, holder=holder)
        fcntl.flock(fd, fcntl.LOCK_UN)
        return LeaseState(path, exists=True, held=False, holder=holder)
    finally:
        os.close(fd)


def held_here(store_root: str | os.PathLike[str]) -> bool:
    """Whether this process holds the store's lease."""
    return lease_path(store_root).absolute() in _held


@contextlib.contextmanager
def writer_lease(
    store_root: str | os.PathLike[str], *, run_id: str, purpose: str = "train"
) -> Iterator[LeaseHolder | None]:
    """Hold the store's writer lease for the block; yields the holder of a stale lease taken over
    (None when the lease was free). Raises `LeaseHeldError` when a live process holds it.

    Object-storage roots (`scheme://`) are not leased: the block runs without one.
    """
    root = os.fspath(store_root)
    if "://" in root and not root.startswith("file://"):
        yield None
        return
    path = lease_path(root.removeprefix("file://")).absolute()
    with _held_lock:
        if path in _held:
            fd, depth = _held[path]
            _held[path] = (fd, depth + 1)
            nested = True
        else:
            nested = False
    if nested:
        try:
            yield None
        finally:
            _release(path)
        return
    fd, stale = _acquire(path, run_id=run_id, purpose=purpose)
    if stale is not None:
        _log.warning("%s: took over the stale writer lease of %s", path.parent, stale.describe())
    with _held_lock:
        _held[path] = (fd, 1)
    try:
        yield stale
    finally:
        _release(path)


def _acquire(path: Path, *, run_id: str, purpose: str) -> tuple[int, LeaseHolder | None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = LeaseHolder.parse(_read(fd))
            os.close(fd)
            named = holder.describe() if holder else "a process that has not yet named itself"
            raise LeaseHeldError(
                f"{path.parent}: another writer holds this store: {named}; wait for it to "
                "finish or stop it, or use another --store"
            ) from None
        # A releasing holder unlinks the file while it still holds the lock: if the file we
        # locked is no longer the one at `path`, lock the new one instead.
        try:
            same = os.stat(path).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if not same:
            os.close(fd)
            continue
        stale = LeaseHolder.parse(_read(fd))
        holder = LeaseHolder(os.getpid(), socket.gethostname(), run_id, purpose, time.time())
        record = json.dumps(
            {
                "pid": holder.pid,
                "host": holder.host,
                "run_id": holder.run_id,
                "purpose": holder.purpose,
                "started_at": holder.started_at,
            }
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, (record + "\n").encode(), 0)
        return fd, stale


def _release(path: Path) -> None:
    with _held_lock:
        fd, depth = _held[path]
        if depth > 1:
            _held[path] = (fd, depth - 1)
            return
        del _held[path]
    # Unlinked while still locked, so a waiting writer re-checks the path (see `_acquire`).
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    os.close(fd)


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", errors="replace")
