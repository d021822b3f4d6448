"""The train flow end to end through Prefect (a real local API server), Dask (LocalCluster and a
multi-process deployment), bwrap sandboxes and the Delta store: every scheduled episode is
committed exactly once, through worker loss and a killed flow."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.errors import GateStoppedRun, NoWorkersError
from flows.train import run_training
from flows.train_settings import TrainSettings
from storage import TrajectoryStore
from training.iteration import completed_iterations
from training.recovery import FaultPlan

TASKS_PER_ITERATION = 2
GROUP_SIZE = 2


def _settings(demo_tasks: Path, store: Path, **changes: object) -> TrainSettings:
    values: dict[str, object] = dict(
        tasks_dir=str(demo_tasks),
        store=str(store),
        run_id="t",
        iterations=2,
        tasks_per_iteration=TASKS_PER_ITERATION,
        group_size=GROUP_SIZE,
        shards_per_iteration=2,
        max_steps=2,
    )
    values.update(changes)
    return TrainSettings(**values)  # type: ignore[arg-type]


def assert_exactly_once(store: Path, run_id: str, iterations: int) -> None:
    """One committed episode per scheduled (iteration, group, sample), none missing."""
    rows = (
        TrajectoryStore(str(store))
        .query(
            "SELECT iteration, group_index, sample_index, count(*) AS n, "
            "count(DISTINCT episode_id) AS ids FROM episodes WHERE run_id = ? "
            "GROUP BY ALL ORDER BY ALL",
            [run_id],
        )
        .to_pylist()
    )
    expected = {
        (i, g, s)
        for i in range(iterations)
        for g in range(TASKS_PER_ITERATION)
        for s in range(GROUP_SIZE)
    }
    assert {(r["iteration"], r["group_index"], r["sample_index"]) for r in rows} == expected
    assert all(r["n"] == 1 and r["ids"] == 1 for r in rows), rows


def test_train_flow_commits_every_episode_exactly_once(
    demo_tasks: Path, dask_address: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    summaries = run_training(_settings(demo_tasks, store), dask_address=dask_address)
    assert [s.iteration for s in summaries] == [0, 1]
    assert_exactly_once(store, "t", 2)
    assert completed_iterations(TrajectoryStore(str(store)), "t") == [0, 1]
    assert TrajectoryStore(str(store)).checkpoints.recorded("t")
    # Each finished iteration's steps (two shards each) were compacted into one file.
    import pyarrow as pa
    from deltalake import DeltaTable

    actions = pa.table(DeltaTable(str(store / "steps")).get_add_actions(flatten=True))
    assert sorted(actions["partition.iteration"].to_pylist()) == [0, 1]
    with pytest.raises(ValueError, match="--resume"):
        run_training(_settings(demo_tasks, store), dask_address=dask_address)


def test_async_mode_bounds_and_records_policy_lag(
    demo_tasks: Path, dask_address: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    summaries = run_training(
        _settings(demo_tasks, store, iterations=3, mode="async", max_policy_lag=1),
        dask_address=dask_address,
    )
    assert all(s.max_policy_lag <= 1 for s in summaries)
    lags = (
        TrajectoryStore(str(store))
        .query(
            "SELECT iteration, value FROM metrics WHERE run_id = 't' AND name = 'policy_lag' "
            "ORDER BY iteration"
        )
        .to_pylist()
    )
    assert [r["iteration"] for r in lags] == [0, 1, 2]
    assert all(r["value"] <= 1 for r in lags)
    per_episode = (
        TrajectoryStore(str(store))
        .query(
            "SELECT iteration, max(policy_lag) AS lag FROM episodes GROUP BY iteration ORDER BY 1"
        )
        .to_pylist()
    )
    # iteration 0 is planned with the initial policy; later ones one update behind
    assert [r["lag"] for r in per_episode] == [0, 1, 1]
    assert_exactly_once(store, "t", 3)


def test_failed_gate_quarantines_and_can_stop_the_run(
    demo_tasks: Path, dask_address: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    every_sandbox_crashes = FaultPlan(sandbox_kill=1.0)
    with pytest.raises(GateStoppedRun, match="infra"):
        run_training(
            _settings(
                demo_tasks,
                store,
                iterations=2,
                max_attempts=1,
                faults=every_sandbox_crashes,
                gate_on_failure="stop",
            ),
            dask_address=dask_address,
        )
    view = TrajectoryStore(str(store))
    assert view.gates.iteration_status("t", 0).quarantined
    assert view.read_episodes("t", 0).num_rows == 0  # kept, but not for the trainer
    assert view.read_episodes("t", 0, include_quarantined=True).num_rows == 4
    assert completed_iterations(view, "t") == []  # stopped before iteration 0 was done


def test_lost_workers_lose_no_episode(demo_tasks: Path, dask_address: str, tmp_path: Path) -> None:
    store = tmp_path / "store"
    faults = FaultPlan(worker_kill=0.25, seed=1, marker_dir=str(tmp_path / "markers"))
    run_training(_settings(demo_tasks, store, faults=faults), dask_address=dask_address)
    assert any((tmp_path / "markers").iterdir()), "no worker was killed: raise the rate"
    assert_exactly_once(store, "t", 2)


@pytest.mark.slow  # two trainings on a cluster of its own
def test_a_cluster_without_workers_fails_the_run_instead_of_waiting(
    demo_tasks: Path, prefect_server: str, tmp_path: Path
) -> None:
    from distributed import LocalCluster

    from flows.runtime import local_cluster_kwargs

    store = tmp_path / "store"
    # A scheduler whose workers are all gone: its queued shards would wait forever.
    with LocalCluster(**local_cluster_kwargs(0)) as cluster:
        started = time.monotonic()
        with pytest.raises(NoWorkersError, match=r"no worker for .* --resume"):
            run_training(
                _settings(demo_tasks, store, no_worker_timeout_s=3.0),
                dask_address=cluster.scheduler_address,
            )
        assert time.monotonic() - started < 120
        assert completed_iterations(TrajectoryStore(str(store)), "t") == []
        # Workers come back: the run resumes and every episode is committed once.
        cluster.scale(2)
        cluster.wait_for_workers(2, timeout=120)
        run_training(
            _settings(demo_tasks, store, resume=True), dask_address=cluster.scheduler_address
        )
    assert_exactly_once(store, "t", 2)


@pytest.mark.slow  # kills a training process; tests/storage/test_commits.py kills writers by default
def test_killed_flow_resumes_without_duplicates(
    demo_tasks: Path, dask_address: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    command = [
        sys.executable,
        "-m",
        "flows.cli",
        "train",
        "--tasks",
        str(demo_tasks),
        "--store",
        str(store),
        "--run-id",
        "t",
        "--iterations",
        "3",
        "--group-size",
        str(GROUP_SIZE),
        "--tasks-per-iteration",
        str(TASKS_PER_ITERATION),
        "--shards",
        "2",
        "--max-steps",
        "2",
        "--workers",
        "1",
    ]
    flow = subprocess.Popen(
        command,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=os.environ.copy(),
    )
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and flow.poll() is None:
            if completed_iterations(TrajectoryStore(str(store)), "t"):
                break
            time.sleep(0.5)
        assert flow.poll() is None, "the flow ended before it could be killed"
    finally:
        os.killpg(flow.pid, signal.SIGKILL)  # the flow host dies with its workers
        flow.wait()
    done_before = set(completed_iterations(TrajectoryStore(str(store)), "t"))
    assert done_before and max(done_before) < 2
    summaries = run_training(
        _settings(demo_tasks, store, iterations=3, resume=True), dask_address=dask_address
    )
    assert [s.iteration for s in summaries] == [i for i in range(3) if i not in done_before]
    assert_exactly_once(store, "t", 3)


@pytest.mark.slow  # a deployment with worker processes of its own
def test_multi_process_dask_deployment(
    demo_tasks: Path, prefect_server: str, tmp_path: Path
) -> None:
    """Scheduler and worker as separate processes on loopback, as on a real cluster."""
    bin_dir = Path(sys.executable).parent
    port = _free_port()
    processes = [
        subprocess.Popen(
            [
                str(bin_dir / "dask"),
                "scheduler",
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--no-dashboard",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        ),
    ]
    try:
        processes.append(
            subprocess.Popen(
                [
                    str(bin_dir / "dask"),
                    "worker",
                    f"tcp://127.0.0.1:{port}",
                    "--nworkers",
                    "1",
                    "--nthreads",
                    "1",
                    "--no-dashboard",
                    "--preload",
                    "flows.dask_worker",
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
                env=os.environ.copy(),
            )
        )
        store = tmp_path / "store"
        run_training(
            _settings(demo_tasks, store, iterations=1), dask_address=f"tcp://127.0.0.1:{port}"
        )
        assert_exactly_once(store, "t", 1)
    finally:
        for process in processes:
            os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _free_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
