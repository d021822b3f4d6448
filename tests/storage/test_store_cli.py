"""`rollyard store vacuum`: stopped shard commits are completed, lost ones leave the steps table;
bad input is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from deltalake import DeltaTable
from shard_data import make_shard
from test_commits import assert_consistent, crash_after_steps, legacy_lost_steps, raw_rows

from flows.cli import main
from storage import TrajectoryStore


def test_vacuum_completes_a_stopped_commit_and_removes_a_lost_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = TrajectoryStore(tmp_path)
    crash_after_steps(store, "run", 0, 1)  # steps committed, episodes not yet
    legacy_lost_steps(store, "run", 0, 0)  # an older layout's commit that lost...
    episodes, steps = make_shard("run", 0, 0, n_episodes=5, max_steps=3)
    store.commit_iteration_shard("run", 0, 0, episodes=episodes, steps=steps)  # ... to this one
    files_before = len(DeltaTable(str(tmp_path / "steps")).file_uris())

    assert main(["store", "vacuum", "--store", str(tmp_path), "--format", "json"]) == 0
    done = json.loads(capsys.readouterr().out)
    assert done == {
        "completed_shards": 1,
        "removed_files": 1,
        "removed_rows": done["removed_rows"],
        "deleted_files": 0,
    }
    assert done["removed_rows"] > 0
    assert len(DeltaTable(str(tmp_path / "steps")).file_uris()) == files_before - 1
    visible = assert_consistent(TrajectoryStore(tmp_path))
    assert raw_rows(tmp_path) == visible and visible[0] == 5 + len(episodes)
    # Nothing left to do the second time; the default format is a table for people.
    assert main(["store", "vacuum", "--store", str(tmp_path)]) == 0
    header, _, row, count = capsys.readouterr().out.splitlines()
    assert header.split() == ["completed_shards", "removed_files", "removed_rows", "deleted_files"]
    assert row.split() == ["0", "0", "0", "0"] and count == "(1 row)"


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--store", "{absent}"], 3, "no store here"),
        (["--retention-hours", "-1"], 2, "must be at least 0"),
        (["--uncommitted-older-than", "soon"], 2, "expected a number"),
    ],
)
def test_vacuum_bad_input_is_one_line(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    argv: list[str],
    code: int,
    message: str,
) -> None:
    argv = [a.format(absent=tmp_path / "absent") for a in argv]
    if code == 2:
        with pytest.raises(SystemExit) as exit_info:
            main(["store", "vacuum", "--store", str(tmp_path), *argv])
        assert exit_info.value.code == code
    else:
        assert main(["store", "vacuum", *argv]) == code
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "absent").exists()
