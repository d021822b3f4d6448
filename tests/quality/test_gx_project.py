"""The gates as Great Expectations users know them: suites, validation definitions and
checkpoints persisted in a GX file data context inside the store, Data Docs rendered per gate
run into the store (nothing in the temporary directory), and a suite edited with GX's own API
used by the next iteration's gate."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from batches import commit_batch, make_batch

from storage import TrajectoryStore
from storage.gates import GateSettings, gate_iteration
from storage.gx_project import docs_site_dir, gate_docs_pages


@pytest.fixture()
def store(tmp_path: Path) -> TrajectoryStore:
    return TrajectoryStore(tmp_path / "store")


def _context(store: TrajectoryStore) -> Any:
    import great_expectations as gx

    return gx.get_context(mode="file", project_root_dir=store.root)


def _expectation(suite: Any, rollyard_check: str) -> Any:
    return next(e for e in suite.expectations if e.meta.get("rollyard_check") == rollyard_check)


def test_a_gate_run_leaves_a_gx_project_and_its_data_docs_in_the_store(
    store: TrajectoryStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    commit_batch(store, "run", 0, make_batch("run", 0))
    report = gate_iteration(store, "run", 0)
    assert report.passed
    assert list(scratch.iterdir()) == [], "the gate left files in the temporary directory"

    context = _context(store)
    suites = {suite.name for suite in context.suites.all()}
    assert {"iteration.batch", "iteration.episodes", "iteration.groups"} <= suites
    assert {c.name for c in context.checkpoints.all()} == {
        "iteration.episodes",
        "iteration.groups",
    }
    pages = [Path(p) for p in report.docs_pages]
    assert pages == gate_docs_pages(store.root, "run", 0, 0)
    assert len(pages) == 3  # one page per suite that ran
    for page, suite in zip(pages, ("batch", "episodes", "groups"), strict=True):
        assert page.is_relative_to(Path(store.root)) and page.is_file()
        text = page.read_text()
        assert f"iteration.{suite}" in text and "run.iteration-0.evaluation-0" in text
    assert (docs_site_dir(store.root) / "index.html").is_file()

    # a re-gate renders pages of its own evaluation, the first evaluation's pages stay
    again = gate_iteration(store, "run", 0)
    assert again.evaluation == 1 and len(again.docs_pages) == 3
    assert set(again.docs_pages).isdisjoint(report.docs_pages)
    assert all(Path(p).is_file() for p in report.docs_pages)


def test_a_suite_edited_with_gx_is_what_the_next_gate_runs(store: TrajectoryStore) -> None:
    import great_expectations.expectations as gxe

    commit_batch(store, "run", 0, make_batch("run", 0))
    assert gate_iteration(store, "run", 0).passed

    # A GX user tightens one of rollyard's expectations and adds one of their own.
    context = _context(store)
    suite = context.suites.get("iteration.episodes")
    rewards = _expectation(suite, "reward_in_range")
    rewards.max_value = 0.5
    rewards.save()
    suite.add_expectation(gxe.ExpectColumnMaxToBeBetween(column="n_steps", max_value=2))
    suite.save()

    commit_batch(store, "run", 1, make_batch("run", 1))
    report = gate_iteration(store, "run", 1)
    failed = {r.expectation for r in report.failed}
    assert failed == {"reward_in_range", "expect_column_max_to_be_between[n_steps]"}
    assert "max_value=0.5" in report.thresholds["reward_in_range"]
    assert "edited" in report.thresholds["reward_in_range"]
    assert report.quarantined and store.gates.iteration_status("run", 1).quarantined

    # The edit survives later gates, even under settings that would write another bound.
    later = gate_iteration(store, "run", 1, GateSettings(reward_max=2.0))
    assert "reward_in_range" in {r.expectation for r in later.failed}
    stored = _expectation(_context(store).suites.get("iteration.episodes"), "reward_in_range")
    assert stored.max_value == 0.5


def test_settings_reach_the_expectations_nobody_edited(store: TrajectoryStore) -> None:
    commit_batch(store, "run", 0, make_batch("run", 0, infra_share=0.1))
    assert "infra_error_rate" in {r.expectation for r in gate_iteration(store, "run", 0).failed}
    relaxed = gate_iteration(store, "run", 0, GateSettings(max_infra_error_rate=0.5))
    assert "infra_error_rate" not in {r.expectation for r in relaxed.failed}
    stored = _expectation(_context(store).suites.get("iteration.episodes"), "infra_error_rate")
    assert stored.max_value == 0.5
