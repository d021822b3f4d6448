"""A shard whose Dask worker stops answering (SIGSTOP: alive, holding its task, silent) passes
its deadline; the flow restarts that worker, the shard runs again on a live one, and every
episode is committed exactly once. A real Prefect server, a real LocalCluster with nannies,
bwrap sandboxes and the Delta store."""

from __future__ import annotations

import os
import signal
import socket
import threading
import time
from pathlib import Path

import pytest

from flows import shard_watch
from flows.train import run_training
from flows.train_settings import TrainSettings
from storage import TrajectoryStore


def _stop_a_busy_worker(client: object, pids: dict[str, int], stopped: dict[str, int]) -> None:
    """SIGSTOP the first worker seen processing a shard, a moment after it started."""
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        for address, keys in client.processing().items():  # type: ignore[attr-defined]
            if keys:
                time.sleep(1.0)  # into an episode, with a sandbox open
                os.kill(pids[address], signal.SIGSTOP)
                stopped[address] = pids[address]
                return
        time.sleep(0.1)


def _exists(pid: int) -> bool:
    """Whether `pid` is a process that has not exited (a zombie has)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, IndexError):
        return False
    return state != "Z"


@pytest.mark.slow
def test_a_shard_on_a_stopped_worker_is_rescheduled_and_committed_once(
    demo_tasks: Path, prefect_server: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from distributed import Client, LocalCluster

    monkeypatch.setattr(shard_watch, "SHARD_START_ALLOWANCE_S", 5.0)
    store = tmp_path / "store"
    settings = TrainSettings(
        tasks_dir=str(demo_tasks),
        store=str(store),
        run_id="hang",
        iterations=1,
        tasks_per_iteration=2,
        group_size=2,
        shards_per_iteration=2,
        max_steps=1,
        episode_deadline_s=45.0,
    )
    stopped: dict[str, int] = {}
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        pids: dict[str, int] = client.run(os.getpid)
        stopper = threading.Thread(
            target=_stop_a_busy_worker, args=(client, pids, stopped), daemon=True
        )
        stopper.start()
        started = time.monotonic()
        try:
            summaries = run_training(settings, dask_address=cluster.scheduler_address)
        finally:
            stopper.join(timeout=5)
            still_there = [pid for pid in stopped.values() if _exists(pid)]
            for pid in still_there:
                os.kill(pid, signal.SIGCONT)
        elapsed_s = time.monotonic() - started
    assert stopped, "no worker was stopped: the shards finished before the stopper saw them"
    assert [s.iteration for s in summaries] == [0]
    # The flow had the stopped worker restarted (its process is gone); waiting for Dask's own
    # worker time-to-live would have left it stopped.
    assert still_there == []
    assert elapsed_s < 600, elapsed_s
    rows = (
        TrajectoryStore(str(store))
        .query(
            "SELECT group_index, sample_index, count(*) AS n, any_value(worker) AS worker "
            "FROM episodes WHERE run_id = 'hang' GROUP BY ALL ORDER BY ALL"
        )
        .to_pylist()
    )
    assert [(r["group_index"], r["sample_index"], r["n"]) for r in rows] == [
        (0, 0, 1),
        (0, 1, 1),
        (1, 0, 1),
        (1, 1, 1),
    ]
    stopped_worker = f"{socket.gethostname()}:{next(iter(stopped.values()))}"
    assert all(r["worker"] != stopped_worker for r in rows), rows
