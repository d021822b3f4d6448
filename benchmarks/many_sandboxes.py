"""Many bwrap sandboxes alive at once, each with a process running: open latency as the count
grows, host memory per sandbox, and which limit binds first (pids, cgroups, file descriptors,
mounts, memory) — measured by raising the count until something fails.

    python benchmarks/many_sandboxes.py [--count 1000] [--nofile 1024] [--timeout 900]

The work runs in a child process under a wall-clock timeout; when it ends (or is killed) every
sandbox it left is reclaimed by the orphan sweep, so a failure cannot leave the machine full of
sandboxes. `--nofile` lowers the child's soft RLIMIT_NOFILE (the common default of 1,024) to see
whether descriptors bind before the count is reached.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HOLD_S = 20.0
"""How long every process keeps running once the last one has started."""
TEARDOWN_BOUND_S = 600.0
"""How long after the common deadline every `execute` must have returned."""


def meminfo_kb() -> dict[str, int]:
    values = {}
    for line in Path("/proc/meminfo").read_text().splitlines():
        name, _, rest = line.partition(":")
        values[name] = int(rest.split()[0])
    return values


def rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def host_counts() -> dict[str, int]:
    """Processes, this process's descriptors and threads, and mounts on the host."""
    pids = sum(1 for entry in os.listdir("/proc") if entry.isdigit())
    return {
        "host_processes": pids,
        "open_fds": len(os.listdir("/proc/self/fd")),
        "threads": threading.active_count(),
        "mounts": len(Path("/proc/self/mounts").read_text().splitlines()),
    }


def percentile(values: list[float] | list[int], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def child(count: int, snapshot: Path, hold_s: float) -> dict[str, Any]:
    """Open `count` sandboxes, then start `sleep` in every one (one thread each), measure while
    all run, close everything. Stops at the first failure and says what failed."""
    from sandboxes import Limits, SandboxError, open_sandbox

    # The default memory and pids limits: with 64 MB, bwrap itself was OOM-killed in every
    # sandbox at 1,000 (it grows with the host's mount table; see benchmarks/README.md).
    limits = Limits(cpus=0.1, disk_mb=8, wall_time_s=3600)
    before = meminfo_kb()
    rss_before_kb = rss_kb()
    baseline = host_counts()
    sandboxes = []
    open_ms: list[float] = []
    report: dict[str, Any] = {"count": count, "baseline": baseline, "failure": None}
    started = time.monotonic()
    try:
        for index in range(count):
            t0 = time.perf_counter()
            try:
                sandboxes.append(open_sandbox(snapshot, limits=limits))
            except (SandboxError, OSError) as error:
                report["failure"] = {
                    "phase": "open",
                    "at": index,
                    "error": f"{type(error).__name__}: {error}"[:400],
                    "counts": host_counts(),
                }
                break
            open_ms.append((time.perf_counter() - t0) * 1000)
        report["opened"] = len(sandboxes)
        report["open_wall_s"] = time.monotonic() - started
        report["open_ms"] = {
            "p50": percentile(open_ms, 0.5),
            "p90": percentile(open_ms, 0.9),
            "p99": percentile(open_ms, 0.99),
            "max": max(open_ms),
            "p50_by_tenth": [
                round(statistics.median(open_ms[i : i + max(1, len(open_ms) // 10)]), 1)
                for i in range(0, len(open_ms), max(1, len(open_ms) // 10))
            ],
        }
        idle = meminfo_kb()
        report["idle_counts"] = host_counts()

        # Every process sleeps until one common deadline, so all are alive at once for a
        # while without any signal from here; the deadline leaves room to start them all.
        per_start_s = 0.05
        deadline = time.time() + per_start_s * len(sandboxes) + 30 + hold_s
        errors: list[str] = []
        running = threading.Semaphore(0)

        def run(sandbox: Any) -> float:
            running.release()
            remaining = deadline - time.time()
            result = sandbox.execute(
                ["/bin/sleep", f"{max(0.0, remaining):.1f}"], timeout_s=remaining + 60
            )
            if result.exit_code != 0:
                errors.append(
                    f"exit {result.exit_code} after {result.duration_s:.1f} s of a "
                    f"{remaining:.1f} s sleep (timed out: {result.timed_out}, OOM-killed: "
                    f"{result.oom_killed}): {result.stderr[:200]}"
                )
            return result.duration_s

        launch_started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(max_workers=len(sandboxes) or 1) as pool:
            futures = [pool.submit(run, sandbox) for sandbox in sandboxes]
            for _ in sandboxes:
                running.acquire()
            # Wait until every sandbox's cgroup holds its process (bwrap + sleep).
            alive = 0
            while time.time() < deadline - hold_s / 2:
                alive = sum(1 for s in sandboxes if _pids_in(s) >= 1)
                if alive == len(sandboxes) or any(f.done() for f in futures):
                    break
                time.sleep(0.5)
            report["launch_wall_s"] = time.monotonic() - launch_started
            report["alive_at_once"] = alive
            loaded = meminfo_kb()
            report["running_counts"] = host_counts()
            report["pids_per_sandbox"] = statistics.median(_pids_in(s) for s in sandboxes)
            report["cgroup_memory_mb_per_sandbox"] = (
                statistics.fmean(_memory_bytes(s) for s in sandboxes) / 2**20
            )
            report["host_mb_per_sandbox"] = {
                # The child's own growth: a thread, pipes and a Popen per running sandbox.
                "owner_rss": (rss_kb() - rss_before_kb) / 1024 / max(1, len(sandboxes)),
                "idle_memavailable": (before["MemAvailable"] - idle["MemAvailable"])
                / 1024
                / max(1, len(sandboxes)),
                "running_memavailable": (before["MemAvailable"] - loaded["MemAvailable"])
                / 1024
                / max(1, len(sandboxes)),
                "running_kernel": (
                    (loaded["Slab"] + loaded["KernelStack"] + loaded["PageTables"])
                    - (before["Slab"] + before["KernelStack"] + before["PageTables"])
                )
                / 1024
                / max(1, len(sandboxes)),
            }
            # Every sleep ends at the deadline; a thousand executes then read their pipes, reap
            # and empty their cgroups at once, which takes a while on two loaded cores.
            for future in futures:
                try:
                    future.result(timeout=max(1.0, deadline - time.time() + TEARDOWN_BOUND_S))
                except Exception as error:
                    errors.append(f"{type(error).__name__}: {error}"[:300])
            report["all_returned_after_deadline_s"] = time.time() - deadline
            peaks = [_memory_bytes(s, peak=True) for s in sandboxes]
            report["cgroup_peak_memory_mb"] = {
                "p50": percentile(peaks, 0.5) / 2**20,
                "max": max(peaks, default=0) / 2**20,
            }
        if errors and report["failure"] is None:
            report["failure"] = {
                "phase": "execute",
                "errors": len(errors),
                "first": errors[0],
                "counts": report["running_counts"],
            }
    finally:
        close_started = time.monotonic()
        close_errors = []
        for sandbox in sandboxes:
            try:
                sandbox.close()
            except Exception as error:
                close_errors.append(str(error)[:200])
        report["close_wall_s"] = time.monotonic() - close_started
        report["close_errors"] = close_errors[:3]
        report["after_close_counts"] = host_counts()
    return report


def _cgroup_file(sandbox: Any, controller: str, name: str) -> Path:
    return Path("/sys/fs/cgroup") / controller / "rollyard" / sandbox.sandbox_id / name


def _pids_in(sandbox: Any) -> int:
    try:
        return int(_cgroup_file(sandbox, "pids", "pids.current").read_text())
    except (OSError, ValueError):
        path = Path("/sys/fs/cgroup/rollyard") / sandbox.sandbox_id / "pids.current"  # v2
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            return 0


def _memory_bytes(sandbox: Any, *, peak: bool = False) -> int:
    """The sandbox cgroup's memory now (or its high-water mark), v1 or v2."""
    v1, v2 = ("memory.max_usage_in_bytes", "memory.peak") if peak else (
        "memory.usage_in_bytes", "memory.current")  # fmt: skip
    for path in (
        _cgroup_file(sandbox, "memory", v1),
        Path("/sys/fs/cgroup/rollyard") / sandbox.sandbox_id / v2,
    ):
        try:
            return int(path.read_text())
        except (OSError, ValueError):
            continue
    return 0


def leftovers(owner_pid: int) -> dict[str, int]:
    """Runtime directories and cgroups of sandboxes `owner_pid` opened that are still on the
    host (0 and 0 when clean); other processes' sandboxes are not counted."""
    from sandboxes import host

    prefix = f"{owner_pid}."
    layout = host.host_layout()
    live = (
        [e for e in layout.live.iterdir() if e.name.startswith(prefix)]
        if layout.live.is_dir()
        else []
    )
    groups = 0
    for parent in (Path("/sys/fs/cgroup/pids/rollyard"), Path("/sys/fs/cgroup/rollyard")):
        if parent.is_dir():
            groups += sum(1 for e in parent.iterdir() if e.is_dir() and e.name.startswith(prefix))
    return {"runtime_dirs": len(live), "cgroups": groups}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--nofile", type=int, help="soft RLIMIT_NOFILE for the child")
    parser.add_argument("--timeout", type=float, default=1500.0, help="wall limit of the child")
    parser.add_argument("--hold", type=float, default=HOLD_S)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count < 1:
        raise SystemExit(f"error: --count must be at least 1, got {args.count}")

    if args.child is not None:
        if args.nofile:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
        print(json.dumps(child(args.count, args.child, args.hold)), flush=True)
        return 0

    from sandboxes import host

    with tempfile.TemporaryDirectory(prefix="rollyard-many-") as workdir:
        snapshot = Path(workdir) / "snapshot"
        snapshot.mkdir()
        (snapshot / "README").write_text("one file, the smallest workspace\n")
        command = [sys.executable, __file__, "--count", str(args.count),
                   "--hold", str(args.hold), "--child", str(snapshot)]  # fmt: skip
        if args.nofile:
            command += ["--nofile", str(args.nofile)]
        limits = {
            "nofile_soft_hard": resource.getrlimit(resource.RLIMIT_NOFILE),
            "nproc_soft_hard": resource.getrlimit(resource.RLIMIT_NPROC),
            "pid_max": int(Path("/proc/sys/kernel/pid_max").read_text()),
            "threads_max": int(Path("/proc/sys/kernel/threads-max").read_text()),
            "mount_max": int(Path("/proc/sys/fs/mount-max").read_text()),
            "max_user_namespaces": int(Path("/proc/sys/user/max_user_namespaces").read_text()),
            "mem_total_mb": meminfo_kb()["MemTotal"] // 1024,
        }
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)  # fmt: skip
        try:
            out, _ = process.communicate(timeout=args.timeout)
            report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            report["child_exit"] = process.returncode
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, 9)
            process.wait()
            report = {"failure": {"phase": "timeout", "after_s": args.timeout}}
        finally:
            if process.poll() is None:
                os.killpg(process.pid, 9)
                process.wait()
            # Whatever the child left (it was killed, or a close failed): reclaim it.
            report_swept = host.sweep_orphans(host.host_layout())
        report["limits"] = limits
        report["requested_nofile"] = args.nofile
        report["swept_after"] = len(report_swept)
        report["leftovers"] = leftovers(process.pid)
    text = json.dumps(report, indent=1)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0 if report.get("failure") is None and report.get("child_exit") == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
