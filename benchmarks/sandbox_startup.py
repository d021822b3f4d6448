"""Sandbox start-up benchmark: what a sandboxed command, a whole sandbox lifecycle and a reset
cost against a bare exec, and what an idle sandbox holds in host memory.

    python benchmarks/sandbox_startup.py [--runs N]

Prints p50/p90 in milliseconds, the ratios, and PASS/FAIL against the targets of the sandbox
engine. Needs root and bubblewrap (the bwrap backend's capability check says what is missing).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes import Limits, Sandbox, host, open_sandbox

TARGET_TRUE_P50_MS = 15.0
TARGET_TRUE_RATIO = 10.0
TARGET_RESET_RATIO = 1.5
TARGET_IDLE_MB = 5.0
CONCURRENT = 64


def timed(action: Callable[[], object], runs: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):
        action()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]


def line(name: str, samples: list[float]) -> float:
    p50, p90 = quantiles(samples)
    print(f"{name:<44} p50 {p50:8.2f} ms   p90 {p90:8.2f} ms   (n={len(samples)})")
    return p50


def verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def make_snapshot(root: Path, files: int) -> Path:
    for index in range(files):
        directory = root / f"d{index // 100:03d}"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / f"f{index:05d}.py").write_text(f"VALUE = {index}\n")
    return root


def meminfo_kb() -> dict[str, int]:
    values = {}
    for row in Path("/proc/meminfo").read_text().splitlines():
        key, _, rest = row.partition(":")
        values[key] = int(rest.split()[0])
    return values


def cgroup_memory_bytes(sandbox: Sandbox) -> int:
    for directory in sandbox._cgroup.dirs:  # type: ignore[attr-defined]
        for name in ("memory.usage_in_bytes", "memory.current"):
            if (directory / name).exists():
                return int((directory / name).read_text())
    return 0


def docker_reachable() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(
        ["docker", "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        timeout=10,
        check=False,
    )
    return probe.returncode == 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="timed runs per measurement")
    parser.add_argument("--docker-image", default="debian:bookworm-slim")
    args = parser.parse_args()
    runs = args.runs

    work = Path(tempfile.mkdtemp(prefix="rollyard-bench-", dir="/var/tmp"))
    work.chmod(0o711)  # the sandbox uid must traverse to the runtime dirs below it
    os.environ[host.ROOT_ENV] = str(work / "state")
    limits = Limits(memory_mb=256, pids=64, disk_mb=64)
    try:
        small = make_snapshot(work / "snap10", 10)
        large = make_snapshot(work / "snap5000", 5000)
        # Other jobs on a small machine move every figure here: print the load with them.
        load = Path("/proc/loadavg").read_text().split()[:3]
        print(f"sandbox start-up benchmark, {os.cpu_count()} CPUs, load average "
              f"{' '.join(load)}, {runs} runs each\n")  # fmt: skip

        bare = line("bare `true` (subprocess.run)", timed(lambda: subprocess.run(["true"]), runs))
        with open_sandbox(small, limits=limits) as sandbox:
            in_sandbox = line(
                "execute('true') in an open sandbox", timed(lambda: sandbox.execute("true"), runs)
            )

        def lifecycle() -> None:
            with open_sandbox(small, limits=limits) as sb:
                sb.execute("true")

        full = line("open + execute('true') + close", timed(lifecycle, runs))

        resets = {}
        for name, snapshot in (("10-file", small), ("5,000-file", large)):
            with open_sandbox(snapshot, limits=limits) as sb:
                sb.execute("echo x > new.txt")

                def dirty_reset(sb: Sandbox = sb) -> None:
                    sb.write_file("new.txt", "x")
                    sb.reset()

                resets[name] = line(
                    f"reset, {name} snapshot (after one write)", timed(dirty_reset, runs)
                )

        docker_p50 = None
        if docker_reachable():
            command = ["docker", "run", "--rm", "--network", "none", args.docker_image, "true"]
            docker_p50 = line(
                "docker run --rm --network none",
                timed(lambda: subprocess.run(command, capture_output=True, check=True), 10, 1),
            )
        else:
            print(
                "docker run --rm --network none                skipped: no Docker engine reachable"
            )

        # 64 idle sandboxes: host memory they hold, two ways.
        before = meminfo_kb()
        started = time.perf_counter()
        crowd = [open_sandbox(small, limits=limits) for _ in range(CONCURRENT)]
        for sb in crowd:
            sb.execute("true")
        opened_s = time.perf_counter() - started
        time.sleep(0.5)
        after = meminfo_kb()
        cgroup_total = sum(cgroup_memory_bytes(sb) for sb in crowd)
        for sb in crowd:
            sb.close()
        available_mb = (before["MemAvailable"] - after["MemAvailable"]) / 1024 / CONCURRENT
        kernel_mb = (
            (
                (after["Slab"] - before["Slab"])
                + (after["Shmem"] - before["Shmem"])
                + (after.get("Percpu", 0) - before.get("Percpu", 0))
            )
            / 1024
            / CONCURRENT
        )
        cgroup_mb = cgroup_total / (1 << 20) / CONCURRENT
        print(f"\n{CONCURRENT} sandboxes open at once: opened+executed in {opened_s:.2f} s")
        print(f"  per idle sandbox, MemAvailable drop:          {available_mb:6.2f} MB")
        print(f"  per idle sandbox, Slab+Shmem+Percpu growth:   {kernel_mb:6.2f} MB")
        print(f"  per idle sandbox, its memory cgroup usage:    {cgroup_mb:6.2f} MB")

        print("\nratios and targets")
        true_ratio = in_sandbox / bare
        reset_ratio = resets["5,000-file"] / resets["10-file"]
        idle_mb = max(available_mb, kernel_mb, cgroup_mb)
        print(f"  sandbox `true` p50 {in_sandbox:.2f} ms <= {TARGET_TRUE_P50_MS} ms: "
              f"{verdict(in_sandbox <= TARGET_TRUE_P50_MS)}")  # fmt: skip
        print(f"  sandbox `true` / bare = {true_ratio:.1f}x <= {TARGET_TRUE_RATIO}x: "
              f"{verdict(true_ratio <= TARGET_TRUE_RATIO)}")  # fmt: skip
        print(f"  open+execute+close / bare = {full / bare:.1f}x (no target)")
        print(f"  reset 5,000-file / 10-file = {reset_ratio:.2f} <= {TARGET_RESET_RATIO}: "
              f"{verdict(reset_ratio <= TARGET_RESET_RATIO)}")  # fmt: skip
        print(f"  {CONCURRENT} sandboxes open at once: PASS")
        print(f"  host memory per idle sandbox {idle_mb:.2f} MB (largest of the three) "
              f"<= {TARGET_IDLE_MB} MB: {verdict(idle_mb <= TARGET_IDLE_MB)}")  # fmt: skip
        if docker_p50 is not None:
            print(f"  docker run / sandbox open+execute+close = {docker_p50 / full:.1f}x")
    finally:
        host.release_runtime_dir(work)


if __name__ == "__main__":
    main()
