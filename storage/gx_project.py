"""The store's Great Expectations project: a GX file data context in `STORE/gx` holding the
gates' expectation suites, validation definitions and checkpoints, and the Data Docs each gate
run renders (`STORE/gx/uncommitted/data_docs/local_site`). Open it with GX's own API:

    context = gx.get_context(mode="file", project_root_dir=STORE)
    suite = context.suites.get("iteration.episodes")

The gate builds each run's Data Docs itself, once after its checkpoints (which carry no
actions): a checkpoint run by hand renders nothing until `context.build_data_docs()`.

An object-storage store keeps its GX project under `./.rollyard` (GX's file context is local).
GX is imported inside `open_context` only (its import takes seconds).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

GX_DIR = "gx"
DOCS_SITE = "local_site"
DATASOURCE = "rollyard"
"""The pandas data source whose dataframe assets the gates validate."""
ITERATION_SUITE_PREFIX = "iteration."
"""Prefix of the iteration gate's suite and checkpoint names in the context."""


def project_root(store_root: str) -> Path:
    """The directory holding the GX project (`gx/`) of a store."""
    if "://" in store_root and not store_root.startswith("file://"):
        return Path(".rollyard").absolute()
    return Path(store_root.removeprefix("file://"))


def docs_site_dir(store_root: str) -> Path:
    return project_root(store_root) / GX_DIR / "uncommitted" / "data_docs" / DOCS_SITE


def gate_run_name(run_id: str, iteration: int, evaluation: int) -> str:
    """GX's run name of one gate evaluation; its Data Docs pages live under it."""
    return (
        f"{re.sub(r'[^A-Za-z0-9_.-]+', '-', run_id)}.iteration-{iteration}.evaluation-{evaluation}"
    )


def gate_docs_pages(store_root: str, run_id: str, iteration: int, evaluation: int) -> list[Path]:
    """The Data Docs pages (one per suite) of one gate evaluation, by suite name."""
    return gate_docs_pages_for(store_root, gate_run_name(run_id, iteration, evaluation))


def gate_docs_pages_for(store_root: str, run_name: str) -> list[Path]:
    # GX turns the dots of a suite name into folders: iteration.episodes -> iteration/episodes
    suites = docs_site_dir(store_root) / "validations" / ITERATION_SUITE_PREFIX.rstrip(".")
    return sorted(suites.glob(f"*/{run_name}/*/*.html"))


def open_context(store_root: str) -> Any:
    """The store's GX file data context, created on first use, progress bars off."""
    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    root = project_root(store_root)
    root.mkdir(parents=True, exist_ok=True)
    context = gx.get_context(mode="file", project_root_dir=str(root))
    if context.variables.progress_bars != ProgressBarsConfig(globally=False):
        context.variables.progress_bars = ProgressBarsConfig(globally=False)
        context.variables.save()
    return context


def dataframe_batch(context: Any, asset_name: str) -> Any:
    """The whole-dataframe batch definition of `asset_name` in the rollyard data source."""
    try:
        source = context.data_sources.get(DATASOURCE)
    except KeyError:
        source = context.data_sources.add_pandas(name=DATASOURCE)
    try:
        asset = source.get_asset(asset_name)
    except LookupError:
        asset = source.add_dataframe_asset(name=asset_name)
    try:
        return asset.get_batch_definition("whole")
    except KeyError:
        return asset.add_batch_definition_whole_dataframe("whole")
