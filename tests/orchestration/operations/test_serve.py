"""`rollyard serve` end to end: the deployments register with their schedules, a run triggered
through the Prefect API completes and writes to the store, SIGTERM stops the server cleanly."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from flows.deployments import CURATE_DEPLOYMENT, EVALUATE_DEPLOYMENT, TRAIN_DEPLOYMENT
from flows.evaluate import EvaluateParams
from storage import TrajectoryStore

DEPLOYMENTS = {
    f"curate-library/{CURATE_DEPLOYMENT}",
    f"evaluate/{EVALUATE_DEPLOYMENT}",
    f"train/{TRAIN_DEPLOYMENT}",
}
REGISTER_TIMEOUT_S = 150.0


async def _served_deployments() -> dict[str, Any]:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        deployments = await client.read_deployments()
        flows = {f.id: f.name for f in await client.read_flows()}
    return {f"{flows.get(d.flow_id)}/{d.name}": d for d in deployments}


def _wait_for_deployments(server: subprocess.Popen[bytes], log: Path) -> dict[str, Any]:
    deadline = time.monotonic() + REGISTER_TIMEOUT_S
    while time.monotonic() < deadline:
        assert server.poll() is None, f"rollyard serve exited:\n{log.read_text()[-3000:]}"
        found = asyncio.run(_served_deployments())
        if found.keys() >= DEPLOYMENTS:
            return found
        time.sleep(1.0)
    raise AssertionError(f"deployments not registered in time:\n{log.read_text()[-3000:]}")


def test_serve_runs_a_triggered_deployment_and_stops_on_sigterm(
    small_store: Path, demo_tasks: Path, prefect_server: str, tmp_path: Path
) -> None:
    from prefect.deployments import run_deployment

    store = tmp_path / "store"
    shutil.copytree(small_store, store)
    held_out = tmp_path / "held-out"
    task = sorted(p for p in demo_tasks.iterdir() if (p / "task.toml").is_file())[-1]
    shutil.copytree(task, held_out / task.name)
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        command = [sys.executable, "-m", "flows.cli", "serve", "--store", str(store)]
        command += ["--tasks", str(demo_tasks), "--eval-tasks", str(held_out), "--run-id", "ops"]
        command += ["--paused"]  # schedules registered but off: only the triggered run runs
        server = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PREFECT_API_URL": prefect_server},
            start_new_session=True,
        )
    try:
        deployments = _wait_for_deployments(server, log)
        for name in DEPLOYMENTS:
            assert deployments[name].schedules, f"{name} has no schedule"

        params = EvaluateParams(
            store=str(store), tasks_dir=str(held_out), run_id="ops", samples_per_task=1, max_steps=2
        )
        flow_run = run_deployment(
            f"evaluate/{EVALUATE_DEPLOYMENT}",
            parameters={"params": dataclasses.asdict(params)},
            timeout=240,
        )
        assert flow_run.state is not None and flow_run.state.is_completed(), (
            f"{flow_run.state}\n{log.read_text()[-3000:]}"
        )
        evaluated = (
            TrajectoryStore(str(store))
            .query("SELECT name, value FROM metrics WHERE source = 'evaluation' ORDER BY name")
            .to_pylist()
        )
        assert {"name": "eval_episodes", "value": 1.0} in evaluated
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            code = server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
            raise AssertionError(f"serve ignored SIGTERM:\n{log.read_text()[-3000:]}") from None
    assert code == 0, log.read_text()[-3000:]


def test_deployments_carry_their_schedules_and_parameters(tmp_path: Path) -> None:
    from flows.deployments import ServeSettings, build_deployments

    settings = ServeSettings(
        store="store", tasks_dir="tasks", curate_cron="0 4 * * *", evaluate_interval_s=60
    )
    deployments = {d.name: d for d in build_deployments(settings)}
    # no held-out tasks: nothing to evaluate on, so no evaluation deployment
    assert set(deployments) == {CURATE_DEPLOYMENT, TRAIN_DEPLOYMENT}
    assert deployments[CURATE_DEPLOYMENT].schedules[0].schedule.cron == "0 4 * * *"
    assert deployments[TRAIN_DEPLOYMENT].parameters["settings"]["resume"] is True

    with_eval = {
        d.name: d
        for d in build_deployments(dataclasses.replace(settings, eval_tasks_dir="held-out"))
    }
    interval = with_eval[EVALUATE_DEPLOYMENT].schedules[0].schedule.interval
    assert interval.total_seconds() == 60


def test_serve_refuses_a_missing_tasks_dir(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli import main

    assert main(["serve", "--tasks", str(tmp_path / "missing")]) == 2
    assert "--tasks" in capsys.readouterr().err
