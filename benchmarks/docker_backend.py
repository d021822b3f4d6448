"""Docker backend figures next to bwrap: a cold `docker run`, opening a sandbox (warm container
start), a command by exec into the warm container, and a reset; then Harbor tasks that bring their
own image: the image built once against found in the cache, an episode's container start in that
image, and the verifier's cost per episode against bwrap on the same demo tasks.

    eval "$(infra/docker/start-engine.sh)"
    python benchmarks/docker_backend.py [--runs N] [--demo-tasks N]

Prints p50/p90 in milliseconds per backend. Needs root, bubblewrap and a Docker engine; the
first image build needs the Debian mirror (apt-get in the task's Dockerfile).
"""

from __future__ import annotations

import argparse
import secrets
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandboxes import open_sandbox

HARBOR_FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "harbor" / "fixtures"
OWN_IMAGE_TASK = "apt-jq"
"""A Harbor task whose Dockerfile installs a Debian package: it runs in its own image."""


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


def measure_own_image(scratch: Path, runs: int) -> None:
    """Build a Harbor task's own image cold (a fresh nonce ahead of its RUN lines, so neither the
    tag nor Docker's layer cache has it), then ask for it again; start episodes in it."""
    from tasks_lib import load_task, open_task_sandbox, task_image

    task_dir = Path(shutil.copytree(HARBOR_FIXTURES / OWN_IMAGE_TASK, scratch / OWN_IMAGE_TASK))
    dockerfile = task_dir / "environment" / "Dockerfile"
    first, *rest = dockerfile.read_text().splitlines(keepends=True)
    nonce = f"LABEL rollyard.benchmark.nonce={secrets.token_hex(8)}\n"
    dockerfile.write_text("".join([first, nonce, *rest]))
    task = load_task(task_dir)
    started = time.perf_counter()
    task_image(task)
    built_ms = (time.perf_counter() - started) * 1000
    cached = timed(lambda: task_image(task), runs, warmup=0)
    print(f"{'own image: first build (apt-get jq)':<40} {built_ms:9.1f} ms", flush=True)
    line("own image: found in the cache", cached)
    print(f"{'own image: cached / first build':<40} {statistics.median(cached) / built_ms:9.4f}",
          flush=True)  # fmt: skip
    line(
        "own image: episode start (open + close)",
        timed(lambda: open_task_sandbox(task).close(), runs),
    )
    bwrap_task = load_task(HARBOR_FIXTURES / "shell-greeting")
    line("bwrap: episode start (open + close)",
         timed(lambda: open_task_sandbox(bwrap_task).close(), runs))  # fmt: skip


def measure_verifier(scratch: Path, count: int) -> None:
    """The verifier's wall time per episode on each backend, the same demo tasks and candidates
    (the reference solution, and the untouched workspace), one run each."""
    from tasks_lib import generate_demo_tasks, load_task, solution_changes, verify

    tasks = [load_task(path) for path in generate_demo_tasks(scratch / "demo", count, seed=11)]
    candidates = [(task, solution_changes(task)) for task in tasks]
    for backend in ("bwrap", "docker"):
        samples = []
        for task, solved in candidates:
            for candidate in (solved, None):
                started = time.perf_counter()
                verdict = verify(task, candidate, backend=backend)
                samples.append((time.perf_counter() - started) * 1000)
                assert verdict.status == "ok", verdict.detail
        line(f"{backend}: verify one episode ({count} demo tasks)", samples)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--demo-tasks", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir="/var/tmp") as tmp:
        snapshot = Path(tmp) / "snapshot"
        snapshot.mkdir()
        (snapshot / "calc.py").write_text("def add(a, b):\n    return a + b\n")
        from sandboxes.docker_images import base_image, shared_client

        client = shared_client()
        line("docker: cold `docker run --rm true`",
             timed(lambda: client.containers.run(base_image(), ["true"], remove=True,
                                                 network_mode="none"), args.runs))  # fmt: skip
        for backend in ("bwrap", "docker"):
            measure_backend(backend, snapshot, args.runs)
        measure_own_image(Path(tmp), args.runs)
        measure_verifier(Path(tmp), args.demo_tasks)
    return 0


if __name__ == "__main__":
    sys.exit(main())
