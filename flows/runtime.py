"""Embedded defaults for running flows on one machine: a local Prefect API server that rollyard
starts, shares with its Dask workers and stops, and the Dask task runner.

Prefect's *ephemeral* API breaks under the Dask task runner (every worker process starts its own
temporary server on the same SQLite file) and cannot run scheduled deployments, so when no
`PREFECT_API_URL` is configured rollyard runs one `prefect server start` on a free loopback port,
with its home under the store and telemetry off, and exports its URL before any worker starts.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from flows.errors import PrefectServerError

QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
    "DASK_LOGGING__DISTRIBUTED": "warning",
    "PREFECT_LOGGING_LOGGERS_DISTRIBUTED_LEVEL": "WARNING",
}
SERVER_START_TIMEOUT_S = 120.0


def quiet_environment() -> None:
    """Telemetry off and quiet logs, for this process and everything it spawns."""
    for key, value in QUIET_ENV.items():
        os.environ.setdefault(key, value)
    import logging

    # Dask's scheduler and nannies log every worker start and stop at INFO; keep warnings.
    for name in ("distributed", "distributed.nanny", "distributed.scheduler", "distributed.core"):
        logging.getLogger(name).setLevel(logging.WARNING)


# The server gets SIGTERM when the process that started it dies, even by SIGKILL, so a killed
# `rollyard` leaves no server behind (`stop` handles every orderly exit). The kernel sends it when
# the starting *thread* exits, so start the server from a thread that lives as long as the server
# is needed (the main thread, as every caller here does).
_DIE_WITH_PARENT = (
    ["setpriv", "--pdeathsig", "TERM"]
    if sys.platform == "linux" and shutil.which("setpriv")
    else []
)


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=2) as response:
            return bool(response.status == 200)
    except OSError:
        return False


class LocalPrefectServer:
    """A `prefect server start` child process on loopback, its database under `home`."""

    def __init__(self, home: Path, *, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.home = Path(home)
        self.host = host
        """The address it listens on: loopback, or one that workers on other hosts reach."""
        self.port = port or _free_port()
        self.api_url = f"http://{host}:{self.port}/api"
        self._process: subprocess.Popen[bytes] | None = None

    def start(self, *, timeout_s: float = SERVER_START_TIMEOUT_S) -> str:
        self.home.mkdir(parents=True, exist_ok=True)
        # A server migrates its SQLite database as it starts; two starting at once on one home
        # (two commands on one store) raced into "duplicate column name". Starts take turns;
        # the kernel drops the lock of a starter that dies.
        with open(self.home / "server-start.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                return self._start(timeout_s)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self, timeout_s: float) -> str:
        prefect = shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"
        env = {**os.environ, **QUIET_ENV, "PREFECT_HOME": str(self.home)}
        env.pop("PREFECT_API_URL", None)
        log = (self.home / "server.log").open("ab")
        self._process = subprocess.Popen(
            [
                *_DIE_WITH_PARENT,
                prefect,
                "server",
                "start",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--no-ui",
                "--analytics-off",
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _healthy(self.api_url):
                return self.api_url
            if self._process.poll() is not None:
                raise PrefectServerError(
                    f"prefect server exited during start-up ({self._last_log_line()}); "
                    f"see {self.home / 'server.log'}"
                )
            time.sleep(0.25)
        self.stop()
        raise PrefectServerError(
            f"prefect server did not answer on {self.api_url} within {timeout_s:.0f} s; "
            f"see {self.home / 'server.log'}"
        )

    def _last_log_line(self) -> str:
        """The server log's last non-empty line: the one-line error keeps the cause in view."""
        try:
            lines = (self.home / "server.log").read_text(errors="replace").splitlines()
        except OSError as error:
            return f"no log: {error}"
        return next((line.strip() for line in reversed(lines) if line.strip()), "empty log")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()

    def __enter__(self) -> LocalPrefectServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def prefect_home_for(store: str) -> Path:
    """Where the embedded Prefect server keeps its database: under a local store, else under
    `./.rollyard` (an object-storage store has no local directory)."""
    if "://" in store and not store.startswith("file://"):
        return Path(".rollyard") / "prefect"
    return Path(store.removeprefix("file://")) / "prefect"


@contextlib.contextmanager
def prefect_api(home: Path) -> Iterator[str]:
    """The Prefect API to use: `PREFECT_API_URL` when configured, else a local server started
    for the duration of the block (its URL exported so Dask workers inherit it)."""
    quiet_environment()
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        yield configured
        return
    server = LocalPrefectServer(home)
    server.start()
    # Spawned Dask workers read the environment; this process's Prefect settings were frozen
    # when prefect was imported, so they are overridden for the block as well.
    os.environ["PREFECT_API_URL"] = server.api_url
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: server.api_url}):
            yield server.api_url
    finally:
        drain_prefect_clients()
        os.environ.pop("PREFECT_API_URL", None)
        server.stop()


def drain_prefect_clients(timeout_s: float = 10.0) -> None:
    """Flush Prefect's background log and event senders while the server still answers, so
    stopping it loses nothing and prints no connection errors."""
    if "prefect" not in sys.modules:
        return
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker

    with contextlib.suppress(Exception):
        APILogWorker.drain_all(timeout=timeout_s)
    with contextlib.suppress(Exception):
        EventsWorker.drain_all(timeout=timeout_s)


WORKER_PRELOAD = "flows.dask_worker"
"""The module every rollyard Dask worker preloads (it takes the scratch directory off sys.path)."""


def local_cluster_kwargs(workers: int, *, threads_per_worker: int = 1) -> dict[str, Any]:
    """Arguments of every LocalCluster rollyard starts: `workers` processes that preload
    `WORKER_PRELOAD`, no dashboard. One thread per worker by default: an episode holds a core."""
    return {
        "n_workers": workers,
        "threads_per_worker": threads_per_worker,
        "processes": True,
        "dashboard_address": None,
        "preload": [WORKER_PRELOAD],
    }


def dask_task_runner(workers: int, dask_address: str | None) -> Any:
    """The Dask task runner of every flow: a running scheduler when `dask_address` is given,
    else a LocalCluster of `workers` single-threaded processes (`local_cluster_kwargs`)."""
    from prefect_dask.task_runners import DaskTaskRunner

    if dask_address:
        return DaskTaskRunner(address=dask_address)
    return DaskTaskRunner(cluster_kwargs=local_cluster_kwargs(workers))
