"""Docker backend figures next to bwrap: a cold `docker run`, opening a sandbox (warm container
start), a command by exec into the warm container, and a reset.

    eval "$(infra/docker/start-engine.sh)"
    python benchmarks/docker_backend.py [--runs N]

Prints p50/p90 in milliseconds per backend. Needs root, bubblewrap and a Docker engine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes import open_sandbox


def timed(
    action: Callable[[], object], runs: int, warmup: int = 1, gap_s: float = 0.0
) -> list[float]:
    """Wall ms per call; `gap_s` of idle time (an episode's work) precedes each timed call."""
    for _ in range(warmup):
        action()
    samples = []
    for _ in range(runs):
        time.sleep(gap_s)
        started = time.perf_counter()
        action()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def line(name: str, samples: list[float]) -> None:
    ordered = sorted(samples)
    p50 = statistics.median(ordered)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    print(f"{name:<40} p50 {p50:9.1f} ms   p90 {p90:9.1f} ms   (n={len(samples)})", flush=True)


def measure_backend(backend: str, snapshot: Path, runs: int) -> None:
    line(
        f"{backend}: open + close",
        timed(lambda: open_sandbox(snapshot, backend=backend).close(), runs),
    )
    with open_sandbox(snapshot, backend=backend) as sandbox:
        line(f"{backend}: execute `true`", timed(lambda: sandbox.execute("true"), runs))
        line(
            f"{backend}: execute `python -c pass`",
            timed(lambda: sandbox.execute(["python", "-c", "pass"]), runs),
        )
        line(f"{backend}: reset, back to back", timed(sandbox.reset, runs))
        line(f"{backend}: reset after 1 s of episode", timed(sandbox.reset, runs, gap_s=1.0))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        snapshot = Path(tmp) / "snapshot"
        snapshot.mkdir()
        (snapshot / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        from sandboxes.docker import _shared_client, base_image

        client = _shared_client()
        line("docker: cold `docker run --rm true`",
             timed(lambda: client.containers.run(base_image(), ["true"], remove=True,
                                                 network_mode="none"), args.runs))  # fmt: skip
        for backend in ("bwrap", "docker"):
            measure_backend(backend, snapshot, args.runs)
    return 0


if __name__ == "__main__":
    sys.exit(main())
