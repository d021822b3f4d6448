"""What an attacked bwrap sandbox leaves behind: reset restores the snapshot, close leaves no
mounts, cgroups or runtime dirs, and an owner killed with its supervisor is swept at the next
start-up (conftest.py: the fixtures and the host-unchanged check)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandboxes import Sandbox, SandboxError, host, open_sandbox
from tests.sandboxes.adversarial_support import (
    REPO_ROOT,
    SMALL,
    driver_env,
    leftovers,
    processes_with,
    wait_until,
)

pytestmark = [
    pytest.mark.adversarial,
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("capable_host", "host_unchanged"),
]


# -- reset and teardown ---------------------------------------------------------------------------


def test_reset_after_an_attack_restores_the_pristine_snapshot(
    sandbox: Sandbox, snapshot: Path
) -> None:
    listing = "find . | sort; cat calc.py pkg/data.txt; stat -c '%n %a %U' $(find . | sort)"
    pristine = sandbox.execute(listing).stdout
    attack = sandbox.execute(
        "echo pwned > calc.py; rm -rf pkg; chmod 000 run.sh; mkfifo fifo; ln -s /etc evil; "
        "mkdir -p deep/er; head -c 1M /dev/urandom > deep/er/blob; touch .hidden; "
        "setsid sh -c 'sleep 30' >/dev/null 2>&1 &"
    )
    assert attack.exit_code == 0, attack
    assert sandbox.diff()
    sandbox.reset()
    assert not sandbox.diff()
    assert sandbox.execute(listing).stdout == pristine
    assert sandbox.read_file("calc.py") == (snapshot / "calc.py").read_bytes()


def test_close_leaves_no_mounts_cgroups_or_runtime_dirs(sandbox_root: Path, snapshot: Path) -> None:
    sb = open_sandbox(snapshot, limits=SMALL)
    sb.execute("setsid sleep 30 >/dev/null 2>&1 & echo x > f")
    runtime_dir = sb._dir  # type: ignore[attr-defined]
    cgroup_dirs = list(sb._cgroup.dirs)  # type: ignore[attr-defined]
    layout = host.HostLayout(sandbox_root)
    assert runtime_dir.exists() and host.sandbox_mounts(layout)
    sb.close()
    sb.close()
    assert not runtime_dir.exists()
    assert host.sandbox_mounts(layout) == []
    assert not any(d.exists() for d in cgroup_dirs)
    with pytest.raises(SandboxError):
        sb.execute("true")


@pytest.mark.timeout(60)
def test_orphans_of_an_owner_killed_with_its_supervisor_are_swept_at_the_next_start_up(
    sandbox_root: Path, snapshot: Path
) -> None:
    # The supervisor reclaims a killed owner's sandboxes by itself (tests/adversarial); this is
    # the backstop for when it is killed too, e.g. by a kill of every process on the host.
    marker = f"adv-orphan-{os.urandom(4).hex()}"
    owner_code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from sandboxes import Limits, open_sandbox
        idle = open_sandbox({str(snapshot)!r}, limits=Limits(memory_mb=128))
        busy = open_sandbox({str(snapshot)!r}, limits=Limits(memory_mb=128))
        idle.execute("echo x > f")
        busy.execute("setsid sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 & "
                     "touch started; sleep 300; : {marker}", timeout_s=300)
    """)
    env = driver_env(sandbox_root)
    owner = subprocess.Popen([sys.executable, "-c", owner_code], env=env)
    try:
        # once the command runs, bwrap has armed --die-with-parent (a kill during its start-up
        # leaves processes that only the sweep's cgroup kill reclaims)
        started = lambda: any((sandbox_root / "live").glob("*/merged/started"))  # noqa: E731
        assert wait_until(started, 10), "owner never started its command"
        owner_token = f"{owner.pid}.{host.process_start_time(owner.pid)}"
        supervisors = processes_with(owner_token)
        assert len(supervisors) == 1, supervisors
        os.kill(supervisors[0], signal.SIGKILL)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    # --die-with-parent takes the command down with its owner; host state stays behind.
    assert wait_until(lambda: processes_with(marker) == [], 5), processes_with(marker)
    # (Its cgroups may already be gone: a sweep by any other process on this host reclaims
    # cgroups of dead owners. Runtime dirs and mounts belong to this test's root alone.)
    orphans = leftovers(sandbox_root, owner_token)
    assert len(orphans["runtime_dirs"]) == 2 and orphans["mounts"], orphans

    # The next process to open a sandbox over this root sweeps them at start-up.
    next_start = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {str(REPO_ROOT)!r})
            from sandboxes import open_sandbox
            with open_sandbox({str(snapshot)!r}) as sb:
                print(sb.execute("echo fresh").stdout, end="")
        """)],
        env=env, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    assert next_start.stdout == "fresh\n", next_start.stderr
    assert leftovers(sandbox_root, owner_token) == {
        "mounts": [], "runtime_dirs": [], "cgroups": [], "staging_dirs": []
    }  # fmt: skip
    assert processes_with(marker) == []
