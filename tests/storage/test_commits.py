"""Exactly-once shard commits: round trip, replay, killed writers and concurrent writers."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from shard_data import make_shard

from storage import (
    EpisodeRecord,
    RecordError,
    StepRecord,
    TrajectoryStore,
    episode_id_for,
)
from storage.commits import CommitEngine
from storage.schemas import OBSERVATION_CAP_CHARS, STEPS, TABLES, TableSpec

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = Path(__file__).resolve().parent


def assert_consistent(store: TrajectoryStore) -> tuple[int, int]:
    """Readers see whole shards only: unique ids, every step's episode visible, counts agree."""
    episodes = store.read_episodes(include_quarantined=True)
    steps = store.read_steps()
    ids = episodes["episode_id"].to_pylist()
    assert len(ids) == len(set(ids)), "an episode is visible twice"
    expected_steps = dict(zip(ids, episodes["n_steps"].to_pylist(), strict=True))
    found_steps = Counter(steps["episode_id"].to_pylist())
    assert set(found_steps) <= set(expected_steps), "steps of an uncommitted episode are visible"
    for episode_id, n_steps in expected_steps.items():
        assert found_steps.get(episode_id, 0) == n_steps, f"episode {episode_id} is incomplete"
    pairs = list(zip(steps["episode_id"].to_pylist(), steps["step"].to_pylist(), strict=True))
    assert len(pairs) == len(set(pairs)), "a step is visible twice"
    return len(ids), len(pairs)


def raw_rows(root: Path) -> tuple[int, int]:
    """Rows of episodes and steps as any Delta reader sees them (deltalake, no rollyard filter)."""
    from deltalake import DeltaTable

    return tuple(  # type: ignore[return-value]
        DeltaTable(str(root / name)).to_pyarrow_table().num_rows for name in ("episodes", "steps")
    )


# ---- round trip ---------------------------------------------------------------------------------

text = st.text(max_size=20)
floats = st.floats(allow_nan=False, allow_infinity=False, width=64)
episode_fields = st.fixed_dictionaries(
    {
        "task_id": st.text(min_size=1, max_size=12),
        "task_version": text,
        "policy_version": text,
        "status": st.sampled_from(["ok", "infra_error", "timeout", "verifier_error"]),
        "reward": st.none() | floats,
        "partial_credit": st.none() | st.floats(0, 1),
        "passed": st.none() | st.booleans(),
        "flags": st.lists(text, max_size=3),
        "terminated": st.booleans(),
        "truncated": st.booleans(),
        "worker": st.none() | text,
        "wall_s": st.none() | st.floats(0, 1e6),
    }
)
step_fields = st.fixed_dictionaries(
    {
        "action_kind": st.sampled_from(["run", "read", "edit", "submit"]),
        "action_text": st.text(max_size=40),
        "observation": st.none() | st.text(max_size=60),
        "exit_code": st.none() | st.integers(-255, 255),
        "duration_s": st.none() | st.floats(0, 100),
        "token_ids": st.none() | st.lists(st.integers(0, 2**31 - 1), max_size=5),
    }
)


@settings(
    max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    episodes=st.lists(
        st.tuples(episode_fields, st.lists(step_fields, max_size=4)), min_size=1, max_size=5
    ),
    run_id=st.text(min_size=1, max_size=10),
    iteration=st.integers(0, 2**40),
)
def test_round_trip_returns_what_was_committed(
    tmp_path: Path,
    episodes: list[tuple[dict[str, Any], list[dict[str, Any]]]],
    run_id: str,
    iteration: int,
) -> None:
    store = TrajectoryStore(tmp_path / uuid.uuid4().hex)
    episode_rows, step_rows = [], []
    for index, (fields, steps) in enumerate(episodes):
        episode_id = episode_id_for(run_id, iteration, fields["task_id"], 0, index)
        episode_rows.append(
            {
                **fields,
                "episode_id": episode_id,
                "run_id": run_id,
                "iteration": iteration,
                "sample_index": index,
                "snapshot_digest": "d",
                "sandbox_backend": "bwrap",
                "n_steps": len(steps),
            }
        )
        step_rows += [{**s, "episode_id": episode_id, "step": k} for k, s in enumerate(steps)]

    result = store.commit_iteration_shard(
        run_id, iteration, 3, episodes=episode_rows, steps=step_rows
    )
    assert result.committed

    read = {row["episode_id"]: row for row in store.read_episodes(run_id, iteration).to_pylist()}
    assert len(read) == len(episode_rows)
    for row in episode_rows:
        got = read[row["episode_id"]]
        assert got["shard"] == 3 and got["commit_id"] == result.commit_id
        for name, value in row.items():
            assert got[name] == value, name
    got_steps = store.read_steps(run_id, iteration).to_pylist()
    expected = sorted(step_rows, key=lambda s: (s["episode_id"], s["step"]))
    assert len(got_steps) == len(expected)
    for got, row in zip(got_steps, expected, strict=True):
        for name, value in row.items():
            assert got[name] == value, name
        if row["observation"] is not None:
            assert got["observation_chars"] == len(row["observation"])


def test_typed_records_and_observation_cap(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    episode_id = episode_id_for("run", 0, "t", 0, 0)
    episode = EpisodeRecord(
        episode_id=episode_id,
        run_id="run",
        iteration=0,
        task_id="t",
        task_version="v1",
        policy_version="p0",
        snapshot_digest="d",
        sandbox_backend="bwrap",
        status="ok",
        reward=1.0,
        flags=("a",),
        n_steps=1,
    )
    long_output = "x" * (OBSERVATION_CAP_CHARS + 100)
    step = StepRecord(
        episode_id=episode_id,
        step=0,
        action_kind="run",
        action_text="cat big.log",
        observation=long_output,
        token_ids=(1, 2),
        logprobs=(-0.5, -0.25),
    )
    store.commit_iteration_shard("run", 0, 0, episodes=[episode], steps=[step])
    (row,) = store.read_steps().to_pylist()
    assert len(row["observation"]) == OBSERVATION_CAP_CHARS
    assert row["observation_chars"] == len(long_output)
    assert row["token_ids"] == [1, 2] and row["logprobs"] == [-0.5, -0.25]
    assert store.read_episodes()["flags"].to_pylist() == [["a"]]


# ---- replay -------------------------------------------------------------------------------------


def test_replaying_a_shard_writes_nothing_twice(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    episodes, steps = make_shard("run", 1, 0)
    first = store.commit_iteration_shard("run", 1, 0, episodes=episodes, steps=steps)
    assert first.committed
    # A rescheduled task may produce different samples: the first commit still wins.
    other_episodes, other_steps = make_shard("run", 1, 99)
    for _ in range(2):
        again = store.commit_iteration_shard(
            "run", 1, 0, episodes=other_episodes, steps=other_steps
        )
        assert not again.committed
    assert store.is_committed("run", 1, 0) and not store.is_committed("run", 1, 1)
    assert store.committed_shards("run", 1) == [0]
    n_episodes, n_steps = assert_consistent(store)
    assert n_episodes == len(episodes) and n_steps == len(steps)
    assert set(store.read_episodes()["episode_id"].to_pylist()) == {
        e["episode_id"] for e in episodes
    }


def test_invalid_shards_are_refused_before_anything_is_written(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    episodes, steps = make_shard("run", 0, 0)
    cases: list[tuple[list[dict[str, Any]], list[dict[str, Any]], str]] = [
        ([{**episodes[0], "colour": "red"}], [], "'colour'"),
        ([{**episodes[0], "run_id": "other"}], [], "run_id='other'"),
        ([{k: v for k, v in episodes[0].items() if k != "task_id"}], [], "'task_id'"),
        ([episodes[0], episodes[0]], [], "appears more than once"),
        ([episodes[0]], [{**steps[0], "episode_id": "ghost"}], "'ghost'"),
        ([{**episodes[0], "reward": "high"}], [], "'reward'"),
        ([], [], "no episodes"),
    ]
    for bad_episodes, bad_steps, message in cases:
        with pytest.raises(RecordError, match=message):
            store.commit_iteration_shard("run", 0, 0, episodes=bad_episodes, steps=bad_steps)
    assert not store.is_committed("run", 0, 0)
    assert store.read_episodes().num_rows == 0


# ---- killed writers -----------------------------------------------------------------------------

WRITER = textwrap.dedent(
    """
    import os, signal, sys
    from shard_data import make_shard
    from storage import TrajectoryStore
    import storage.commits

    root, first, last, kill_after_steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    if kill_after_steps == "1":
        # Die the hard way right after the steps commit, before the episodes commit point.
        original = storage.commits.CommitEngine.commit_files
        def commit_then_die(self, table, spec, actions, **kwargs):
            original(self, table, spec, actions, **kwargs)
            if spec.name == "steps":
                os.kill(os.getpid(), signal.SIGKILL)
        storage.commits.CommitEngine.commit_files = commit_then_die
    store = TrajectoryStore(root)
    for shard in range(first, last):
        episodes, steps = make_shard("run", 0, shard, n_episodes=20, max_steps=20)
        store.commit_iteration_shard("run", 0, shard, episodes=episodes, steps=steps)
        print(shard, flush=True)
    """
)


def start_writer(
    root: Path, first: int, last: int, *, kill_after_steps: bool = False
) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])}
    return subprocess.Popen(
        [
            sys.executable,
            "-c",
            WRITER,
            str(root),
            str(first),
            str(last),
            "1" if kill_after_steps else "0",
        ],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_writer_killed_between_steps_and_episodes_is_completed_by_the_replay(
    tmp_path: Path,
) -> None:
    writer = start_writer(tmp_path, 0, 1, kill_after_steps=True)
    writer.communicate(timeout=60)
    assert writer.returncode == -signal.SIGKILL
    store = TrajectoryStore(tmp_path)
    # The steps commit landed, but without its episodes it must stay invisible.
    assert Path(tmp_path, "steps", "_delta_log").is_dir()
    assert not store.is_committed("run", 0, 0)
    assert assert_consistent(store) == (0, 0)
    with store.connect() as con:
        assert con.sql("SELECT count(*) FROM steps").fetchall() == [(0,)]
    # The killed writer owns the shard (its steps commit landed): the replay completes it with
    # the killed writer's own episodes file and writes nothing of its own.
    episodes, steps = make_shard("run", 0, 0, n_episodes=20, max_steps=20)
    result = store.commit_iteration_shard("run", 0, 0, episodes=episodes, steps=steps)
    assert not result.committed and result.commit_id is None
    assert store.is_committed("run", 0, 0)
    assert assert_consistent(store) == (len(episodes), len(steps))
    assert raw_rows(tmp_path) == (len(episodes), len(steps))
    assert not store.commit_iteration_shard("run", 0, 0, episodes=episodes, steps=steps).committed


def test_a_stopped_commit_of_a_shard_without_steps_is_completed_by_its_replay(
    tmp_path: Path,
) -> None:
    class Crash(Exception):
        pass

    original = CommitEngine.commit_files

    def commit_then_crash(
        self: CommitEngine, table: Any, spec: TableSpec, actions: Any, **kwargs: Any
    ) -> None:
        original(self, table, spec, actions, **kwargs)
        if spec.name == "steps":
            raise Crash

    store = TrajectoryStore(tmp_path)
    made, _ = make_shard("run", 0, 0, n_episodes=3, max_steps=3)
    episodes = [{**episode, "n_steps": 0} for episode in made]  # episodes that never acted
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CommitEngine, "commit_files", commit_then_crash)
        with pytest.raises(Crash):  # the steps commit only claims the shard: no file
            store.commit_iteration_shard("run", 0, 0, episodes=episodes)
    assert not store.is_committed("run", 0, 0)
    # The replay finds the owner's commit id in the steps log and commits its episodes file.
    assert not store.commit_iteration_shard("run", 0, 0, episodes=episodes).committed
    assert store.is_committed("run", 0, 0)
    assert raw_rows(tmp_path) == assert_consistent(store) == (3, 0)


def test_writer_killed_at_random_points_leaves_readers_consistent(tmp_path: Path) -> None:
    committed_before = 0
    for delay_s in (0.0, 0.013, 0.029, 0.047):
        writer = start_writer(tmp_path, committed_before, committed_before + 200)
        assert writer.stdout is not None
        first_line = writer.stdout.readline()  # wait until it is committing in a loop
        time.sleep(delay_s)
        writer.send_signal(signal.SIGKILL)
        output, _ = writer.communicate(timeout=30)
        output = first_line + output
        store = TrajectoryStore(tmp_path)
        n_episodes, _ = assert_consistent(store)
        # Every shard the writer reported is visible, plus at most the one it was committing.
        reported = len(output.split())
        assert n_episodes in (
            20 * (committed_before + reported),
            20 * (committed_before + reported + 1),
        )
        committed_before = n_episodes // 20
    assert committed_before >= 4
    # Resuming from zero (a restarted flow) adds each missing shard once.
    finisher = start_writer(tmp_path, 0, committed_before + 2)
    finisher.communicate(timeout=60)
    n_episodes, _ = assert_consistent(TrajectoryStore(tmp_path))
    assert n_episodes == 20 * (committed_before + 2)


# ---- concurrent writers -------------------------------------------------------------------------


@pytest.mark.parametrize("overlap", [False, True], ids=["distinct-shards", "same-shards"])
def test_two_concurrent_writers(tmp_path: Path, overlap: bool) -> None:
    ranges = [(0, 8), (0, 8)] if overlap else [(0, 8), (8, 16)]
    writers = [start_writer(tmp_path, first, last) for first, last in ranges]
    for writer in writers:
        _, _ = writer.communicate(timeout=120)
        assert writer.returncode == 0
    store = TrajectoryStore(tmp_path)
    n_episodes, n_steps = assert_consistent(store)
    n_shards = 8 if overlap else 16
    assert store.committed_shards("run", 0) == list(range(n_shards))
    assert n_episodes == 20 * n_shards
    expected_steps = sum(
        len(make_shard("run", 0, s, n_episodes=20, max_steps=20)[1]) for s in range(n_shards)
    )
    assert n_steps == expected_steps


def test_arrow_and_parquet_inputs(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    store = TrajectoryStore(tmp_path / "store")
    episodes, steps = make_shard("run", 2, 0)
    pq.write_table(pa.Table.from_pylist(steps), tmp_path / "steps.parquet")
    result = store.commit_iteration_shard(
        "run", 2, 0, episodes=pa.Table.from_pylist(episodes), steps=tmp_path / "steps.parquet"
    )
    assert result.committed and result.n_steps == len(steps)
    assert assert_consistent(store) == (len(episodes), len(steps))
    assert math.isclose(
        sum(r or 0 for r in store.read_episodes()["reward"].to_pylist()),
        sum(e["reward"] or 0 for e in episodes),
    )


# ---- nested records, the written layout, vacuum -------------------------------------------------


def test_episodes_with_nested_steps(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    episodes, steps = make_shard("run", 0, 0, n_episodes=6, max_steps=4)
    nested = [
        {**e, "steps": [s for s in steps if s["episode_id"] == e["episode_id"]]} for e in episodes
    ]
    # A nested step may leave out its episode id.
    nested[0]["steps"] = [
        {k: v for k, v in s.items() if k != "episode_id"} for s in nested[0]["steps"]
    ]
    result = store.commit_iteration_shard("run", 0, 0, episodes=nested)
    assert result.committed and result.n_steps == len(steps)
    assert assert_consistent(store) == (len(episodes), len(steps))
    expected = sorted((s["episode_id"], s["step"], s["action_text"]) for s in steps)
    got = store.read_steps().select(["episode_id", "step", "action_text"]).to_pylist()
    assert [tuple(r.values()) for r in got] == expected

    owner = next(e for e in nested if e["steps"])
    wrong = [{**e, "steps": [{**s, "episode_id": "other"} for s in e["steps"]]} for e in [owner]]
    with pytest.raises(RecordError, match="nested under episode_id"):
        store.commit_iteration_shard("run", 0, 1, episodes=wrong)
    with pytest.raises(RecordError, match="one way"):
        store.commit_iteration_shard("run", 0, 1, episodes=nested, steps=steps)
    assert not store.is_committed("run", 0, 1)


def test_tables_are_plain_delta_tables(tmp_path: Path) -> None:
    """Other Delta readers see what the store committed: files, partition values, statistics."""
    from deltalake import DeltaTable

    run_id = "r/ü %x:=?"  # characters that need escaping in paths and in the log
    store = TrajectoryStore(tmp_path)
    episodes, steps = make_shard(run_id, 7, 2, n_episodes=5, max_steps=3)
    result = store.commit_iteration_shard(run_id, 7, 2, episodes=episodes, steps=steps)
    for name, rows in (("episodes", episodes), ("steps", steps)):
        table = DeltaTable(str(tmp_path / name))
        data = table.to_pyarrow_table()
        assert data.num_rows == len(rows)
        assert set(data["run_id"].to_pylist()) == {run_id}
        assert set(data["iteration"].to_pylist()) == {7}
        actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        assert len(actions) == 1
        (action,) = actions
        assert action["num_records"] == len(rows)
        assert action["min.commit_id"] == action["max.commit_id"] == result.commit_id
        assert action["min.shard"] == action["max.shard"] == 2
        assert table.metadata().configuration["delta.dataSkippingStatsColumns"] == "shard,commit_id"


def test_small_tables_keep_statistics_on_every_column(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from deltalake import DeltaTable

    store = TrajectoryStore(tmp_path)
    assert store.metrics.record("run", 3, {"loss": 0.5, "kl": None})
    (action,) = pa.table(
        DeltaTable(str(tmp_path / "metrics")).get_add_actions(flatten=True)
    ).to_pylist()
    assert action["num_records"] == 2
    assert action["min.iteration"] == action["max.iteration"] == 3
    assert action["min.name"] == "kl" and action["max.name"] == "loss"
    assert action["null_count.value"] == 1
    recorded = store.query("SELECT max(recorded_at) AS t FROM metrics")["t"][0].as_py()
    assert isinstance(action["min.recorded_at"], datetime)
    # Delta keeps timestamps to the millisecond.
    assert abs(action["min.recorded_at"].replace(tzinfo=UTC) - recorded).total_seconds() < 0.001


def crash_after_steps(store: TrajectoryStore, run_id: str, iteration: int, shard: int) -> None:
    """Commit a shard's steps, then fail before its episodes commit (a crashed writer)."""

    class Crash(Exception):
        pass

    original = CommitEngine.commit_files

    def commit_then_crash(
        self: CommitEngine, table: Any, spec: TableSpec, actions: Any, **kwargs: Any
    ) -> None:
        original(self, table, spec, actions, **kwargs)
        if spec.name == "steps":
            raise Crash

    episodes, steps = make_shard(run_id, iteration, shard, n_episodes=5, max_steps=3)
    steps = steps or [
        {
            "episode_id": episodes[0]["episode_id"],
            "step": 0,
            "action_kind": "run",
            "action_text": "x",
        }
    ]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(CommitEngine, "commit_files", commit_then_crash)
        with pytest.raises(Crash):
            store.commit_iteration_shard(run_id, iteration, shard, episodes=episodes, steps=steps)


def legacy_lost_steps(store: TrajectoryStore, run_id: str, iteration: int, shard: int) -> None:
    """Commit a shard's steps without its transaction id and never its episodes: what a commit
    that lost, or was abandoned, left in the steps table of a store written by older versions."""
    episodes, steps = make_shard(run_id, iteration, shard, n_episodes=3, max_steps=3)
    prepared = store.commits.prepare_shard(run_id, iteration, shard, episodes, steps)
    table = store.commits.open(STEPS, create=True)
    assert table is not None
    added = store.commits.write_file(STEPS, prepared.steps, prepared.commit_id, prepared.partition)
    store.commits.commit_files(table, STEPS, [added])


def test_vacuum_completes_stopped_commits_and_removes_legacy_lost_ones(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    crash_after_steps(store, "run", 0, 1)  # shard 1: its writer stopped halfway
    legacy_lost_steps(store, "run", 0, 0)  # shard 0: an older layout's lost commit...
    episodes, steps = make_shard("run", 0, 0)
    assert store.commit_iteration_shard("run", 0, 0, episodes=episodes, steps=steps).committed
    legacy_lost_steps(store, "run", 0, 2)  # shard 2: ... and one never committed
    visible = assert_consistent(store)
    assert raw_rows(tmp_path)[1] > visible[1]  # other engines see the legacy orphans

    first = store.vacuum()
    assert first.completed_shards == (("run", 0, 1),)
    assert len(first.removed_files) == 1 and first.removed_rows > 0
    completed = assert_consistent(store)
    assert completed[0] == visible[0] + 5  # crash_after_steps commits 5 episodes
    assert store.vacuum().removed_files == () and store.vacuum().completed_shards == ()
    second = store.vacuum(uncommitted_older_than=timedelta(0), retention_hours=0)
    assert len(second.removed_files) == 1
    assert raw_rows(tmp_path) == completed  # every Delta reader now sees what rollyard does
    # Removed files are deleted from disk.
    assert len(second.deleted_files) >= 2
    assert assert_consistent(store) == completed
    # The abandoned shard can still be committed later.
    episodes, steps = make_shard("run", 0, 2)
    assert store.commit_iteration_shard("run", 0, 2, episodes=episodes, steps=steps).committed
    assert raw_rows(tmp_path) == assert_consistent(store)


@pytest.mark.parametrize(
    "run_id",
    ["plain-run", "r/ü %41 it's=x", "__HIVE_DEFAULT_PARTITION__", "long-" + "é" * 60],
    ids=["plain", "escaped", "hive-null-name", "cut-directory-name"],
)
def test_queries_see_the_committed_rows_whatever_the_run_id(tmp_path: Path, run_id: str) -> None:
    """DuckDB reads the big tables' Parquet files itself where their directory names give the
    partition values back exactly, and through Arrow datasets elsewhere; both show the same."""
    store = TrajectoryStore(tmp_path)
    crash_after_steps(store, run_id, 5, 1)  # orphaned steps stay hidden on either path
    episodes, steps = make_shard(run_id, 5, 0, n_episodes=6, max_steps=4)
    store.commit_iteration_shard(run_id, 5, 0, episodes=episodes, steps=steps)
    with store.connect() as con:
        native = {
            name: "read_parquet" in sql
            for name, sql in con.sql("SELECT view_name, sql FROM duckdb_views()").fetchall()
        }
        for name, spec_rows in (("episodes", episodes), ("steps", steps)):
            columns = [c[0] for c in con.sql(f"DESCRIBE {name}").fetchall()]
            assert columns == TABLES[name].schema.names
            got = con.sql(f"SELECT run_id, iteration, count(*) FROM {name} GROUP BY ALL").fetchall()
            assert got == [(run_id, 5, len(spec_rows))]
        total = con.sql("SELECT sum(duration_s) FROM steps").fetchall()[0][0]
    assert math.isclose(total, sum(s["duration_s"] for s in steps))
    assert native.get("steps", False) == (run_id in ("plain-run", "r/ü %41 it's=x"))


def test_a_partition_directory_removed_after_a_write_is_made_again(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    episodes, steps = make_shard("run", 9, 0)
    # As if an earlier write had made these directories and they were removed since.
    store.commits._directories.update(
        {("steps", "run_id=run/iteration=9/"), ("episodes", "run_id=run/iteration=9/")}
    )
    assert store.commit_iteration_shard("run", 9, 0, episodes=episodes, steps=steps).committed
    assert assert_consistent(store) == (len(episodes), len(steps))
