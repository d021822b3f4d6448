"""Many bwrap sandboxes alive at once, each with a process running: open latency, the cost of
one command as the count grows, host memory per sandbox, and which limit binds first (pids,
cgroups, file descriptors, mounts, memory) — measured, by raising the count.

    python benchmarks/many_sandboxes.py [--count 1000] [--launch-budget 900] [--nofile 1024]

Phases: open `--count` sandboxes (timing `execute(["true"])` at 1, 100, 250, ... open), then start
a `sleep` in each, one at a time, each confirmed running (a `sleep` in its cgroup) before the
next, until all run or the budget is spent; measure; kill the sleeps from the host; close. The
work runs in a child process under a wall-clock timeout, in a private mount namespace of its own
(`unshare --mount`): the ~4 host mounts each open sandbox holds stay out of the host's table,
where every other bwrap on the machine would copy them, and they vanish with the child whatever
happens to it; whatever else it leaves (cgroups, directories) is reclaimed by the orphan sweep.
`--nofile` lowers the child's soft RLIMIT_NOFILE (1,024 is a common default) to see whether
descriptors bind first.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

LAUNCH_BUDGET_S = 900.0
"""How long starting the processes may take in all; what started by then is measured."""
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


PROBE_AT = (1, 100, 250, 500, 750, 1000)
"""Open-sandbox counts at which one `execute(["true"])` is timed (three times)."""


def _running_sleep(sandbox: Any) -> int | None:
    """The host pid of a `sleep` in the sandbox's cgroup, once the command is really running
    (bwrap's own processes are in the group from the first instant of its setup)."""
    for pid in _pids_of(sandbox):
        try:
            if Path(f"/proc/{pid}/comm").read_text().strip() == "sleep":
                return pid
        except OSError:
            continue
    return None


def child(count: int, snapshot: Path, launch_budget_s: float) -> dict[str, Any]:
    """Open `count` sandboxes (timing `execute(["true"])` at `PROBE_AT` counts), then start a
    `sleep` in each, one at a time and each confirmed running, until all run or
    `launch_budget_s` is spent; measure while they all run; stop them from the host; close."""
    from sandboxes import Limits, SandboxError, open_sandbox

    limits = Limits(wall_time_s=3600)
    before = meminfo_kb()
    rss_before_kb = rss_kb()
    report: dict[str, Any] = {"count": count, "baseline": host_counts(), "failure": None}
    sandboxes: list[Any] = []
    open_ms: list[float] = []
    probes: dict[int, Any] = {}
    try:
        for index in range(count):
            t0 = time.perf_counter()
            try:
                sandboxes.append(open_sandbox(snapshot, limits=limits))
            except (SandboxError, OSError) as error:
                report["failure"] = {"phase": "open", "at": index, "counts": host_counts(),
                                     "error": f"{type(error).__name__}: {error}"[:400]}  # fmt: skip
                break
            open_ms.append((time.perf_counter() - t0) * 1000)
            if len(sandboxes) in PROBE_AT:
                runs = [sandboxes[-1].execute(["true"], timeout_s=120) for _ in range(3)]
                probes[len(sandboxes)] = {
                    "mounts": host_counts()["mounts"],
                    "true_ms": sorted(round(r.duration_s * 1000, 1) for r in runs),
                    "peak_mb": round(_memory_bytes(sandboxes[-1], peak=True) / 2**20, 1),
                }
                print(json.dumps({"probe": len(sandboxes), **probes[len(sandboxes)]}),
                      file=sys.stderr, flush=True)  # fmt: skip
        report["opened"] = len(sandboxes)
        report["open_ms"] = {
            "p50": percentile(open_ms, 0.5),
            "p90": percentile(open_ms, 0.9),
            "p99": percentile(open_ms, 0.99),
            "max": max(open_ms),
        }
        report["execute_true_by_open_count"] = probes
        idle = meminfo_kb()
        report["idle_counts"] = host_counts()

        results: list[Any] = []
        start_ms: list[float] = []

        def run(sandbox: Any) -> None:
            results.append(sandbox.execute(["/bin/sleep", "3000"], timeout_s=3300))

        threads = []
        launch_started = time.monotonic()
        for sandbox in sandboxes:
            if time.monotonic() - launch_started > launch_budget_s:
                break
            t0 = time.perf_counter()
            thread = threading.Thread(target=run, args=(sandbox,), daemon=True)
            thread.start()
            threads.append(thread)
            while _running_sleep(sandbox) is None and thread.is_alive():
                time.sleep(0.002)
            start_ms.append((time.perf_counter() - t0) * 1000)
        report["launch_wall_s"] = time.monotonic() - launch_started
        report["start_to_running_ms_by_tenth"] = [
            round(statistics.median(start_ms[i : i + max(1, len(start_ms) // 10)]), 1)
            for i in range(0, len(start_ms), max(1, len(start_ms) // 10))
        ]
        sleeping = {s.sandbox_id: _running_sleep(s) for s in sandboxes[: len(threads)]}
        report["alive_at_once"] = sum(1 for pid in sleeping.values() if pid is not None)
        loaded = meminfo_kb()
        report["running_counts"] = host_counts()
        report["pids_per_sandbox"] = statistics.median(
            len(_pids_of(s)) for s in sandboxes[: len(threads)]
        )
        report["cgroup_memory_mb_per_sandbox"] = (
            statistics.fmean(_memory_bytes(s) for s in sandboxes[: len(threads)]) / 2**20
        )
        running = max(1, len(threads))
        report["host_mb_per_sandbox"] = {
            # The child's own growth: a thread, pipes and a Popen per running sandbox.
            "owner_rss": (rss_kb() - rss_before_kb) / 1024 / running,
            "idle_memavailable": (before["MemAvailable"] - idle["MemAvailable"]) / 1024 / count,
            "running_memavailable": (before["MemAvailable"] - loaded["MemAvailable"])
            / 1024
            / running,
            "running_kernel": (
                (loaded["Slab"] + loaded["KernelStack"] + loaded["PageTables"])
                - (before["Slab"] + before["KernelStack"] + before["PageTables"])
            )
            / 1024
            / running,
        }
        # Stop the workload from the host (each sleep is this benchmark's own process), one at
        # a time: a thousand namespaces torn down at once contend for the kernel's mount lock.
        stop_started = time.monotonic()
        for pid, thread in zip(sleeping.values(), threads, strict=True):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            thread.join(timeout=max(1.0, TEARDOWN_BOUND_S - (time.monotonic() - stop_started)))
        report["stop_wall_s"] = time.monotonic() - stop_started
        report["executes_returned"] = len(results)
        if any(thread.is_alive() for thread in threads):
            report["failure"] = {
                "phase": "stop",
                "still_running": sum(t.is_alive() for t in threads),
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


def _pids_of(sandbox: Any) -> list[int]:
    for path in (
        _cgroup_file(sandbox, "pids", "cgroup.procs"),
        Path("/sys/fs/cgroup/rollyard") / sandbox.sandbox_id / "cgroup.procs",
    ):
        try:
            return [int(p) for p in path.read_text().split()]
        except (OSError, ValueError):
            continue
    return []


def _cgroup_file(sandbox: Any, controller: str, name: str) -> Path:
    return Path("/sys/fs/cgroup") / controller / "rollyard" / sandbox.sandbox_id / name


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
    parser.add_argument("--timeout", type=float, default=2400.0, help="wall limit of the child")
    parser.add_argument("--launch-budget", type=float, default=LAUNCH_BUDGET_S)
    parser.add_argument("--json", type=Path, help="also write the report here")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.count < 1:
        raise SystemExit(f"error: --count must be at least 1, got {args.count}")

    if args.child is not None:
        if args.nofile:
            _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
            resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, hard))
        print(json.dumps(child(args.count, args.child, args.launch_budget)), flush=True)
        return 0

    from sandboxes import host

    with tempfile.TemporaryDirectory(prefix="rollyard-many-") as workdir:
        snapshot = Path(workdir) / "snapshot"
        snapshot.mkdir()
        (snapshot / "README").write_text("one file, the smallest workspace\n")
        command = ["unshare", "--mount", "--propagation", "private",
                   sys.executable, __file__, "--count", str(args.count),
                   "--launch-budget", str(args.launch_budget), "--child", str(snapshot)]  # fmt: skip
        if args.nofile:
            command += ["--nofile", str(args.nofile)]
        limits = {
            "nofile_soft_hard": resource.getrlimit(resource.RLIMIT_NOFILE),
            "nproc_soft_hard": resource.getrlimit(resource.RLIMIT_NPROC),
            "pid_max": int(Path("/proc/sys/kernel/pid_max").read_text()),
            "threads_max": int(Path("/proc/sys/kernel/threads-max").read_text()),
            "mount_max": int(Path("/proc/sys/fs/mount-max").read_text()),
            "max_namespaces_per_kind": {
                kind: int(Path(f"/proc/sys/user/max_{kind}_namespaces").read_text())
                for kind in ("user", "mnt", "pid", "net", "ipc", "uts", "cgroup")
            },
            "file_max": int(Path("/proc/sys/fs/file-max").read_text()),
            "mem_total_mb": meminfo_kb()["MemTotal"] // 1024,
        }
        process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True,
                                   start_new_session=True)  # fmt: skip
        try:
            out, _ = process.communicate(timeout=args.timeout)
            report = json.loads(out.strip().splitlines()[-1]) if out.strip() else {}
            report["child_exit"] = process.returncode
            if process.returncode != 0 and not report.get("failure"):
                report["failure"] = {"phase": "child", "exit": process.returncode}
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
