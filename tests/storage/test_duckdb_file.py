"""`rollyard store duckdb-file`: a DuckDB database file any DuckDB client opens shows what
rollyard's reader shows; where DuckDB's delta extension loads, queries read through delta_scan."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from shard_data import make_shard
from test_commits import crash_after_steps

from flows.cli import main
from storage import TrajectoryStore
from storage.queries import load_delta_extension

COUNTS = (
    "SELECT (SELECT count(*) FROM episodes), (SELECT count(*) FROM steps), "
    "(SELECT count(*) FROM metrics), (SELECT count(*) FROM iteration_status)"
)


def filled_store(
    root: Path, run_ids: tuple[str, ...] = ("plain-run", "long-" + "é" * 60)
) -> TrajectoryStore:
    store = TrajectoryStore(root)
    for run_id in run_ids:  # the second one's directory names are cut
        for shard in range(2):
            episodes, steps = make_shard(run_id, 0, shard, n_episodes=4, max_steps=4)
            store.commit_iteration_shard(run_id, 0, shard, episodes=episodes, steps=steps)
    crash_after_steps(store, "plain-run", 0, 7)  # pending: its steps stay out of every view
    store.metrics.record("plain-run", 0, {"loss": 0.5})
    return store


def test_the_database_file_shows_what_rollyard_shows(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = filled_store(tmp_path / "store")
    expected = tuple(store.query(COUNTS).to_pylist()[0].values())
    out = tmp_path / "store.duckdb"
    argv = [
        "store",
        "duckdb-file",
        str(out),
        "--store",
        str(tmp_path / "store"),
        "--format",
        "json",
    ]
    assert main(argv) == 0
    written = json.loads(capsys.readouterr().out)
    assert written["out"] == str(out) and "episodes" in written["copied"]
    with duckdb.connect(str(out), read_only=True) as con:  # a plain client, no rollyard
        assert con.sql(COUNTS).fetchall() == [expected]
        views = {name for (name,) in con.sql("SELECT view_name FROM duckdb_views()").fetchall()}
        assert {"training_episodes", "gate_verdicts", "metrics"} <= views
        # A cut partition directory name: DuckDB's Parquet reader would see another run id, so
        # those tables are copied into the file instead.
        assert "episodes" not in views
    assert expected[0] == 16 and expected[1] > 0
    assert not list(tmp_path.glob(".store.duckdb.*"))  # no partial file left behind
    # Without cut directory names every table with data is a view over its files in place
    # (absent tables are empty tables in the file).
    plain = filled_store(tmp_path / "plain", run_ids=("plain-run",))
    copied = plain.write_duckdb_file(tmp_path / "plain.duckdb")
    assert not {"episodes", "steps", "metrics"} & set(copied)
    # Written again, it shows the newer data.
    episodes, steps = make_shard("plain-run", 1, 0, n_episodes=3, max_steps=2)
    store.commit_iteration_shard("plain-run", 1, 0, episodes=episodes, steps=steps)
    store.write_duckdb_file(out)
    with duckdb.connect(str(out), read_only=True) as con:
        assert con.sql("SELECT count(*) FROM episodes").fetchall() == [(19,)]


def test_bad_output_paths_are_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    filled_store(tmp_path)
    for out, message in (
        (tmp_path / "absent" / "x.duckdb", "does not exist"),
        (tmp_path, "is a directory"),
    ):
        assert main(["store", "duckdb-file", str(out), "--store", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert message in err and len(err.strip().splitlines()) == 1


def test_queries_read_through_delta_scan_where_the_extension_loads(tmp_path: Path) -> None:
    with duckdb.connect() as con:
        if not load_delta_extension(con):
            pytest.skip("DuckDB's delta extension is not installed (it needs a download)")
    store = filled_store(tmp_path)
    with store.connect() as con:
        sql = dict(con.sql("SELECT view_name, sql FROM duckdb_views()").fetchall())
    assert "delta_scan" in sql["episodes"] and "delta_scan" not in sql["steps"]  # pending steps
    store.vacuum()  # completes the pending shard
    with store.connect() as con:
        sql = dict(con.sql("SELECT view_name, sql FROM duckdb_views()").fetchall())
        assert "delta_scan" in sql["steps"]
    assert store.query(COUNTS).to_pylist()[0]["count_star()"] == 20
