"""`rollyard store vacuum`: steps of lost shard commits leave the steps table; bad input is one line."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable
from shard_data import make_shard
from test_commits import assert_consistent, crash_after_steps

from flows.cli import main
from storage import TrajectoryStore


def test_vacuum_removes_the_steps_of_a_lost_commit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = TrajectoryStore(tmp_path)
    crash_after_steps(store, "run", 0, 0)  # steps committed, episodes never: an orphan
    episodes, steps = make_shard("run", 0, 0, n_episodes=5, max_steps=3)
    store.commit_iteration_shard("run", 0, 0, episodes=episodes, steps=steps)  # the replay wins
    files_before = len(DeltaTable(str(tmp_path / "steps")).file_uris())
    before = assert_consistent(store)

    assert main(["store", "vacuum", "--store", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("removed 1 steps file(s)") and "deleted 0 file(s)" in out
    assert len(DeltaTable(str(tmp_path / "steps")).file_uris()) == files_before - 1
    assert assert_consistent(TrajectoryStore(tmp_path)) == before
    # Nothing left to remove the second time.
    assert main(["store", "vacuum", "--store", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("removed 0 steps file(s)")


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["--store", "{absent}"], 1, "no store here"),
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
