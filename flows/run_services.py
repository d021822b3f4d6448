"""What no sandbox of a run may reach: the run's own Prefect API and Dask scheduler and dashboard,
handed to every sandbox's egress proxy as a deny set (`sandboxes.egress.RUN_DENIED_ENV`) in this
process and on every Dask worker of the run.
"""

from __future__ import annotations

import contextlib
import os
import urllib.parse
from collections.abc import Iterable, Iterator

from distributed import Client
from distributed.diagnostics.plugin import WorkerPlugin

from flows.runtime import ClusterAddresses
from sandboxes.egress import RUN_DENIED_ENV, run_denied_endpoints

PLUGIN_NAME = "rollyard-run-services"
"""The name of the Dask worker plugin that gives every worker the run's denied endpoints."""


def run_service_endpoints(
    api_url: str | None, cluster: ClusterAddresses | None = None
) -> tuple[str, ...]:
    """`host:port` of the run's Prefect API and of its Dask scheduler and dashboard: the
    services a sandbox's egress proxy refuses even when a task's allowlist names them."""
    urls = [api_url] + ([cluster.scheduler_address, cluster.dashboard_link] if cluster else [])
    endpoints: list[str] = []
    for url in filter(None, urls):
        parts = urllib.parse.urlsplit(url)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme)
        if parts.hostname and port:  # (`inproc://` has neither: nothing on the network)
            host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
            endpoints.append(f"{host}:{port}")
    return tuple(dict.fromkeys(endpoints))


def add_denied_endpoints(endpoints: Iterable[str]) -> None:
    """Add `endpoints` to the egress deny set of this process's sandboxes (and of the processes
    it starts after)."""
    os.environ[RUN_DENIED_ENV] = ",".join(dict.fromkeys([*run_denied_endpoints(), *endpoints]))


class RunServicesPlugin(WorkerPlugin):
    """Adds the run's endpoints to each worker's deny set; the scheduler keeps it, so workers
    that join or restart later get it too."""

    name = PLUGIN_NAME

    def __init__(self, endpoints: tuple[str, ...]) -> None:
        self.endpoints = endpoints

    def setup(self, worker: object) -> None:
        add_denied_endpoints(self.endpoints)


@contextlib.contextmanager
def run_services_refused(
    api_url: str | None, cluster: ClusterAddresses | None = None
) -> Iterator[tuple[str, ...]]:
    """For the block, every sandbox the run opens (here, in processes started in the block, and
    on `cluster`'s workers) refuses the run's own services; yields their `host:port`."""
    endpoints = run_service_endpoints(api_url, cluster)
    before = os.environ.get(RUN_DENIED_ENV)
    add_denied_endpoints(endpoints)
    try:
        if cluster is not None:
            with Client(cluster.scheduler_address, timeout="60s") as client:
                client.register_plugin(RunServicesPlugin(endpoints))
        yield endpoints
    finally:
        if before is None:
            os.environ.pop(RUN_DENIED_ENV, None)
        else:
            os.environ[RUN_DENIED_ENV] = before
