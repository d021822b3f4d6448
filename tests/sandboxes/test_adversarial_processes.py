"""Escapes through processes from the bwrap sandbox: host processes, mount/unshare/ptrace,
nested sandbox tools, and other sandboxes on the same host (conftest.py: the fixtures and the
host-unchanged check)."""

from __future__ import annotations

import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from sandboxes import Sandbox, host, open_sandbox
from tests.sandboxes.adversarial_support import (
    SMALL,
    host_process,
    py,
    wait_until,
)

pytestmark = [
    pytest.mark.adversarial,
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("capable_host", "host_unchanged"),
]


# -- host processes ---------------------------------------------------------------------------


def test_host_processes_are_invisible(sandbox: Sandbox) -> None:
    marker = f"adv-host-{os.urandom(4).hex()}"
    with host_process("sh", "-c", f"sleep 60; : {marker}"):
        result = sandbox.execute("ps -eo pid,args; cat /proc/[0-9]*/cmdline | tr '\\0' ' '")
    assert marker not in result.stdout, result
    pids = [line.split()[0] for line in result.stdout.splitlines()[1:] if line.split()[0].isdigit()]
    assert len(pids) <= 4, result.stdout  # bwrap's init, sh, ps (and cat)


def test_signalling_host_processes_fails(sandbox: Sandbox) -> None:
    with host_process("sleep", "60") as victim:
        result = sandbox.execute(f"kill -9 {victim.pid}; kill -9 -1; echo done")
        time.sleep(0.1)
        assert victim.poll() is None, "a host process was killed from inside the sandbox"
    assert result.exit_code in (0, 137), result


@pytest.mark.parametrize(
    ("name", "code"),
    [
        ("mount", "libc.mount(b'none', b'/tmp', b'tmpfs', 0, None)"),
        ("unshare_user", "libc.unshare(0x10000000)"),
        ("unshare_mount", "libc.unshare(0x00020000)"),
        ("ptrace_attach", "libc.ptrace(16, os.getppid(), None, None)"),
        ("ptrace_traceme", "libc.ptrace(0, 0, None, None)"),
        ("chroot", "libc.chroot(b'/tmp')"),
        ("setns", "libc.setns(os.open('/proc/1/ns/mnt', os.O_RDONLY), 0)"),
    ],
)
def test_mount_unshare_ptrace_fail(sandbox: Sandbox, name: str, code: str) -> None:
    result = sandbox.execute(
        py(f"""
        import ctypes, os
        libc = ctypes.CDLL(None, use_errno=True)
        try:
            rc = {code}
        except OSError as error:
            rc = -1; ctypes.set_errno(error.errno)
        print(rc, os.strerror(ctypes.get_errno()))
    """)
    )
    rc, _, why = result.stdout.strip().partition(" ")
    assert rc == "-1", f"{name} succeeded: {result}"
    assert why in ("Operation not permitted", "Permission denied"), result


def test_nested_sandbox_tools_fail(sandbox: Sandbox) -> None:
    result = sandbox.execute(
        "unshare -r true && echo UNSHARED; mount -t tmpfs none /tmp && echo MOUNTED; "
        "bwrap --ro-bind / / true && echo BWRAP; true"
    )
    assert not any(w in result.stdout for w in ("UNSHARED", "MOUNTED", "BWRAP")), result


# -- many sandboxes -----------------------------------------------------------------------------


def test_concurrent_sandboxes_do_not_see_each_other(sandbox_root: Path, snapshot: Path) -> None:
    secrets_ = [f"adv-secret-{i}-{os.urandom(4).hex()}" for i in range(4)]
    sandboxes = [open_sandbox(snapshot, limits=SMALL) for _ in secrets_]
    try:

        def probe(index: int) -> str:
            sb, secret = sandboxes[index], secrets_[index]
            return sb.execute(
                f"echo {secret} > mine.txt; sh -c 'sleep 2; : {secret}' & sleep 1; "
                "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; echo; "
                # top-level files only: /tmp may hold the read-only interpreter bind
                "grep -sh adv-secret- /workspace/* /tmp/* /dev/shm/* 2>/dev/null; "
                "ls /proc | grep -c '^[0-9]'",
                timeout_s=10,
            ).stdout

        with ThreadPoolExecutor(len(sandboxes)) as pool:
            outputs = list(pool.map(probe, range(len(sandboxes))))
        for index, output in enumerate(outputs):
            others = [s for j, s in enumerate(secrets_) if j != index]
            assert secrets_[index] in output
            assert not any(other in output for other in others), output
            assert int(output.split()[-1]) <= 6, output
    finally:
        for sb in sandboxes:
            sb.close()


def test_a_command_never_sees_other_sandboxes_mounts(sandbox_root: Path, snapshot: Path) -> None:
    """Each command's launcher drops every sandbox's host mounts from its private mount
    namespace (bwrap would otherwise walk them all, and another sandbox's overlay is none of its
    business); the bind it makes there never reaches the host."""
    layout = host.HostLayout(sandbox_root)
    others = [open_sandbox(snapshot, limits=SMALL) for _ in range(3)]
    sb = open_sandbox(snapshot, limits=SMALL)
    result: list[object] = []
    runner = threading.Thread(target=lambda: result.append(sb.execute("sleep 5", timeout_s=9)))
    runner.start()
    try:
        procs_file = sb._cgroup.procs_files[0]  # type: ignore[attr-defined]
        tables: dict[int, list[str]] = {}

        def launcher_namespace_seen() -> bool:
            # Only bwrap's own table: the launcher shell before it binds and unmounts still
            # shows the host's mounts, by design; bwrap is exec'd after both. bwrap's outer
            # process stays in the launcher's namespace (its child enters the sandbox's own).
            for pid in procs_file.read_text().split():
                try:
                    if Path(f"/proc/{pid}/comm").read_text().strip() != "bwrap":
                        continue
                    lines = Path(f"/proc/{pid}/mounts").read_text().splitlines()
                except OSError:
                    continue
                tables[int(pid)] = [line.split()[1] for line in lines]
            return any(str(layout.command) in targets for targets in tables.values())

        assert wait_until(launcher_namespace_seen, 5.0), tables
        for targets in tables.values():
            assert not [t for t in targets if t.startswith(str(layout.live) + "/")], targets
    finally:
        runner.join()
        for other in [*others, sb]:
            other.close()
    assert result and result[0].exit_code == 0, result  # type: ignore[attr-defined]
    assert layout.command not in host.mounts_under(sandbox_root)
