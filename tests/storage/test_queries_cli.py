"""Named queries over a populated store and the `rollyard query` command."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from shard_data import make_shard

from flows.cli import main
from storage import NAMED_QUERIES, TrajectoryStore


@pytest.fixture
def store(tmp_path: Path) -> TrajectoryStore:
    store = TrajectoryStore(tmp_path / "store")
    for iteration in range(3):
        for shard in range(2):
            episodes, steps = make_shard("run", iteration, shard)
            store.commit_iteration_shard("run", iteration, shard, episodes=episodes, steps=steps)
    return store


def test_every_named_query_runs(store: TrajectoryStore) -> None:
    for name in NAMED_QUERIES:
        store.named(name)  # none may fail on a real store


def test_reward_curve_matches_a_direct_computation(store: TrajectoryStore) -> None:
    curve = {row["iteration"]: row for row in store.named("reward_curve").to_pylist()}
    assert sorted(curve) == [0, 1, 2]
    for iteration, row in curve.items():
        episodes = make_shard("run", iteration, 0)[0] + make_shard("run", iteration, 1)[0]
        rewards = [e["reward"] for e in episodes if e["reward"] is not None]
        assert row["episodes"] == 8
        assert row["mean_reward"] == pytest.approx(sum(rewards) / len(rewards))
        assert row["pass_rate"] == pytest.approx(sum(bool(e["passed"]) for e in episodes) / 8)
    taxonomy = store.named("failure_taxonomy").to_pylist()
    for iteration in range(3):
        shares = [r["share"] for r in taxonomy if r["iteration"] == iteration]
        assert sum(shares) == pytest.approx(1.0)


def test_cli_table_csv_json_and_named(
    store: TrajectoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    sql = "SELECT iteration, count(*) AS n FROM episodes GROUP BY 1 ORDER BY 1"
    assert main(["query", "--store", store.root, sql]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["iteration", "n"]
    assert "(3 rows)" in out

    assert main(["query", "--store", store.root, "--format", "csv", sql]) == 0
    rows = list(csv.DictReader(io.StringIO(capsys.readouterr().out)))
    assert rows == [{"iteration": str(i), "n": "8"} for i in range(3)]

    assert (
        main(["query", "--store", store.root, "--format", "json", "--named", "reward_curve"]) == 0
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["iteration"] for line in lines] == [0, 1, 2]

    assert (
        main(["query", "--store", store.root, "--format", "csv", "SELECT flags FROM episodes"]) == 0
    )
    capsys.readouterr()

    assert main(["query", "--list-named"]) == 0
    listed = capsys.readouterr().out
    assert all(name in listed for name in NAMED_QUERIES)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["SELECT * FROM nope"], "SQL error"),
        (["SELEKT 1"], "SQL error"),
        (["--named", "nope"], "no named query 'nope'"),
        ([], "give either SQL or --named"),
    ],
)
def test_cli_errors_are_one_line(
    store: TrajectoryStore, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code = main(["query", "--store", store.root, *argv])
    err = capsys.readouterr().err
    assert code != 0
    assert len(err.strip().splitlines()) == 1 and message in err
    assert "Traceback" not in err


def test_cli_missing_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["query", "--store", str(tmp_path / "absent"), "SELECT 1"])
    err = capsys.readouterr().err
    # exit 3: something rollyard needs is missing (rollyard.errors)
    assert code == 3 and "absent: no store here" in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "absent").exists()


def test_cli_names_a_corrupt_file(
    store: TrajectoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    data_file = next(Path(store.root, "steps").rglob("*.parquet"))
    data_file.write_bytes(b"garbage")
    code = main(["query", "--store", store.root, "SELECT count(*) FROM steps"])
    err = capsys.readouterr().err
    # exit 4: the store is damaged; the cheap store check names the file before DuckDB reads it
    assert code == 4 and data_file.name in err and len(err.strip().splitlines()) == 1
