"""What a sandbox shows of the process that launched it, and what that process leaves on the host
when it is SIGKILLed: nothing, in both cases.

Owners are separate processes killed from here; the host is then checked from outside (mount
table, runtime and staging directories, cgroups, processes), with bounded waits.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sandboxes import host, open_sandbox
from tests.sandboxes.adversarial_support import REPO_ROOT, leftovers, processes_with, wait_until

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(60)]


def test_proc_1_shows_nothing_of_the_launcher(
    sandbox_root: Path, workspace: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A working directory and an environment only the launching process has.
    launcher_cwd = tmp_path / f"launcher-cwd-{os.urandom(4).hex()}"
    launcher_cwd.mkdir()
    monkeypatch.chdir(launcher_cwd)
    monkeypatch.setenv("ROLLYARD_LAUNCHER_CANARY", "launcher-secret")
    with open_sandbox(workspace) as sandbox:
        result = sandbox.execute(
            [
                "python",
                "-c",
                textwrap.dedent("""
                    import json, os
                    seen = {}
                    for pid in filter(str.isdigit, os.listdir("/proc")):
                        for name in ("cmdline", "environ"):
                            try:
                                seen[f"{pid}/{name}"] = open(f"/proc/{pid}/{name}", "rb").read()
                            except OSError as error:
                                seen[f"{pid}/{name}"] = repr(error).encode()
                    print(json.dumps({k: v.decode(errors="replace") for k, v in seen.items()}))
                """),
            ]
        )
    seen = json.loads(result.stdout)
    assert seen["1/environ"] == "", seen["1/environ"]
    leaked = {
        key: value
        for key, value in seen.items()
        for secret in (str(launcher_cwd), str(sandbox_root), "launcher-secret", "--ro-bind")
        if secret in value
    }
    assert leaked == {}, leaked
    # bwrap is PID 1: its options (host paths among them) came through a descriptor
    assert seen["1/cmdline"].split("\0")[:2] == [host.check_host(), "--args"]


def _owner_token(pid: int) -> str:
    return f"{pid}.{host.process_start_time(pid)}"


def _assert_torn_down(sandbox_root: Path, owner: str, marker: str) -> None:
    """Without any further rollyard call: the owner's sandboxes are gone from the host."""
    clean = {"mounts": [], "runtime_dirs": [], "cgroups": [], "staging_dirs": []}
    assert wait_until(lambda: leftovers(sandbox_root, owner) == clean, 10), leftovers(
        sandbox_root, owner
    )
    assert wait_until(lambda: processes_with(marker) == [], 5), processes_with(marker)
    assert wait_until(lambda: processes_with(owner) == [], 5), "the supervisor did not exit"


def test_a_killed_library_owner_leaves_nothing_behind(sandbox_root: Path, workspace: Path) -> None:
    marker = f"adv-owner-{os.urandom(4).hex()}"
    owner_code = textwrap.dedent(f"""
        import sys
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from sandboxes import Limits, open_sandbox
        idle = open_sandbox({str(workspace)!r}, limits=Limits(memory_mb=128))
        busy = open_sandbox({str(workspace)!r}, limits=Limits(memory_mb=128))
        idle.execute("echo x > f")
        busy.execute("setsid sh -c 'sleep 300; : {marker}' >/dev/null 2>&1 & "
                     "touch started; sleep 300; : {marker}", timeout_s=300)
    """)
    owner = subprocess.Popen(
        [sys.executable, "-c", owner_code],
        env={"PATH": os.environ["PATH"], "ROLLYARD_SANDBOX_ROOT": str(sandbox_root)},
    )
    try:
        started = lambda: any((sandbox_root / "live").glob("*/merged/started"))  # noqa: E731
        assert wait_until(started, 15), "the owner never started its command"
        token = _owner_token(owner.pid)
        assert len(leftovers(sandbox_root, token)["runtime_dirs"]) == 2
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    _assert_torn_down(sandbox_root, token, marker)


def test_a_killed_sandbox_run_leaves_nothing_behind(sandbox_root: Path, workspace: Path) -> None:
    marker = f"adv-cli-{os.urandom(4).hex()}"
    owner = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "sandbox", "run", "--timeout-s", "300",
         str(workspace), "--", "sh", "-c", f"touch started; sleep 300; : {marker}"],
        cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        env={
            "PATH": os.environ["PATH"],
            "PYTHONPATH": str(REPO_ROOT),
            "ROLLYARD_SANDBOX_ROOT": str(sandbox_root),
        },
    )  # fmt: skip
    try:
        started = lambda: any((sandbox_root / "live").glob("*/merged/started"))  # noqa: E731
        assert wait_until(started, 15), "rollyard sandbox run never started its command"
        token = _owner_token(owner.pid)
    finally:
        owner.send_signal(signal.SIGKILL)
        owner.wait()
    _assert_torn_down(sandbox_root, token, marker)


@pytest.mark.slow
@pytest.mark.timeout(480)
def test_a_killed_train_leaves_no_sandbox_behind(sandbox_root: Path, tmp_path: Path) -> None:
    """`kill -9` of the train process alone (not its group): its Dask workers, which own the
    sandboxes, exit with it, and their supervisors tear the sandboxes down."""
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    tasks = tmp_path / "tasks"
    generate_demo_tasks(tasks, 2, seed=0)
    store = tmp_path / "store"
    env = {key: value for key, value in os.environ.items() if key != "PREFECT_API_URL"} | {
        "ROLLYARD_SANDBOX_ROOT": str(sandbox_root),
        "PYTHONPATH": str(REPO_ROOT),
    }
    train = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "train", "--tasks", str(tasks), "--store", str(store),
         "--iterations", "50", "--group-size", "2", "--tasks-per-iteration", "2",
         "--workers", "2"],
        cwd=REPO_ROOT, env=env, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    live = sandbox_root / "live"
    try:
        opened = lambda: live.is_dir() and any(live.iterdir())  # noqa: E731
        assert wait_until(opened, 300, 0.1), "train never opened a sandbox"
        owners = {entry.name.rsplit("-", 1)[0] for entry in live.iterdir()}
        train.send_signal(signal.SIGKILL)
        train.wait()
        clean = {"mounts": [], "runtime_dirs": [], "cgroups": [], "staging_dirs": []}
        for owner in owners:
            assert wait_until(lambda: leftovers(sandbox_root, owner) == clean, 30), leftovers(  # noqa: B023
                sandbox_root, owner
            )
    finally:
        # What train started in sessions of its own (the local Prefect server) names the store.
        for pid in processes_with(str(store)):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(train.pid, signal.SIGKILL)
