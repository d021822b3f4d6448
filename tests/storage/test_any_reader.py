"""Every Delta reader sees what rollyard's reader sees: writers race for the same shards, and the
tables are read through deltalake and polars while they race and after, without `store vacuum`."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import polars as pl
import pyarrow as pa
import pytest
from deltalake import DeltaTable
from test_commits import REPO_ROOT, TESTS_DIR, assert_consistent

from storage import TrajectoryStore

N_SHARDS = 12
N_WRITERS = 3

RACER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from shard_data import make_shard
    from storage import TrajectoryStore

    root, writer = sys.argv[1], int(sys.argv[2])
    store = TrajectoryStore(root)
    # Start together: a writer that got through its imports first would otherwise commit every
    # shard before the others begin, and there would be no race.
    barrier = Path(sys.argv[4])
    (barrier / str(writer)).touch()
    deadline = time.monotonic() + 120
    while len(list(barrier.iterdir())) < int(sys.argv[5]) and time.monotonic() < deadline:
        time.sleep(0.01)
    # Each writer walks the shards in its own order, so every shard is raced for.
    order = list(range(int(sys.argv[3])))
    order = order[writer:] + order[:writer] if writer % 2 == 0 else order[::-1]
    if writer == 1:
        with store.shard_writer(max_in_flight=4) as shards:
            for shard in order:
                episodes, steps = make_shard("run", 0, shard, n_episodes=6, max_steps=6)
                shards.submit("run", 0, shard, episodes=episodes, steps=steps)
    else:
        for shard in order:
            episodes, steps = make_shard("run", 0, shard, n_episodes=6, max_steps=6)
            store.commit_iteration_shard("run", 0, shard, episodes=episodes, steps=steps)
    """
)


def owners_deltalake(root: Path, name: str) -> dict[int, set[str]]:
    """The commit ids each shard's rows carry in table `name`, as deltalake reads it."""
    path = root / name
    if not (path / "_delta_log").is_dir() or not any((path / "_delta_log").iterdir()):
        return {}
    table = DeltaTable(str(path)).to_pyarrow_table(columns=["shard", "commit_id"])
    return _owners(table)


def owners_polars(root: Path, name: str) -> dict[int, set[str]]:
    """The same through polars' Delta reader."""
    path = root / name
    if not (path / "_delta_log").is_dir() or not any((path / "_delta_log").iterdir()):
        return {}
    frame = pl.read_delta(str(path), columns=["shard", "commit_id"])
    return _owners(frame.to_arrow())


def _owners(table: pa.Table) -> dict[int, set[str]]:
    owners: dict[int, set[str]] = {}
    for shard, commit_id in zip(
        table["shard"].to_pylist(), table["commit_id"].to_pylist(), strict=True
    ):
        owners.setdefault(shard, set()).add(commit_id)
    return owners


def assert_one_owner_per_shard(root: Path, owner_of: dict[int, str]) -> None:
    """At this moment, every reader sees at most one commit per shard in each table, and it is
    the same commit in both tables and at every earlier look (`owner_of`, updated here)."""
    for read in (owners_deltalake, owners_polars):
        for name in ("steps", "episodes"):
            for shard, commit_ids in read(root, name).items():
                assert len(commit_ids) == 1, (
                    f"{read.__name__}: {name} of shard {shard}: {commit_ids}"
                )
                (commit_id,) = commit_ids
                assert owner_of.setdefault(shard, commit_id) == commit_id, (
                    f"{read.__name__}: shard {shard} changed owner in {name}"
                )


def race(root: Path, barrier: Path) -> dict[int, str]:
    """N_WRITERS processes race to commit the same N_SHARDS shards into `root`, started together
    (`barrier`); every reader is checked for one owner per shard while they run. Returns the
    owner of each shard as the readers saw it."""
    barrier.mkdir()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])}
    writers = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                RACER,
                str(root),
                str(index),
                str(N_SHARDS),
                str(barrier),
                str(N_WRITERS),
            ],
            env=env,
            stderr=subprocess.PIPE,
            text=True,
        )
        for index in range(N_WRITERS)
    ]
    owner_of: dict[int, str] = {}
    looks = 0
    try:
        while any(writer.poll() is None for writer in writers):
            assert_one_owner_per_shard(root, owner_of)
            looks += 1
            time.sleep(0.05)
    finally:
        errors = [writer.communicate(timeout=120)[1] for writer in writers]
    assert [writer.returncode for writer in writers] == [0] * N_WRITERS, errors
    assert looks > 0
    assert_one_owner_per_shard(root, owner_of)
    return owner_of


def test_racing_writers_leave_every_reader_the_same_rows(tmp_path: Path) -> None:
    # The race must be real: losing writers wrote files of their own, which no table references.
    # Whether two writers prepare the same shard at once is up to timing, so race again (a fresh
    # store each time, every check applied to each) until one round had a loser.
    for attempt in range(5):
        store_root = tmp_path / f"store-{attempt}"
        owner_of = race(store_root, tmp_path / f"barrier-{attempt}")
        store = TrajectoryStore(store_root)
        n_episodes, n_steps = assert_consistent(store)
        assert store.committed_shards("run", 0) == list(range(N_SHARDS))
        assert sorted(owner_of) == list(range(N_SHARDS))
        if len(list((store_root / "episodes").rglob("*.parquet"))) > N_SHARDS:
            break
    else:
        pytest.fail(f"no writer lost a race in 5 rounds of {N_WRITERS} writers")
    # Row for row, deltalake and polars read exactly what rollyard's reader gives.
    for name, key in (("episodes", ["episode_id"]), ("steps", ["episode_id", "step"])):
        ours = (
            store.read_episodes(include_quarantined=True)
            if name == "episodes"
            else store.read_steps()
        )
        ours = ours.select(["episode_id", "commit_id", *key[1:]]).sort_by(
            [(k, "ascending") for k in key]
        )
        theirs = DeltaTable(str(store_root / name)).to_pyarrow_table(columns=ours.column_names)
        polars = pl.read_delta(str(store_root / name), columns=ours.column_names).to_arrow()
        for other in (theirs, polars):
            other = other.cast(ours.schema).sort_by([(k, "ascending") for k in key])
            assert other.equals(ours), name
    assert (n_episodes, n_steps) == (
        DeltaTable(str(store_root / "episodes")).to_pyarrow_table().num_rows,
        DeltaTable(str(store_root / "steps")).to_pyarrow_table().num_rows,
    )
    # Each commit id a reader saw is the one rollyard's reader shows for that shard.
    shown = store.query("SELECT DISTINCT shard, commit_id FROM episodes").to_pylist()
    assert {row["shard"]: row["commit_id"] for row in shown} == owner_of
