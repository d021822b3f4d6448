"""A pool that prewarms sandboxes per snapshot, hands them out, and takes them back reset.

Opening a bwrap sandbox costs a snapshot check, a cgroup and three mounts (tens of ms); reset
costs two mounts. Episodes of the same task therefore reuse warm sandboxes: `acquire` returns one
that is already reset, and the context manager resets it on return (or closes it when the
episode broke it, e.g. a setup failure).
"""

from __future__ import annotations

import contextlib
import threading
from collections import defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

from sandboxes.base import Limits, Sandbox
from sandboxes.errors import SandboxClosedError, SandboxError

SandboxFactory = Callable[[Path, Limits, "str | None"], Sandbox]
"""Opens a sandbox over a snapshot with limits, on an image (the docker backend) or not (None)."""


def _open_default(snapshot: Path, limits: Limits, image: str | None) -> Sandbox:
    from sandboxes import open_sandbox

    return open_sandbox(snapshot, limits=limits, image=image,
                        backend="bwrap" if image is None else "docker")  # fmt: skip


PoolKey = tuple[Path, Limits, "str | None"]


class SandboxPool:
    """Thread-safe pool of idle, reset sandboxes keyed by snapshot directory, limits and image (a
    task's own image puts it on the docker backend).

    `max_idle_per_snapshot` bounds what is kept warm; beyond it returned sandboxes are closed.
    """

    def __init__(
        self,
        *,
        limits: Limits | None = None,
        max_idle_per_snapshot: int = 4,
        factory: SandboxFactory = _open_default,
    ) -> None:
        if max_idle_per_snapshot < 0:
            raise ValueError("max_idle_per_snapshot must be >= 0")
        self.limits = limits or Limits()
        self.max_idle_per_snapshot = max_idle_per_snapshot
        self._factory = factory
        self._idle: defaultdict[PoolKey, list[Sandbox]] = defaultdict(list)
        self._keys: dict[int, PoolKey] = {}
        """The key of every sandbox this pool opened and has not closed, by `id()`."""
        self._lock = threading.Lock()
        self._closed = False
        self.opened = 0
        """Sandboxes this pool has opened (a measure of how often warm ones were missing)."""

    def _key(
        self, snapshot: str | Path, limits: Limits | None, image: str | None = None
    ) -> PoolKey:
        return Path(snapshot).resolve(), limits or self.limits, image

    def prewarm(
        self,
        snapshot: str | Path,
        count: int,
        *,
        limits: Limits | None = None,
        image: str | None = None,
    ) -> None:
        """Open sandboxes over `snapshot` until `count` are idle."""
        key = self._key(snapshot, limits, image)
        while True:
            with self._lock:
                self._check_open()
                if len(self._idle[key]) >= count:
                    return
            sandbox = self._open(key)
            with self._lock:
                self._idle[key].append(sandbox)

    def _open(self, key: PoolKey) -> Sandbox:
        sandbox = self._factory(*key)
        with self._lock:
            self.opened += 1
            self._keys[id(sandbox)] = key
        return sandbox

    def take(
        self, snapshot: str | Path, *, limits: Limits | None = None, image: str | None = None
    ) -> Sandbox:
        """An idle sandbox over `snapshot` (or a new one); give it back with `give_back`.

        `limits` defaults to the pool's; sandboxes with other limits or another `image` (the
        docker backend's; None: bwrap) are pooled apart."""
        key = self._key(snapshot, limits, image)
        with self._lock:
            self._check_open()
            idle = self._idle[key]
            if idle:
                return idle.pop()
        return self._open(key)

    def give_back(self, sandbox: Sandbox, *, broken: bool = False) -> None:
        """Reset and keep `sandbox` warm, or close it if it is broken or the pool is full."""
        if sandbox.closed:
            with self._lock:
                self._keys.pop(id(sandbox), None)
            return
        with self._lock:
            key = self._keys.get(id(sandbox)) or self._key(sandbox.snapshot, sandbox.limits)
        if not broken:
            try:
                sandbox.reset()
            except SandboxError:
                broken = True
        with self._lock:
            keep = not broken and not self._closed
            keep = keep and len(self._idle[key]) < self.max_idle_per_snapshot
            if keep:
                self._idle[key].append(sandbox)
                return
            self._keys.pop(id(sandbox), None)
        sandbox.close()

    @contextlib.contextmanager
    def acquire(
        self, snapshot: str | Path, *, limits: Limits | None = None, image: str | None = None
    ) -> Iterator[Sandbox]:
        """`with pool.acquire(snapshot) as sb:` — a reset sandbox, returned reset afterwards.

        A `SandboxError` escaping the block marks the sandbox broken: it is closed, not reused.
        """
        sandbox = self.take(snapshot, limits=limits, image=image)
        broken = False
        try:
            yield sandbox
        except SandboxError:
            broken = True
            raise
        finally:
            self.give_back(sandbox, broken=broken)

    def idle_count(
        self,
        snapshot: str | Path | None = None,
        *,
        limits: Limits | None = None,
        image: str | None = None,
    ) -> int:
        with self._lock:
            if snapshot is None:
                return sum(len(v) for v in self._idle.values())
            return len(self._idle.get(self._key(snapshot, limits, image), []))

    def close(self) -> None:
        """Close every idle sandbox; sandboxes still out are closed when given back."""
        with self._lock:
            self._closed = True
            idle = [sb for sandboxes in self._idle.values() for sb in sandboxes]
            self._idle.clear()
            for sandbox in idle:
                self._keys.pop(id(sandbox), None)
        errors = []
        for sandbox in idle:
            try:
                sandbox.close()
            except SandboxError as error:
                errors.append(error)
        if errors:
            raise errors[0]

    def _check_open(self) -> None:
        if self._closed:
            raise SandboxClosedError("Cannot use a closed SandboxPool; create a new one")

    def __enter__(self) -> SandboxPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
