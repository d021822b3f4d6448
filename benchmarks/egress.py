"""Egress allowlist proxy benchmark: what one allowed HTTP fetch costs through the proxy (relay
in the sandbox -> unix socket -> host proxy -> target) against the same fetch from the host, and
what the allowlist adds to a sandbox's start and to each command (the relay starts with it).

    python benchmarks/egress.py [--fetches N] [--opens M] [--backends bwrap,docker]

The target is an HTTP server on the host's loopback, allowed by name and port (`localhost:PORT`:
a loopback port is reached only when named). Each fetch
opens a new connection (the proxy carries one plain-HTTP request per connection), timed inside
one Python process per batch so a sandbox's exec cost is not counted; host and sandbox batches
alternate, so both see the same machine load. Prints p50/p95 in
milliseconds and the ratios against the host's figures of the same run. docker needs an engine
(`eval "$(infra/docker/start-engine.sh)"`); a backend that cannot start is reported and skipped.
"""

from __future__ import annotations

import argparse
import http.server
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sandbox_startup import timed  # the same timing loop as the sandbox start-up figures

from sandboxes import Limits, SandboxError, open_sandbox

BODY = b"x" * 1024

# Runs on the host (direct: no proxy) and in the sandbox (through the proxy its environment
# names): N fetches, each on a new connection, printed as milliseconds.
FETCHER = """
import json, sys, time, urllib.request
url, count, direct = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "direct"
opener = urllib.request.build_opener(*( [urllib.request.ProxyHandler({})] if direct else []))
samples = []
for _ in range(count + 2):
    started = time.perf_counter()
    with opener.open(url, timeout=30) as response:
        assert len(response.read()) == 1024
    samples.append((time.perf_counter() - started) * 1000)
print(json.dumps(samples[2:]))
"""


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass


@contextmanager
def target_server() -> Iterator[int]:
    """The allowed host: an HTTP server on 127.0.0.1, its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


def quantiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.95 * len(ordered)))]


def host_fetches(url: str, count: int) -> list[float]:
    done = subprocess.run(
        [sys.executable, "-I", "-c", FETCHER, url, str(count), "direct"],
        capture_output=True, text=True, check=True, timeout=600,
    )  # fmt: skip
    return list(json.loads(done.stdout))


ROUNDS = 10
"""The fetches alternate between the host and the sandbox in this many rounds, so a change in
the machine's load falls on both."""


def measure_backend(
    backend: str, url: str, fetches: int, opens: int
) -> tuple[list[float], dict[str, list[float]]]:
    """The host's direct fetches and, interleaved with them, the sandbox's through the proxy;
    then `true` and open+close with and without the allowlist."""
    python = "python3"
    host: list[float] = []
    found: dict[str, list[float]] = {"fetch": []}
    per_round = max(1, fetches // ROUNDS)
    with tempfile.TemporaryDirectory(prefix="egress-bench-") as workspace:
        Path(workspace, "README").write_text("egress benchmark\n")
        allowlisted = Limits(allowed_hosts=(urllib.parse.urlsplit(url).netloc,))
        with open_sandbox(workspace, backend=backend, limits=allowlisted) as sandbox:
            for _ in range(ROUNDS):
                host += host_fetches(url, per_round)
                argv = [python, "-I", "-c", FETCHER, url, str(per_round), "proxied"]
                run = sandbox.execute(argv, timeout_s=600)
                if run.exit_code != 0:
                    raise SandboxError(f"the fetches failed in the sandbox: {run.stderr[-300:]}")
                found["fetch"] += json.loads(run.stdout)
            found["true, allowlist"] = timed(lambda: sandbox.execute(["true"]), opens)
        with open_sandbox(workspace, backend=backend) as sandbox:
            found["true, no network"] = timed(lambda: sandbox.execute(["true"]), opens)

        def open_close(limits: Limits | None) -> Callable[[], None]:
            def action() -> None:
                with open_sandbox(workspace, backend=backend, limits=limits):
                    pass

            return action

        found["open+close, allowlist"] = timed(open_close(allowlisted), opens)
        found["open+close, no network"] = timed(open_close(None), opens)
    return host, found


def _row(
    name: str, samples: list[float], baseline: list[float] | None = None
) -> tuple[float, float]:
    p50, p95 = quantiles(samples)
    ratios = ""
    if baseline is not None:
        base_p50, base_p95 = quantiles(baseline)
        ratios = f" {p50 / base_p50:11.2f} {p95 / base_p95:11.2f}"
    print(f"{name:<46} {p50:9.2f} {p95:9.2f}{ratios}")
    return p50, p95


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--fetches", type=int, default=200, help="fetches per measurement")
    parser.add_argument("--opens", type=int, default=20, help="sandbox opens / commands timed")
    parser.add_argument("--backends", default="bwrap,docker", help="comma-separated backends")
    args = parser.parse_args(argv)
    figures: dict[str, object] = {}
    with target_server() as port:
        url = f"http://localhost:{port}/data"
        print(f"target: {url} (allowed by name), {args.fetches} fetches per row, a new "
              f"connection each; load average {' '.join(map(str, os.getloadavg()))}")  # fmt: skip
        print(
            f"{'measurement':<46} {'p50 ms':>9} {'p95 ms':>9} {'x host p50':>11} {'x host p95':>11}"
        )
        for backend in args.backends.split(","):
            try:
                host, found = measure_backend(backend, url, args.fetches, args.opens)
            except SandboxError as error:
                print(f"{backend}: skipped ({type(error).__name__}: {error})")
                continue
            host_p50, host_p95 = _row(f"host, direct fetch (with {backend})", host, host)
            fetch_p50, fetch_p95 = _row(f"{backend}, fetch through the proxy", found["fetch"], host)
            quantile = {name: _row(f"{backend}, {name}", found[name])[0] for name in (
                "true, no network", "true, allowlist", "open+close, no network",
                "open+close, allowlist")}  # fmt: skip
            relay_ms = quantile["true, allowlist"] - quantile["true, no network"]
            proxy_ms = quantile["open+close, allowlist"] - quantile["open+close, no network"]
            print(
                f"{backend}: the relay adds {relay_ms:.1f} ms to each command (p50), the proxy "
                f"{proxy_ms:.1f} ms to a sandbox's open+close (p50)"
            )
            figures[backend] = {
                "host_fetch_ms": {"p50": host_p50, "p95": host_p95},
                "fetch_ms": {"p50": fetch_p50, "p95": fetch_p95},
                "ratio_vs_host": {"p50": fetch_p50 / host_p50, "p95": fetch_p95 / host_p95},
                "relay_per_command_ms": relay_ms,
                "proxy_per_sandbox_ms": proxy_ms,
            }
    print(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
