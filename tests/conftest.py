"""Test-session setup shared by every test package: private state directories, no telemetry."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Prefect and friends read these at import time of their settings, so set them before any test
# module imports them.
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MPLBACKEND", "Agg")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--screenshots",
        default=None,
        metavar="DIR",
        help="keep the browser tests' screenshots in DIR (the README's come from docs/images)",
    )


@pytest.fixture(scope="session", autouse=True)
def private_sandbox_root() -> Iterator[Path]:
    """Sandboxes of this test session live in their own state dir, so tests never touch (or
    sweep) sandboxes of other processes on the host. Its ancestors must be traversable by the
    unprivileged sandbox uid, hence /var/tmp rather than pytest's 0700 tmp dirs."""
    root = Path(tempfile.mkdtemp(prefix="rollyard-test-", dir="/var/tmp"))
    root.chmod(0o711)
    previous = os.environ.get("ROLLYARD_SANDBOX_ROOT")
    os.environ["ROLLYARD_SANDBOX_ROOT"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("ROLLYARD_SANDBOX_ROOT", None)
    else:
        os.environ["ROLLYARD_SANDBOX_ROOT"] = previous
    from sandboxes.host import release_runtime_dir

    # Anything still here was leaked by a test of this process: unmount it, then delete the
    # directory (release_runtime_dir never deletes through a mount).
    release_runtime_dir(root)


# One Prefect API server and one Dask cluster shared by the session, for every test of a flow
# (Prefect's ephemeral mode breaks under the Dask task runner).


@pytest.fixture(scope="session")
def engine() -> None:
    """The docker engine the docker-marked tests run on: the test is skipped, with the reason,
    when no engine answers (`infra/docker/start-engine.sh` starts one)."""
    from sandboxes.docker_images import base_image, image_id, shared_client
    from sandboxes.errors import SandboxUnavailableError

    try:
        image_id(shared_client(), base_image())
    except SandboxUnavailableError as error:
        pytest.skip(str(error))


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from flows.runtime import prefect_api

    # prefect_api uses a configured PREFECT_API_URL as is; else it starts a local server.
    with prefect_api(tmp_path_factory.mktemp("prefect-home")) as api_url:
        os.environ["PREFECT_API_URL"] = api_url
        yield api_url


@pytest.fixture(scope="session")
def dask_address(prefect_server: str) -> Iterator[str]:
    """One LocalCluster for the session: worker processes pay their start-up and imports once.
    Created after the Prefect server so spawned workers inherit its URL."""
    from distributed import LocalCluster

    from flows.runtime import local_cluster_kwargs

    with LocalCluster(**local_cluster_kwargs(2)) as cluster:
        yield str(cluster.scheduler_address)
