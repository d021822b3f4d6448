"""Fixtures for orchestration tests: a small demo task set and one Prefect API server shared by
the session (Prefect's ephemeral mode breaks under the Dask task runner)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    tasks_dir = tmp_path_factory.mktemp("demo-tasks")
    generate_demo_tasks(tasks_dir, 4, seed=7)
    return tasks_dir


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
