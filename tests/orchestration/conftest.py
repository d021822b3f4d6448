"""Fixtures for orchestration tests: a small demo task set (the Prefect server and the Dask
cluster shared by the session are in tests/conftest.py)."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def demo_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    tasks_dir = tmp_path_factory.mktemp("demo-tasks")
    generate_demo_tasks(tasks_dir, 4, seed=7)
    return tasks_dir
