"""Every analysis notebook runs top to bottom (nbclient, a real kernel) against a store a real
training run wrote, and is committed without outputs."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[3] / "notebooks").glob("*.ipynb"))


def test_the_analysis_notebooks_exist() -> None:
    assert {p.stem for p in NOTEBOOKS} >= {
        "reward_curves",
        "failure_taxonomy",
        "task_library_health",
        "throughput",
        "audit_top_trajectories",
    }


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_is_committed_without_outputs(path: Path) -> None:
    notebook = nbformat.read(path, as_version=4)
    nbformat.validate(notebook)
    for cell in notebook.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None, (
                f"{path.name} has outputs; clear them before committing "
                "(jupyter nbconvert --clear-output --inplace notebooks/*.ipynb)"
            )


def test_notebooks_run_against_a_trained_store(
    small_store: Path, private_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_STORE", str(small_store))
    # inline plots, so the test sees the figures the notebooks draw
    monkeypatch.setenv("MPLBACKEND", "module://matplotlib_inline.backend_inline")
    figures = {}
    for path in NOTEBOOKS:
        notebook = nbformat.read(path, as_version=4)
        client = NotebookClient(
            notebook,
            timeout=120,
            kernel_name="python3",
            resources={"metadata": {"path": str(path.parent)}},
        )
        client.execute()  # raises CellExecutionError naming the cell on any error
        figures[path.stem] = sum(
            "image/png" in output.get("data", {})
            for cell in notebook.cells
            for output in cell.get("outputs", [])
        )
    # every notebook with data to plot drew it (the store has no curation, so the library's
    # verdict chart is legitimately absent)
    assert figures["reward_curves"] >= 2, figures
    assert figures["failure_taxonomy"] >= 1, figures
    assert figures["throughput"] >= 2, figures
    assert figures["task_library_health"] >= 1, figures
