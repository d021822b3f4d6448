"""Tears a process's sandboxes down when that process dies, SIGKILL included.

The first bwrap sandbox a process opens starts one supervisor for it: a small process in a
session of its own that waits on a pidfd of its owner and, once the owner is gone, reclaims what
the owner left (cgroups and their processes, mounts, runtime and staging directories). The sweep
at the next sandbox start-up stays as the backstop for a supervisor killed along with its owner.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from sandboxes import host
from sandboxes.errors import SandboxSetupError

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[1])
_started: set[tuple[int, Path]] = set()
_lock = threading.Lock()
# Only where pidfds are missing (Linux < 5.3): how often the owner's liveness is polled.
_POLL_S = 0.5


def ensure_supervisor(layout: host.HostLayout) -> None:
    """Start this process's supervisor for `layout` unless it runs already (one per process and
    sandbox root; a forked child gets its own)."""
    key = (os.getpid(), layout.root)
    with _lock:
        if key in _started:
            return
        code = (
            f"import sys; sys.path.insert(0, {_PACKAGE_PARENT!r}); "
            "from sandboxes.supervisor import main; main(sys.argv[1:])"
        )
        try:
            # Its own session and no inherited descriptors: a signal to the owner's process
            # group does not reach it, and it holds none of the owner's pipes open (a caller
            # reading the owner's output to EOF would otherwise wait for the supervisor).
            subprocess.Popen(
                [sys.executable, "-I", "-c", code, host.owner_token(), str(layout.root)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                close_fds=True,
                start_new_session=True,
                cwd="/",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
            )
        except OSError as error:
            raise SandboxSetupError(f"cannot start the sandbox supervisor: {error}") from error
        _started.add(key)


def wait_for_exit(owner: str) -> None:
    """Return once the process named by the owner token `owner` has exited."""
    pid = int(owner.partition(".")[0])
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    except OSError:  # no pidfd support: poll, the start time guarding against pid reuse
        while host.owner_alive(owner):
            time.sleep(_POLL_S)
        return
    try:
        # The pid may have been reused between the token and the pidfd: check it is the owner.
        if host.owner_alive(owner):
            select.select([pidfd], [], [])
    finally:
        os.close(pidfd)


def main(argv: list[str]) -> None:
    owner, root = argv
    # A terminal's Ctrl-C or hang-up goes to the owner; the supervisor outlives it to clean up.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    wait_for_exit(owner)
    with contextlib.suppress(Exception):
        host.sweep_orphans(host.HostLayout(Path(root)), owner=owner)
