"""The train flow's streaming mode end to end (a real Prefect API, the session's Dask
LocalCluster, bwrap sandboxes, the Delta store): each step is one committed, gated batch of
whole groups, no episode twice, lags within the bound for what was trained, and a step
committed but never trained on before a stop is closed on resume without training on it."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest

from flows.train import run_training
from flows.train_settings import TrainSettings
from storage import TrajectoryStore
from training.iteration import completed_iterations
from training.streaming import STREAM_SHARD

GROUPS_PER_STEP = 2
GROUP_SIZE = 2


def _settings(demo_tasks: Path, store: Path, **changes: object) -> TrainSettings:
    values: dict[str, object] = dict(
        tasks_dir=str(demo_tasks),
        store=str(store),
        run_id="s",
        iterations=3,
        tasks_per_iteration=GROUPS_PER_STEP,
        group_size=GROUP_SIZE,
        max_steps=2,
        mode="streaming",
        max_policy_lag=1,
    )
    values.update(changes)
    return TrainSettings(**values)  # type: ignore[arg-type]


def test_streaming_steps_commit_whole_groups_once_within_the_lag_bound(
    demo_tasks: Path, dask_address: str, tmp_path: Path
) -> None:
    store_path = tmp_path / "store"
    summaries = run_training(_settings(demo_tasks, store_path), dask_address=dask_address)
    store = TrajectoryStore(str(store_path))
    assert [s.iteration for s in summaries] == [0, 1, 2]
    assert completed_iterations(store, "s") == [0, 1, 2]
    groups = store.query(
        "SELECT iteration, group_index, max(policy_lag) AS lag, count(*) AS n, "
        "count(DISTINCT episode_id) AS ids, count(DISTINCT task_id) AS tasks "
        "FROM episodes WHERE run_id = 's' GROUP BY ALL ORDER BY ALL"
    ).to_pylist()
    for iteration in range(3):
        in_step = [g for g in groups if g["iteration"] == iteration]
        # the trained groups fill slots 0..GROUPS_PER_STEP-1; stale ones follow, past the bound
        assert [g["group_index"] for g in in_step] == list(range(len(in_step)))
        assert all(g["lag"] <= 1 for g in in_step[:GROUPS_PER_STEP])
        assert all(g["lag"] > 1 for g in in_step[GROUPS_PER_STEP:])
        assert store.committed_shards("s", iteration) == [STREAM_SHARD]
    # whole groups, each episode once
    assert all(g["n"] == GROUP_SIZE == g["ids"] and g["tasks"] == 1 for g in groups)
    stale = store.query(
        "SELECT iteration, value FROM metrics WHERE run_id = 's' AND name = 'stale_dropped' "
        "ORDER BY 1"
    ).to_pylist()
    assert [r["value"] for r in stale] == [
        float(sum(GROUP_SIZE for g in groups if g["iteration"] == i and g["group_index"] >= 2))
        for i in range(3)
    ]
    gates = store.query(
        "SELECT DISTINCT iteration FROM gates WHERE run_id = 's' ORDER BY 1"
    ).to_pylist()
    assert [r["iteration"] for r in gates] == [0, 1, 2]
    # the policy's update count (`name@N:digest`) moves by at most one per step, never at a
    # quarantined one (not trained on)
    counts = [0] + [int(s.policy_version.split("@")[1].split(":")[0]) for s in summaries]
    for before, after, summary in zip(counts, counts[1:], summaries, strict=False):
        assert after - before in ((0,) if summary.quarantined else (0, 1))


@pytest.mark.slow
def test_a_committed_step_not_trained_on_is_closed_on_resume(
    demo_tasks: Path, dask_address: str, tmp_path: Path
) -> None:
    store_path = tmp_path / "store"
    run_training(_settings(demo_tasks, store_path, iterations=1), dask_address=dask_address)
    store = TrajectoryStore(str(store_path))
    # A stop between the commit of step 1 and its update leaves step 1's shard committed with
    # no completion marker: step 0's rows under new ids make one of the same shape.
    rows = store.read_episodes("s", 0, include_quarantined=True)
    moved = rows.set_column(
        rows.schema.get_field_index("iteration"),
        rows.schema.field("iteration"),
        pa.array([1] * rows.num_rows, type=rows.schema.field("iteration").type),
    ).set_column(
        rows.schema.get_field_index("episode_id"),
        rows.schema.field("episode_id"),
        pa.array([f"{e}-step1" for e in rows.column("episode_id").to_pylist()]),
    )
    store.commit_iteration_shard("s", 1, STREAM_SHARD, episodes=moved)
    summaries = run_training(
        _settings(demo_tasks, store_path, iterations=3, resume=True), dask_address=dask_address
    )
    assert [s.iteration for s in summaries] == [1, 2]
    closed = summaries[0]
    assert closed.stale_dropped == rows.num_rows and closed.episodes == 0
    assert completed_iterations(store, "s") == [0, 1, 2]
    assert store.query(
        "SELECT count(*) AS n FROM episodes WHERE run_id = 's' AND iteration = 1"
    ).to_pylist() == [{"n": rows.num_rows}]


UPDATE_STAND_IN_S = 10.0
"""Each update of the overlap test waits this long first: an update taking as long as some
rollouts, as an accelerator's does, so there is a window to overlap."""


@pytest.mark.slow  # two 10 s stand-in updates plus a flow: 32 s on a lightly loaded machine
def test_the_next_step_is_committed_and_gated_while_the_current_one_updates(
    demo_tasks: Path, dask_address: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every step must train for both updates to run: the demo policy's early groups can all
    # fail alike, which the default zero-variance threshold would quarantine.
    monkeypatch.setenv("ROLLYARD_GATE_MAX_ZERO_VARIANCE_GROUP_SHARE", "1.0")
    store_path = tmp_path / "store"
    summaries = run_training(
        _settings(demo_tasks, store_path, iterations=2, update_stand_in_s=UPDATE_STAND_IN_S),
        dask_address=dask_address,
    )
    assert [s.quarantined for s in summaries] == [False, False]
    marks = {
        (row["iteration"], row["name"]): row["value"]
        for row in TrajectoryStore(str(store_path))
        .query(
            "SELECT iteration, name, value FROM metrics WHERE run_id = 's' "
            "AND name LIKE '%_epoch_s'"
        )
        .to_pylist()
    }
    # Step 1's batch was committed and gated while step 0's update ran (a loop that gates
    # after the update cannot start that gate before the update ends)...
    assert marks[1, "gate_started_epoch_s"] < marks[0, "update_ended_epoch_s"]
    # ...and step 1 was trained on only once its own gate had passed, after step 0's update.
    assert marks[1, "update_started_epoch_s"] >= marks[1, "gate_ended_epoch_s"]
    assert marks[1, "update_started_epoch_s"] >= marks[0, "update_ended_epoch_s"]
