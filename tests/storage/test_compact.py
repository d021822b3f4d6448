"""Compaction of the steps table: readers see the same rows, only committed shards are merged,
and commits, replays and vacuum work as before on a compacted table."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from shard_data import make_shard
from test_commits import assert_consistent, crash_after_steps, legacy_lost_steps

from flows.cli import main
from storage import TrajectoryStore

STEPS_SQL = "SELECT * FROM steps ORDER BY episode_id, step"
EPISODES_SQL = "SELECT * FROM episodes ORDER BY episode_id"


def commit(store: TrajectoryStore, iteration: int, shard: int) -> bool:
    episodes, steps = make_shard("run", iteration, shard, n_episodes=4, max_steps=5)
    return store.commit_iteration_shard(
        "run", iteration, shard, episodes=episodes, steps=steps
    ).committed


def live_steps_files(root: Path) -> list[str]:
    return DeltaTable(str(root / "steps")).file_uris()


def test_compaction_keeps_every_row_and_merges_each_iteration_into_one_file(
    tmp_path: Path,
) -> None:
    store = TrajectoryStore(tmp_path)
    for iteration in range(2):
        for shard in range(3):
            commit(store, iteration, shard)
    commit(store, 2, 0)  # a partition of one file: nothing to merge
    steps_before, episodes_before = store.query(STEPS_SQL), store.query(EPISODES_SQL)
    counts = assert_consistent(store)
    assert len(live_steps_files(tmp_path)) == 7

    result = store.compact()
    assert result.partitions == (("run", 0), ("run", 1))
    assert (result.files_before, result.files_after) == (6, 2)
    assert result.rows == sum(
        r["n"]
        for r in store.query("SELECT count(*) AS n FROM steps WHERE iteration < 2").to_pylist()
    )
    assert len(live_steps_files(tmp_path)) == 3
    fresh = TrajectoryStore(tmp_path)
    assert fresh.query(STEPS_SQL).equals(steps_before)
    assert fresh.query(EPISODES_SQL).equals(episodes_before)
    assert assert_consistent(fresh) == counts
    # Nothing left to do; a replay of a compacted shard still writes nothing.
    assert fresh.compact().partitions == ()
    episodes, steps = make_shard("run", 0, 1, n_episodes=4, max_steps=5)
    assert not fresh.commit_iteration_shard("run", 0, 1, episodes=episodes, steps=steps).committed
    # New shards land beside the compacted file, and the next compaction takes them in.
    commit(fresh, 0, 3)
    assert fresh.compact(iteration=0).partitions == (("run", 0),)
    assert assert_consistent(fresh)[0] == counts[0] + 4


def test_steps_of_uncommitted_and_lost_shards_are_not_merged(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    commit(store, 0, 0)
    commit(store, 0, 1)
    legacy_lost_steps(store, "run", 0, 3)
    commit(store, 0, 3)  # shard 3 commits: the older layout's attempt is a lost commit
    crash_after_steps(store, "run", 0, 2)  # steps in the table, episodes not yet: invisible
    visible = assert_consistent(store)
    assert len(live_steps_files(tmp_path)) == 5

    result = store.compact()
    assert (result.files_before, result.files_after) == (3, 1)
    assert assert_consistent(TrajectoryStore(tmp_path)) == visible
    assert len(live_steps_files(tmp_path)) == 3  # merged file + the two left out
    # The stopped shard is completed by its replay, whole, with its writer's rows.
    assert not commit(store, 0, 2)
    assert assert_consistent(TrajectoryStore(tmp_path))[0] == visible[0] + 5
    # vacuum still finds the lost commit's steps after compaction.
    assert len(TrajectoryStore(tmp_path).vacuum().removed_files) == 1


def test_compact_command_and_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = TrajectoryStore(tmp_path)
    commit(store, 0, 0)
    commit(store, 0, 1)
    assert main(["store", "compact", "--store", str(tmp_path), "--format", "csv"]) == 0
    assert capsys.readouterr().out.splitlines()[1].split(",")[:3] == ["1", "2", "1"]
    assert main(["store", "compact", "--store", str(tmp_path / "absent")]) == 3
    err = capsys.readouterr().err
    assert "no store here" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match="min_files"):
        store.compact(min_files=1)
