"""What a user opens after a run, looked at in a real headless browser: the Prefect UI shows the
training flow run and its task runs, the Dask dashboard shows the cluster's workers, and the
HTML report links each gate run's Great Expectations Data Docs page, which renders. The
screenshots are the README's ("Where to look"): `pytest --screenshots docs/images ...`."""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from headless_browser import Browser, colours_in

from storage import TrajectoryStore
from storage.gx_project import gate_docs_pages
from storage.report import write_report

SMALL_RUN_ID = "ops"  # the run of the `small_store` fixture

# The first test here may start the session's Prefect server and run the small training run: on
# a busy 2-core machine that took over 10 minutes. The tests themselves take seconds.
pytestmark = pytest.mark.timeout(2400)
UI_WAIT_S = 300.0
"""The Prefect UI renders from its API, which answered in tens of seconds on a busy machine."""
DASHBOARD_WAIT_S = 600.0
"""Bokeh's first render of a dashboard page waits for the scheduler's websocket feed: minutes on
a busy 2-core machine."""


def _train_flow_run(run_id: str) -> tuple[str, str, list[str]]:
    """(id, name, task run names) of the train flow run of `run_id`, from the Prefect API."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowFilter,
        FlowFilterName,
        FlowRunFilter,
        FlowRunFilterId,
    )

    with get_client(sync_client=True) as client:
        runs = client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["train"])))
        [run] = [r for r in runs if r.parameters["settings"]["run_id"] == run_id]
        tasks = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[run.id]))
        )
    return str(run.id), run.name, sorted(t.name for t in tasks)


# Slow set: with its server and training run, about a minute of the default suite's budget.
@pytest.mark.slow
def test_the_prefect_ui_shows_the_training_flow_run_and_its_task_runs(
    small_store: Path, prefect_server: str, browser: Browser, screenshots: Path
) -> None:
    flow_run_id, flow_run_name, task_runs = _train_flow_run(SMALL_RUN_ID)
    assert any(name.startswith("rollout_shard") for name in task_runs)
    assert any(name.startswith("gate_iteration") for name in task_runs)
    ui = prefect_server.removesuffix("/api")

    browser.open(f"{ui}/runs/flow-run/{flow_run_id}")
    browser.wait_for_text(flow_run_name, "Completed", "Task Runs", timeout_s=UI_WAIT_S)
    # the run's log names its task runs as they finish
    browser.wait_for_text(*task_runs, timeout_s=UI_WAIT_S)
    shot = browser.screenshot(screenshots / "prefect-ui-flow-run.png")
    assert colours_in(shot) > 50

    # the Task Runs tab lists every task run of the flow run, each completed
    browser.evaluate(
        "Array.from(document.querySelectorAll('li.p-tab'))"
        ".find(tab => tab.textContent.trim() === 'Task Runs').click()"
    )
    browser.wait_for_text(
        f"{len(task_runs)} Task runs", f"({len(task_runs)} Completed)", timeout_s=UI_WAIT_S
    )
    # the list under the sort control fills in after the counts
    browser.wait_for_text(*task_runs, after="Oldest to Newest", timeout_s=UI_WAIT_S)


# Slow set: Bokeh draws the dashboard from a websocket feed, which took minutes to arrive on a
# busy 2-core machine.
@pytest.mark.slow
def test_the_dask_dashboard_shows_the_clusters_workers_and_task_stream(
    dask_address: str, browser: Browser, screenshots: Path
) -> None:
    from distributed import Client

    with Client(dask_address) as client:
        link = client.dashboard_link
        assert link.endswith("/status")
        ports = [
            address.rsplit(":", 1)[1] for address in client.scheduler_info(n_workers=-1)["workers"]
        ]
        browser.open(link.replace("/status", "/workers"))
        # Bokeh renders the worker table, in shadow roots, from the scheduler's websocket feed
        _wait_until(lambda: all(port in browser.deep_text() for port in ports), f"workers {ports}")

        # Tasks that wait rather than compute: bars in the task stream without taking cores
        # from a shared machine.
        futures = client.map(time.sleep, [0.25] * 240, pure=False)
        try:
            browser.open(link)
            # the plots draw on canvases; their titles and the task stream's data are Bokeh models
            _wait_until(
                lambda: "sleep" in browser.bokeh_models()["names"], "the task stream's tasks"
            )
            titles = browser.bokeh_models()["titles"]
            assert "Task Stream" in titles, titles
            assert any(title.startswith("Progress -- total: 240") for title in titles), titles
            time.sleep(5)  # let the task stream fill
            shot = browser.screenshot(screenshots / "dask-dashboard.png")
        finally:
            client.cancel(futures)
    assert colours_in(shot) > 50


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + DASHBOARD_WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"the dashboard never showed {what}"
        time.sleep(1)


def test_the_report_links_the_data_docs_page_of_each_gate_run(
    small_store: Path, tmp_path: Path, browser: Browser, screenshots: Path
) -> None:
    report = write_report(TrajectoryStore(str(small_store)), small_store / "report.html")
    browser.open(report.as_uri())
    browser.wait_for_text("Quality gate history", "Data Docs")
    shot = browser.screenshot(screenshots / "report.png")
    assert colours_in(shot) > 50

    links = browser.evaluate(
        "Array.from(document.querySelectorAll('ul.docs a')).map(a => [a.textContent, a.href])"
    )
    pages = gate_docs_pages(str(small_store), SMALL_RUN_ID, 0, 0)
    assert pages and {href for _, href in links} >= {page.as_uri() for page in pages}

    _label, href = next((label, href) for label, href in links if "iteration 0: episodes" in label)
    browser.open(href)
    text = browser.wait_for_text("iteration.episodes", "ops.iteration-0.evaluation-0")
    # GX lists each expectation it evaluated, with its verdict
    assert "Succeeded" in text or "Failed" in text
    assert "reward" in text and "episode_id" in text
    browser.screenshot(screenshots / "data-docs-gate-run.png")
