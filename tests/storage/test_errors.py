"""Corrupt, foreign and mismatched files give one clear error naming the file."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import write_deltalake
from shard_data import make_shard

import storage
from rollyard.errors import (
    EXIT_DAMAGED,
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    RollyardError,
    exit_code_for,
)
from storage import (
    CheckpointNotFoundError,
    CommitError,
    CorruptFileError,
    GateSettingsError,
    QueryError,
    RecordError,
    SchemaMismatchError,
    StoreError,
    StoreNotFoundError,
    TrajectoryStore,
)


def committed_store(root: Path) -> TrajectoryStore:
    store = TrajectoryStore(root)
    episodes, steps = make_shard("run", 0, 0)
    store.commit_iteration_shard("run", 0, 0, episodes=episodes, steps=steps)
    return store


def test_corrupt_data_file_is_named_on_read_and_query(tmp_path: Path) -> None:
    store = committed_store(tmp_path)
    (data_file,) = Path(tmp_path, "episodes").rglob("*.parquet")
    data_file.write_bytes(b"PAR1 this is not parquet PAR1")
    with pytest.raises(CorruptFileError, match=data_file.name) as read_error:
        store.read_episodes()
    assert "episodes" in str(read_error.value)
    with pytest.raises(CorruptFileError, match=data_file.name):
        store.query("SELECT avg(reward) FROM episodes")
    # Other tables stay readable.
    assert store.read_steps().num_rows > 0


def test_foreign_parquet_input_is_refused_naming_the_file(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "store")
    foreign = tmp_path / "peer_rollouts.parquet"
    pq.write_table(pa.table({"prompt": ["hi"], "completion": ["there"]}), foreign)
    with pytest.raises(SchemaMismatchError, match=r"peer_rollouts\.parquet.*'prompt'"):
        store.commit_iteration_shard("run", 0, 0, episodes=foreign)
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"\x00" * 64)
    with pytest.raises(CorruptFileError, match=r"garbage\.parquet"):
        store.commit_iteration_shard("run", 0, 0, episodes=garbage)
    episodes, _ = make_shard("run", 0, 0)
    wrong_type = tmp_path / "wrong_type.parquet"
    table = pa.Table.from_pylist(episodes).set_column(
        0, "episode_id", pa.array(range(len(episodes)), pa.int64())
    )
    table = table.set_column(
        table.schema.get_field_index("n_steps"), "n_steps", pa.array(["many"] * len(episodes))
    )
    pq.write_table(table, wrong_type)
    with pytest.raises(SchemaMismatchError, match=r"wrong_type\.parquet.*'n_steps'"):
        store.commit_iteration_shard("run", 0, 0, episodes=wrong_type)
    assert not store.is_committed("run", 0, 0)


def test_table_with_another_schema_is_refused_naming_table_and_field(tmp_path: Path) -> None:
    write_deltalake(str(tmp_path / "episodes"), pa.table({"episode_id": ["e"], "reward": ["high"]}))
    store = TrajectoryStore(tmp_path)
    episodes, _ = make_shard("run", 0, 0)
    with pytest.raises(SchemaMismatchError, match=r"episodes: field 'run_id' is missing"):
        store.commit_iteration_shard("run", 0, 0, episodes=episodes)
    with pytest.raises(SchemaMismatchError, match="episodes"):
        store.read_episodes()


def test_plain_parquet_directory_in_place_of_a_table_is_refused(tmp_path: Path) -> None:
    (tmp_path / "steps").mkdir()
    pq.write_table(pa.table({"x": [1]}), tmp_path / "steps" / "part-0.parquet")
    store = TrajectoryStore(tmp_path)
    with pytest.raises(SchemaMismatchError, match=r"steps: holds files but no Delta log"):
        store.read_steps()


def test_missing_store_and_bad_sql(tmp_path: Path) -> None:
    with pytest.raises(StoreNotFoundError, match="nowhere"):
        TrajectoryStore(tmp_path / "nowhere", create=False)
    store = committed_store(tmp_path)
    with pytest.raises(QueryError, match=r"SQL error.*episdes"):
        store.query("SELECT * FROM episdes")
    with pytest.raises(QueryError, match="no named query 'nope'"):
        store.named("nope")


def test_errors_and_store_survive_pickling(tmp_path: Path) -> None:
    error = CorruptFileError("f.parquet: broken")
    copy = pickle.loads(pickle.dumps(error))
    assert isinstance(copy, StoreError) and str(copy) == "f.parquet: broken"
    store = committed_store(tmp_path)
    clone = pickle.loads(pickle.dumps(store))
    assert clone.root == store.root and clone.read_episodes().num_rows == 4


@pytest.mark.parametrize(
    ("error_class", "exit_code"),
    [
        (StoreError, EXIT_FAILED),
        (CommitError, EXIT_FAILED),
        (StoreNotFoundError, EXIT_UNAVAILABLE),
        (CheckpointNotFoundError, EXIT_UNAVAILABLE),
        (SchemaMismatchError, EXIT_DAMAGED),
        (CorruptFileError, EXIT_DAMAGED),
        (RecordError, EXIT_USAGE),
        (QueryError, EXIT_USAGE),
        (GateSettingsError, EXIT_USAGE),
    ],
)
def test_every_store_error_is_a_rollyard_error_with_its_exit_code(
    error_class: type[StoreError], exit_code: int
) -> None:
    error = error_class("what went wrong")
    assert isinstance(error, RollyardError)
    assert exit_code_for(error) == exit_code
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is error_class and str(copy) == "what went wrong"


def test_importing_the_package_and_its_errors_loads_no_table_library() -> None:
    code = (
        "import sys, storage, storage.errors\n"
        "from storage import StoreError\n"
        "print(sorted(m for m in ('deltalake', 'pyarrow', 'duckdb') if m in sys.modules))"
    )
    repo_root = str(Path(__file__).resolve().parents[2])
    loaded = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": repo_root},
    ).stdout
    assert loaded.strip() == "[]"
    # Every exported name still resolves, from the module that defines it.
    assert all(getattr(storage, name) is not None for name in storage.__all__)
