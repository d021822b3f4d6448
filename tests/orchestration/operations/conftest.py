"""A small store built by a real training run (the train flow on the session's Prefect server
and Dask cluster), shared by the notebook, report, artifact and serve tests."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from headless_browser import CHROMIUM, SKIP_REASON, Browser

SMALL_RUN_ID = "ops"


@pytest.fixture(scope="session")
def small_store(
    demo_tasks: Path, dask_address: str, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    from flows.train import run_training
    from flows.train_settings import TrainSettings

    store = tmp_path_factory.mktemp("ops") / "store"
    run_training(
        TrainSettings(
            tasks_dir=str(demo_tasks),
            store=str(store),
            run_id=SMALL_RUN_ID,
            iterations=2,
            tasks_per_iteration=2,
            group_size=2,
            shards_per_iteration=2,
            max_steps=2,
        ),
        dask_address=dask_address,
    )
    return store


@pytest.fixture
def private_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Jupyter, IPython, matplotlib and browsers write their state here, not into HOME."""
    home = tmp_path / "home"
    home.mkdir()
    for name, sub in (
        ("HOME", ""),
        ("IPYTHONDIR", "ipython"),
        ("JUPYTER_DATA_DIR", "jupyter"),
        ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
        ("MPLCONFIGDIR", "matplotlib"),
    ):
        monkeypatch.setenv(name, str(home / sub) if sub else str(home))
    os.makedirs(home / "jupyter" / "runtime", exist_ok=True)
    return home


@pytest.fixture
def browser(private_home: Path) -> Iterator[Browser]:
    """A headless Chromium (skipped where none is installed)."""
    if CHROMIUM is None:
        pytest.skip(SKIP_REASON)
    opened = Browser(private_home)
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def screenshots(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    """Where the browser tests save screenshots: `--screenshots DIR`, else the test's tmp."""
    chosen = request.config.getoption("--screenshots")
    return Path(chosen) if chosen else tmp_path / "screenshots"
