"""Outer bounds, host probes and small helpers for the adversarial sandbox tests.

A resource bomb is driven from a child process that has bounds of its own, so a broken sandbox
fails the test instead of taking the machine down:
- the driver process sits in an outer cgroup (memory and pids), which caps what the driver itself
  can hold (captured output, threads);
- the driver's rlimits (address space, processes of the sandbox uid, file size, CPU time) are
  inherited through the launcher, setpriv and bwrap by every sandboxed process, so they bound the
  bomb even if the sandbox's own cgroup were never joined;
- a wall timeout kills the driver and everything left in its outer cgroup.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import secrets
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from sandboxes import Limits, cgroups, host

OUTER_PARENT = "rollyard-adversarial"
"""Outer groups live beside `rollyard/`, never under it, so the orphan sweep leaves them alone."""

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class OuterCgroup:
    """A memory+pids group for one driver process (cgroup v1 or v2)."""

    dirs: list[Path]
    version: int

    @classmethod
    def create(cls, *, memory_mb: int, pids: int) -> OuterCgroup:
        version = cgroups.cgroup_version()
        name = f"{OUTER_PARENT}/{secrets.token_hex(6)}"
        root = cgroups.CGROUP_ROOT
        if version == 1:
            dirs = [root / "memory" / name, root / "pids" / name]
        else:
            parent = root / OUTER_PARENT
            parent.mkdir(exist_ok=True)
            for group in (root, parent):
                with contextlib.suppress(OSError):
                    (group / "cgroup.subtree_control").write_text("+memory +pids")
            dirs = [root / name]
        for directory in dirs:
            directory.mkdir(parents=True)
        memory_bytes = str(memory_mb << 20)
        if version == 1:
            (dirs[0] / "memory.limit_in_bytes").write_text(memory_bytes)
            (dirs[1] / "pids.max").write_text(str(pids))
        else:
            (dirs[0] / "memory.max").write_text(memory_bytes)
            (dirs[0] / "pids.max").write_text(str(pids))
        return cls(dirs, version)

    @property
    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in self.dirs]

    def remove(self) -> None:
        cgroups.remove_group_dirs(self.dirs, self.version)


@dataclass(frozen=True)
class OuterBounds:
    """Bounds of one driver process; generous against the sandbox limits the tests set, tight
    against what would hurt a 2-core shared machine."""

    memory_mb: int = 512
    pids: int = 128
    address_space_mb: int = 2048
    sandbox_uid_processes: int = 1024
    file_size_mb: int = 256
    cpu_s: int = 60
    """RLIMIT_CPU of the driver; sandboxes opened by it must ask for less (`Limits.cpu_time_s`)."""
    timeout_s: float = 40.0


def _limit_self(bounds: OuterBounds, procs_files: list[str]) -> None:
    # Runs in the driver between fork and exec (as root): join the outer group, then set the
    # rlimits every descendant inherits. RLIMIT_NPROC only binds non-root, i.e. the sandbox uid.
    pid = str(os.getpid())
    for procs in procs_files:
        with open(procs, "w") as handle:
            handle.write(pid)
    mb = 1 << 20
    resource.setrlimit(resource.RLIMIT_AS, (bounds.address_space_mb * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_NPROC, (bounds.sandbox_uid_processes,) * 2)
    resource.setrlimit(resource.RLIMIT_FSIZE, (bounds.file_size_mb * mb,) * 2)
    resource.setrlimit(resource.RLIMIT_CPU, (bounds.cpu_s,) * 2)


DRIVER_PRELUDE = """
import json, os, resource, sys, time
sys.path.insert(0, {repo!r})
from sandboxes import Limits, open_sandbox, host
def report(**values):
    values["owner"] = host.owner_token()
    values["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print("RESULT " + json.dumps(values), flush=True)
def result_dict(result):
    return dict(exit_code=result.exit_code, stdout=result.stdout[-4000:],
                stderr=result.stderr[-4000:], duration_s=result.duration_s,
                timed_out=result.timed_out, oom_killed=result.oom_killed,
                output_truncated=result.output_truncated, stdout_len=len(result.stdout))
"""


def run_bounded(script: str, *, env: dict[str, str], bounds: OuterBounds | None = None) -> dict:
    """Run `script` (Python, after DRIVER_PRELUDE) in a bounded driver; return what it passed
    to `report(...)`. The test fails if the driver dies, overruns or reports nothing."""
    bounds = bounds or OuterBounds()
    outer = OuterCgroup.create(memory_mb=bounds.memory_mb, pids=bounds.pids)
    code = DRIVER_PRELUDE.format(repo=str(REPO_ROOT)) + script
    try:
        process = subprocess.Popen(
            [sys.executable, "-c", code],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=lambda: _limit_self(bounds, outer.procs_files),
            start_new_session=True,
        )
        try:
            stdout, stderr = process.communicate(timeout=bounds.timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            stdout, stderr = process.communicate()
            raise AssertionError(
                f"driver overran its outer bound of {bounds.timeout_s} s: {stderr[-2000:]!r}"
            ) from None
    finally:
        outer.remove()
    for line in reversed(stdout.decode(errors="replace").splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line.removeprefix("RESULT "))
    raise AssertionError(
        f"driver exited {process.returncode} without a result: {stderr.decode()[-3000:]}"
    )


# -- host probes ----------------------------------------------------------------------------


def processes_with(marker: str) -> list[int]:
    """Host pids whose command line contains `marker` (this process excluded)."""
    found = []
    needle = marker.encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def wait_until(predicate, timeout_s: float = 5.0, interval_s: float = 0.02) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return bool(predicate())


def cgroups_of_owner(owner: str) -> list[Path]:
    """Sandbox cgroup dirs (any controller) whose sandbox id was made by `owner`."""
    found = []
    parents = [cgroups.CGROUP_ROOT / c / cgroups.GROUP_PARENT for c in cgroups.V1_CONTROLLERS]
    parents.append(cgroups.CGROUP_ROOT / cgroups.GROUP_PARENT)
    for parent in parents:
        if parent.is_dir():
            found += [c for c in parent.iterdir() if c.is_dir() and c.name.startswith(owner + "-")]
    return found


def leftovers(root: Path, owner: str) -> dict[str, list[str]]:
    """Everything a sandbox owner may leave behind; all lists are empty on a clean host."""
    live = host.HostLayout(root).live
    return {
        "mounts": [str(m) for m in host.sandbox_mounts(host.HostLayout(root))],
        "runtime_dirs": sorted(p.name for p in live.iterdir()) if live.is_dir() else [],
        "cgroups": [str(c) for c in cgroups_of_owner(owner)],
        "staging_dirs": sorted(p.name for p in host.HostLayout(root).snapshots.glob(".staging-*")),
    }


@contextlib.contextmanager
def host_process(*argv: str) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield process
    finally:
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        process.wait()


SMALL = Limits(memory_mb=192, pids=64, disk_mb=32, wall_time_s=10, output_bytes=100_000)
"""The limits of the sandboxes the adversarial tests attack."""


def py(code: str) -> list[str]:
    """argv running `code` with the sandbox's Python (no shell quoting to get wrong)."""
    return ["python", "-c", textwrap.dedent(code)]


def driver_env(sandbox_root: Path) -> dict[str, str]:
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), host.ROOT_ENV: str(sandbox_root)}
