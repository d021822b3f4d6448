"""A store written by an older schema version (fixtures/store-v3: episodes and steps committed by
schema v3, before the episodes' `rewards` column) still reads, and gains the column at its first
write without a file rewritten."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from storage import SCHEMA_VERSION, TrajectoryStore

OLD_STORE = Path(__file__).parent / "fixtures" / "store-v3"
OLD_EPISODES = {"e0": 0.0, "e1": 1.0, "e2": 0.0}


@pytest.fixture
def old_store(tmp_path: Path) -> TrajectoryStore:
    shutil.copytree(OLD_STORE, tmp_path / "store")
    return TrajectoryStore(tmp_path / "store")


def _delta_columns(store: TrajectoryStore) -> list[str]:
    return DeltaTable(store.table_uri("episodes")).schema().to_arrow().names  # type: ignore[no-any-return]


def test_the_fixture_is_an_older_schema() -> None:
    description = DeltaTable(str(OLD_STORE / "episodes")).metadata().description
    assert description == "rollyard episodes schema v3" and SCHEMA_VERSION > 3
    assert "rewards" not in DeltaTable(str(OLD_STORE / "episodes")).schema().to_arrow().names


def test_old_store_reads_with_the_new_column_null_and_stays_as_it_was(
    old_store: TrajectoryStore, tmp_path: Path
) -> None:
    log = sorted(p.name for p in Path(old_store.table_uri("episodes"), "_delta_log").iterdir())
    rows = old_store.query("SELECT episode_id, reward, rewards FROM episodes ORDER BY 1")
    assert rows.to_pylist() == [
        {"episode_id": e, "reward": r, "rewards": None} for e, r in OLD_EPISODES.items()
    ]
    arrow = old_store.read_episodes(columns=["episode_id", "rewards"])
    assert arrow.schema.field("rewards").type == pa.map_(pa.string(), pa.float64())
    assert arrow.column("rewards").null_count == 3
    assert old_store.named("named_rewards").num_rows == 0
    assert old_store.query("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 3}]
    database = tmp_path / "old.duckdb"
    old_store.write_duckdb_file(database)
    with duckdb.connect(str(database)) as con:
        assert con.sql("SELECT count(*), count(rewards) FROM episodes").fetchall() == [(3, 0)]
    # Reading wrote nothing: the table is still v3 with its own log.
    assert "rewards" not in _delta_columns(old_store)
    assert (
        sorted(p.name for p in Path(old_store.table_uri("episodes"), "_delta_log").iterdir()) == log
    )


def test_first_write_adds_the_column_without_rewriting_a_file(old_store: TrajectoryStore) -> None:
    old_files = set(DeltaTable(old_store.table_uri("episodes")).file_uris())
    episode = {
        "episode_id": "n0", "run_id": "new", "iteration": 0, "task_id": "t", "task_version": "1",
        "policy_version": "p", "snapshot_digest": "d", "sandbox_backend": "bwrap",
        "status": "ok", "reward": 1.0, "rewards": {"reward": 1.0, "style": 0.25},
    }  # fmt: skip
    assert old_store.commit_iteration_shard("new", 0, 0, episodes=[episode]).committed
    assert "rewards" in _delta_columns(old_store)
    assert old_files <= set(DeltaTable(old_store.table_uri("episodes")).file_uris())
    reopened = TrajectoryStore(old_store.root)
    rows = reopened.query(
        "SELECT episode_id, rewards['style'] AS style, rewards FROM episodes ORDER BY 1"
    ).to_pylist()
    assert [(r["episode_id"], r["style"]) for r in rows] == [
        ("e0", None),
        ("e1", None),
        ("e2", None),
        ("n0", 0.25),
    ]
    assert dict(rows[-1]["rewards"]) == {"reward": 1.0, "style": 0.25}
    by_id = {
        r["episode_id"]: r["rewards"]
        for r in reopened.read_episodes(columns=["episode_id", "rewards"]).to_pylist()
    }
    assert by_id["e0"] is None and dict(by_id["n0"]) == {"reward": 1.0, "style": 0.25}
    # Another Delta reader sees the same table.
    delta = DeltaTable(old_store.table_uri("episodes")).to_pyarrow_table(columns=["rewards"])
    assert delta.column("rewards").null_count == 3
