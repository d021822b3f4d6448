"""Embedded defaults for running flows on one machine: a local Prefect server (API and UI) that
rollyard starts, shares with its Dask workers and stops, or finds running; the Dask task runner.

Prefect's *ephemeral* API breaks under the Dask task runner (every worker process starts its own
temporary server on the same SQLite file) and cannot run scheduled deployments, so when no
`PREFECT_API_URL` is configured rollyard uses the long-lived server of `rollyard server start`
when one runs for the store, else runs one `prefect server start` itself on Prefect's default
port 4200 (or the next free one), with its home under the store and telemetry off, and exports
its URL before any worker starts. Either way it prints where the UI is, once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
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
# How long a server process that is still alive may take to answer. A start took 5 minutes on a
# 2-core machine at load 19 for a process at nice 15 (most of it waiting for a core, not work:
# about 7 CPU seconds from a template database); waiting costs nothing while it lives.
SERVER_START_TIMEOUT_S = 900.0


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


PREFECT_DEFAULT_PORT = 4200
"""Prefect's own default port: the embedded server takes it, or the next free one above it."""
PORT_SEARCH_SPAN = 100
SERVER_STATE_FILE = "server.json"
"""Written by `rollyard server start` into the Prefect home: how other shells find the server."""


def _port_is_free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def stable_port(first: int = PREFECT_DEFAULT_PORT) -> int:
    """The first free loopback port from `first` upward, so the UI's address stays the same
    from run to run while nothing else holds it."""
    for port in range(first, first + PORT_SEARCH_SPAN):
        if _port_is_free(port):
            return port
    raise PrefectServerError(
        f"no free port in {first}-{first + PORT_SEARCH_SPAN - 1} for the Prefect server; "
        "free one, or set PREFECT_API_URL to a running server"
    )


def _healthy(api_url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{api_url}/health", timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


def _served_home(api_url: str) -> Path | None:
    """The Prefect home of the server at `api_url`, None when it does not say in time (a server
    just started on a busy machine can take longer than this to answer)."""
    try:
        with urllib.request.urlopen(f"{api_url}/admin/settings", timeout=10) as response:
            served = json.load(response).get("home")
    except (OSError, ValueError):
        return None
    return None if served is None else Path(served)


def _serves_home(api_url: str, home: Path) -> bool:
    """Is the server at `api_url` the one whose database lives in `home`? Another process may
    have taken the same port between the probe and the bind; its server answers /health too."""
    served = _served_home(api_url)
    return served is not None and served.resolve() == home.resolve()


@dataclasses.dataclass(frozen=True, slots=True)
class ServerState:
    """A running local Prefect server: where its API and UI are, and its process."""

    api_url: str
    ui_url: str
    pid: int
    home: str


class LocalPrefectServer:
    """A `prefect server start` child process on loopback serving the API and the UI, its
    database under `home`. `port=None` takes Prefect's default port or the next free one.

    An attached server (the default) dies with the thread that started it; a detached one
    (`rollyard server start`) outlives it and is found through `SERVER_STATE_FILE`."""

    def __init__(
        self,
        home: Path,
        *,
        port: int | None = None,
        detached: bool = False,
        host: str = "127.0.0.1",
        niceness: int | None = None,
    ) -> None:
        self.home = Path(home).absolute()
        self.host = host
        """The address it listens on: loopback, or one that workers on other hosts reach."""
        self._requested_port = port
        self.port = port or stable_port()
        self.detached = detached
        self.niceness = niceness
        """The server's absolute nice value; None inherits the caller's. Every worker waits on
        this server, so a caller that runs niced on a host shared with jobs at nice 0 should
        give it 0: CFS weighs nice 15 at 36 against 1024 for nice 0, and a niced server
        starting next to a few such jobs got ~3% of a core, minutes for the ~20 s of CPU its
        start needs (imports, database migrations, services). Lowering it needs root."""
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://{self.host}:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self, *, timeout_s: float = SERVER_START_TIMEOUT_S) -> str:
        """Start the server and wait until it answers (at most `timeout_s` per port tried);
        returns the API URL."""
        self.home.mkdir(parents=True, exist_ok=True)
        # A server migrates its SQLite database as it starts; two starting at once on one home
        # (two commands on one store) raced into "duplicate column name". Starts take turns;
        # the kernel drops the lock of a starter that dies.
        with open(self.home / "server-start.lock", "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                seed_database(self.home)
                return self._start(timeout_s)
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _start(self, timeout_s: float) -> str:
        # Between the free-port probe and the server's bind another process may take the port:
        # then this server exits (or another one answers), and the next port is tried.
        for _ in range(PORT_SEARCH_SPAN if self._requested_port is None else 1):
            if self._launch_and_wait(timeout_s):
                return self.api_url
            self.port = stable_port(self.port + 1)
        raise PrefectServerError(
            f"prefect server could not bind a port ({self._last_log_line()}); "
            f"see {self.home / 'server.log'}"
        )

    def _launch_and_wait(self, timeout_s: float) -> bool:
        """Launch on `self.port`; True once it answers as this home's server, False when the
        port turned out to be taken."""
        log = (self.home / "server.log").open("ab")
        self._process = subprocess.Popen(
            [
                *self._nice_prefix(),
                *([] if self.detached else _DIE_WITH_PARENT),
                _prefect_executable(),
                "server",
                "start",
                "--host",
                self.host,
                "--port",
                str(self.port),
                "--analytics-off",
            ],
            # The UI's pages call the API at PREFECT_UI_API_URL, which Prefect derives from its
            # default port (4200), not from --port: on the next free port the UI would call
            # whatever answers on 4200, or nothing.
            env={**_server_environment(self.home), "PREFECT_UI_API_URL": self.api_url},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        log.close()
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if _healthy(self.api_url):
                served = _served_home(self.api_url)
                if served is not None and served.resolve() == self.home.resolve():
                    return True
                if served is not None:
                    self.stop()  # someone else's server on this port
                    return False
                # No answer yet: under load this server's first answers are slow. Stopping it
                # here would throw away its start-up (database migrations) for nothing.
            if self._process.poll() is not None:
                if not _port_is_free(self.port):
                    return False
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

    def _nice_prefix(self) -> list[str]:
        """`nice -n DELTA` taking the child from this process's nice value to `niceness`."""
        if self.niceness is None:
            return []
        delta = self.niceness - os.getpriority(os.PRIO_PROCESS, 0)
        return ["nice", "-n", str(delta)] if delta else []

    def _last_log_line(self) -> str:
        """The server log's last non-empty line: the one-line error keeps the cause in view."""
        try:
            lines = (self.home / "server.log").read_text(errors="replace").splitlines()
        except OSError as error:
            return f"no log: {error}"
        return next((line.strip() for line in reversed(lines) if line.strip()), "empty log")

    @property
    def state(self) -> ServerState:
        assert self._process is not None, "start() the server first"
        return ServerState(self.api_url, self.ui_url, self._process.pid, str(self.home))

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        _terminate_group(process.pid)
        process.wait()

    def __enter__(self) -> LocalPrefectServer:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _prefect_executable() -> str:
    return shutil.which("prefect", path=str(Path(sys.executable).parent)) or "prefect"


def _server_environment(home: Path) -> dict[str, str]:
    """The environment of a `prefect` command acting on the server whose home is `home`."""
    env = {**os.environ, **QUIET_ENV, "PREFECT_HOME": str(home)}
    env.pop("PREFECT_API_URL", None)
    return env


# -- the database a new server home starts from ---------------------------------------------
#
# A server in a new home first runs Prefect's ~120 database migrations (SQLite table rebuilds):
# half of a first start's work (about 8 of 16 CPU seconds), over two minutes of wall time on a
# busy 2-core machine. Every new store, test session and `rollyard server start` pays it again
# for the same schema. So the migrations run once per installed Prefect version, into a template
# in rollyard's cache, and a new home starts from a copy; the server still checks the schema at
# start and migrates whatever the copy lacks.

PREFECT_DATABASE_FILE = "prefect.db"
"""Prefect's own SQLite database file name in its home (its default connection URL)."""
_DATABASE_URL_VARIABLES = (
    "PREFECT_API_DATABASE_CONNECTION_URL",
    "PREFECT_SERVER_DATABASE_CONNECTION_URL",
)
TEMPLATE_BUILD_TIMEOUT_S = 900.0


def prefect_database_template() -> Path:
    """The template database: empty, migrated to the installed Prefect's schema by Prefect's
    own `prefect server database upgrade`; built on first use (install runs it once)."""
    from importlib.metadata import version

    from rollyard.settings import cache_root

    cache = cache_root() / "prefect"
    template = cache / f"prefect-{version('prefect')}.db"
    if template.is_file():
        return template
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache, prefix="build-") as build:
        try:
            result = subprocess.run(
                [_prefect_executable(), "server", "database", "upgrade", "--yes"],
                env=_server_environment(Path(build)),
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=TEMPLATE_BUILD_TIMEOUT_S,
            )
        except subprocess.TimeoutExpired:
            raise PrefectServerError(
                f"migrating a new Prefect database took over {TEMPLATE_BUILD_TIMEOUT_S:.0f} s"
            ) from None
        built = Path(build) / PREFECT_DATABASE_FILE
        if result.returncode != 0 or not built.is_file():
            lines = (result.stderr or result.stdout).strip().splitlines() or ["no output"]
            raise PrefectServerError(
                f"`prefect server database upgrade` failed ({lines[-1].strip()})"
            )
        # Two builders at once each write their own file; the last rename wins, both are whole.
        partial = template.with_name(f"{template.name}.{os.getpid()}.tmp")
        _copy_database(built, partial)
        partial.replace(template)
    return template


def seed_database(home: Path) -> None:
    """Give a new server home a copy of the template database; a home that has a database, or
    whose server is configured to use another database, is left as it is."""
    target = Path(home) / PREFECT_DATABASE_FILE
    if target.exists() or any(os.environ.get(name) for name in _DATABASE_URL_VARIABLES):
        return
    partial = target.with_name(f"{target.name}.tmp")
    _copy_database(prefect_database_template(), partial)
    partial.replace(target)


def _copy_database(source: Path, target: Path) -> None:
    """A consistent copy of a SQLite database (its write-ahead log included)."""
    import sqlite3

    target.unlink(missing_ok=True)
    reader = sqlite3.connect(f"file:{source}?mode=ro", uri=True)
    try:
        writer = sqlite3.connect(target)
        try:
            reader.backup(writer)
        finally:
            writer.close()
    finally:
        reader.close()


def _terminate_group(pid: int, timeout_s: float = 15.0) -> None:
    """SIGTERM the server's process group, SIGKILL it if it is still there after `timeout_s`."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)
        time.sleep(0.2)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pid, signal.SIGKILL)


# -- the long-lived server of `rollyard server start|stop|status` ------------------------------


def running_server(home: Path) -> ServerState | None:
    """The long-lived server recorded in `home`, if it answers as that home's server; a state
    file left by a server that died is removed."""
    state_file = Path(home) / SERVER_STATE_FILE
    try:
        state = ServerState(**json.loads(state_file.read_text()))
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError) as error:
        raise PrefectServerError(
            f"{state_file} is not a server state file ({error}); delete it and run "
            "`rollyard server start` again"
        ) from None
    if _healthy(state.api_url) and _serves_home(state.api_url, Path(home)):
        return state
    state_file.unlink(missing_ok=True)
    return None


def start_server(home: Path, *, port: int | None = None) -> ServerState:
    """Start a detached server for `home` (or return the one already running there)."""
    existing = running_server(home)
    if existing is not None:
        return existing
    server = LocalPrefectServer(home, port=port, detached=True)
    server.start()
    state = server.state
    state_file = Path(home) / SERVER_STATE_FILE
    partial = state_file.with_suffix(".tmp")
    partial.write_text(json.dumps(dataclasses.asdict(state)))
    partial.replace(state_file)
    return state


def stop_server(home: Path) -> ServerState | None:
    """Stop the long-lived server of `home`; returns what was stopped, None if none ran."""
    state = running_server(home)
    if state is None:
        return None
    _terminate_group(state.pid)
    (Path(home) / SERVER_STATE_FILE).unlink(missing_ok=True)
    return state


def connect(store: str | Path = ".rollyard") -> str:
    """Point Prefect in this process (a notebook, a script) at the store's long-lived server
    and return its API URL. Call it before the first flow run: Prefect reads its settings once.
    A configured `PREFECT_API_URL` is kept as it is."""
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        return configured
    state = running_server(prefect_home_for(str(Path(store).absolute())))
    if state is None:
        raise PrefectServerError(
            f"no Prefect server runs for the store {store}; start one with "
            f"`rollyard server start --store {store}`"
        )
    quiet_environment()
    os.environ["PREFECT_API_URL"] = state.api_url
    return state.api_url


def prefect_home_for(store: str) -> Path:
    """Where the embedded Prefect server keeps its database: under a local store, else under
    `./.rollyard` (an object-storage store has no local directory)."""
    if "://" in store and not store.startswith("file://"):
        return Path(".rollyard") / "prefect"
    return Path(store.removeprefix("file://")) / "prefect"


def _announce(line: str) -> None:
    print(f"rollyard: {line}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def prefect_api(home: Path) -> Iterator[str]:
    """The Prefect API to use, announced once on stderr with its UI: `PREFECT_API_URL` when
    configured, else the long-lived server of `home` (`rollyard server start`), else a local
    server started for the duration of the block. The URL is exported so Dask workers inherit
    it, and Prefect's settings of this process follow it for the block."""
    quiet_environment()
    configured = os.environ.get("PREFECT_API_URL")
    if configured:
        yield configured
        return
    long_lived = running_server(home)
    server: LocalPrefectServer | None = None
    if long_lived is not None:
        api_url = long_lived.api_url
        _announce(f"Prefect UI at {long_lived.ui_url} (the server of `rollyard server start`)")
    else:
        server = LocalPrefectServer(home)
        api_url = server.start()
        _announce(
            f"Prefect UI at {server.ui_url} (until this command ends; "
            "`rollyard server start` keeps one running)"
        )
    os.environ["PREFECT_API_URL"] = api_url
    try:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: api_url}):
            yield api_url
    finally:
        drain_prefect_clients()
        os.environ.pop("PREFECT_API_URL", None)
        if server is not None:
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


DASK_DASHBOARD_ADDRESS = "127.0.0.1:8787"
"""Dask's default dashboard port, on loopback; Dask picks another port when it is taken."""


def dask_dashboard_available() -> bool:
    """The dashboard needs bokeh; without it Dask runs the same, with no dashboard."""
    import importlib.util

    return importlib.util.find_spec("bokeh") is not None


def local_cluster_kwargs(
    workers: int, *, threads_per_worker: int = 1, dashboard: bool = True
) -> dict[str, Any]:
    """Arguments of every LocalCluster rollyard starts: `workers` processes that preload
    `WORKER_PRELOAD`, the dashboard on where bokeh is installed (prefect-dask logs its address
    when the flow starts). One thread per worker by default: an episode holds a core."""
    on = dashboard and dask_dashboard_available()
    return {
        "n_workers": workers,
        "threads_per_worker": threads_per_worker,
        "processes": True,
        "dashboard_address": DASK_DASHBOARD_ADDRESS if on else None,
        "preload": [WORKER_PRELOAD],
    }


@dataclasses.dataclass(frozen=True, slots=True)
class ClusterAddresses:
    """Where a Dask cluster's scheduler and dashboard are (no dashboard: None)."""

    scheduler_address: str
    dashboard_link: str | None


@contextlib.contextmanager
def local_cluster(workers: int, dask_address: str | None) -> Iterator[ClusterAddresses]:
    """The running scheduler at `dask_address`, else a LocalCluster of `workers` processes
    (`local_cluster_kwargs`) for the block: started before the flow, so its addresses are known
    (and printed) before the first task runs."""
    import warnings

    from distributed import Client, LocalCluster

    if dask_address:
        with Client(dask_address, timeout="60s") as client:
            has_dashboard = "dashboard" in client.scheduler_info().get("services", {})
            link = client.dashboard_link if has_dashboard else None
        yield ClusterAddresses(dask_address, link)
        return
    with warnings.catch_warnings():
        # "Port 8787 is already in use ... Hosting the HTTP server on port N instead": the
        # address actually taken is reported with the cluster's other addresses.
        warnings.filterwarnings("ignore", message="Port .* is already in use", category=UserWarning)
        cluster = LocalCluster(**local_cluster_kwargs(workers))
    with cluster:
        yield ClusterAddresses(str(cluster.scheduler_address), cluster.dashboard_link or None)


def dask_task_runner(workers: int, dask_address: str | None) -> Any:
    """The Dask task runner of every flow: a running scheduler when `dask_address` is given,
    else a LocalCluster of `workers` single-threaded processes (`local_cluster_kwargs`)."""
    from prefect_dask.task_runners import DaskTaskRunner

    if dask_address:
        return DaskTaskRunner(address=dask_address)
    return DaskTaskRunner(cluster_kwargs=local_cluster_kwargs(workers))
