"""The shard writer: shards committed in order on a background thread, errors raised to the
caller, close waiting for every commit, and the same exactly-once guarantees as a plain commit."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from shard_data import make_shard
from test_commits import assert_consistent, raw_rows

from storage import CommitError, CommitResult, RecordError, TrajectoryStore

REPO_ROOT = Path(__file__).resolve().parents[2]
TESTS_DIR = Path(__file__).resolve().parent


def shard(shard_index: int, iteration: int = 0) -> dict[str, Any]:
    episodes, steps = make_shard("run", iteration, shard_index, n_episodes=6, max_steps=4)
    return {"episodes": episodes, "steps": steps}


def episode_commits(root: Path) -> list[list[str]]:
    """The shards' transaction ids of each episodes commit, in the order they were committed."""
    from deltalake import DeltaTable

    history = DeltaTable(str(root / "episodes")).history()
    return [json.loads(c["rollyard.shards"]) for c in reversed(history) if "rollyard.shards" in c]


def committed_order(root: Path) -> list[str]:
    """The shards' transaction ids in the order the episodes table committed them."""
    return [app_id for commit in episode_commits(root) for app_id in commit]


def test_shards_commit_in_the_order_submitted(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    with store.shard_writer(max_in_flight=2) as writer:
        futures = [writer.submit("run", 0, s, **shard(s)) for s in range(6)]
    results = [f.result(timeout=0) for f in futures]
    assert [(r.shard, r.committed) for r in results] == [(s, True) for s in range(6)]
    assert all(isinstance(r, CommitResult) and r.commit_id for r in results)
    assert [r.n_steps for r in results] == [len(shard(s)["steps"]) for s in range(6)]
    assert committed_order(tmp_path) == [f'rollyard:["shard","run","0","{s}"]' for s in range(6)]
    assert store.committed_shards("run", 0) == list(range(6))
    n_episodes, n_steps = assert_consistent(store)
    assert n_episodes == 36 and n_steps == sum(len(shard(s)["steps"]) for s in range(6))


def test_a_record_error_is_raised_by_submit_and_the_writer_goes_on(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    with store.shard_writer() as writer:
        writer.submit("run", 0, 0, **shard(0))
        bad = shard(1)
        bad["episodes"][0] = {**bad["episodes"][0], "no_such_field": 1}
        with pytest.raises(RecordError, match="no_such_field"):
            writer.submit("run", 0, 1, **bad)
        # The records were converted before submit returned: changing them now changes nothing.
        good = shard(2)
        future = writer.submit("run", 0, 2, **good)
        good["episodes"].clear()
        good["steps"].clear()
    assert future.result().n_episodes == 6
    assert store.committed_shards("run", 0) == [0, 2]
    assert assert_consistent(store)[0] == 12


def failing_on(store: TrajectoryStore, bad_shard: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the commit holding `bad_shard` fail in the writer's thread, as a storage error would."""
    original = store.commits.commit_group

    def commit(group: Any, *args: Any) -> list[CommitResult]:
        if any(prepared.shard == bad_shard for prepared in group):
            raise CommitError(f"disk full while committing shard {bad_shard}")
        return original(group, *args)

    monkeypatch.setattr(store.commits, "commit_group", commit)


def test_a_failed_commit_is_raised_at_the_next_call_and_stops_the_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TrajectoryStore(tmp_path)
    failing_on(store, 1, monkeypatch)
    writer = store.shard_writer(max_in_flight=1)
    first = writer.submit("run", 0, 0, **shard(0))
    second = writer.submit("run", 0, 1, **shard(1))
    # With one shard in flight, this submit waits for shard 1's commit, so it sees it fail.
    with pytest.raises(CommitError, match="disk full"):
        writer.submit("run", 0, 2, **shard(2))
    assert first.result().committed
    with pytest.raises(CommitError, match="disk full"):
        second.result()
    # Reported once; the writer then refuses more shards, and close does not raise it again.
    with pytest.raises(CommitError, match="stopped after a failed commit"):
        writer.submit("run", 0, 3, **shard(3))
    writer.close()
    with pytest.raises(CommitError, match="closed"):
        writer.submit("run", 0, 3, **shard(3))
    assert store.committed_shards("run", 0) == [0]


def test_shards_queued_behind_a_failed_commit_are_not_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TrajectoryStore(tmp_path)
    failing_on(store, 1, monkeypatch)
    writer = store.shard_writer(max_in_flight=3)
    futures = [writer.submit("run", 0, s, **shard(s)) for s in range(3)]
    with pytest.raises(CommitError, match="disk full"):
        writer.close()
    # Shard 0 commits on its own or fails with shard 1, depending on whether it was still queued
    # when shard 1 arrived; shard 2 fails with shard 1's commit or is refused after it.
    with pytest.raises(CommitError, match="disk full"):
        futures[1].result()
    with pytest.raises(CommitError, match=r"disk full|earlier shard of this writer failed"):
        futures[2].result()
    first_committed = futures[0].exception() is None
    assert store.committed_shards("run", 0) == ([0] if first_committed else [])
    assert assert_consistent(store)[0] == (6 if first_committed else 0)
    # Replaying every shard with a new writer adds the missing ones, each once.
    monkeypatch.undo()
    with store.shard_writer() as replay:
        again = [replay.submit("run", 0, s, **shard(s)) for s in range(3)]
    assert [f.result().committed for f in again] == [not first_committed, True, True]
    assert store.committed_shards("run", 0) == [0, 1, 2]
    assert assert_consistent(store)[0] == 18


def test_shards_that_queue_share_one_commit_each_exactly_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TrajectoryStore(tmp_path)
    store.commit_iteration_shard("run", 0, 2, **shard(2))
    original = store.commits.commit_group
    entered, release = threading.Event(), threading.Event()

    def held_commit(group: Any, *args: Any) -> list[CommitResult]:
        entered.set()
        release.wait(timeout=30)
        return original(group, *args)

    monkeypatch.setattr(store.commits, "commit_group", held_commit)
    writer = store.shard_writer(max_in_flight=8)
    # Shard 0 is taken alone and held; the others queue behind it, shard 3 twice and shard 2
    # already committed.
    futures = [writer.submit("run", 0, 0, **shard(0))]
    assert entered.wait(timeout=30)
    futures += [writer.submit("run", 0, s, **shard(s)) for s in (1, 2, 3, 3, 4)]
    release.set()
    writer.close()
    results = [f.result(timeout=0) for f in futures]
    assert [(r.shard, r.committed) for r in results] == [
        (0, True),
        (1, True),
        (2, False),
        (3, True),
        (3, False),
        (4, True),
    ]
    assert results[4].commit_id is None and results[3].commit_id
    app_id = 'rollyard:["shard","run","0","{}"]'.format
    assert episode_commits(tmp_path) == [
        [app_id(2)],
        [app_id(0)],
        [app_id(1), app_id(3), app_id(4)],
    ]
    assert store.committed_shards("run", 0) == [0, 1, 2, 3, 4]
    n_episodes, n_steps = assert_consistent(store)
    assert n_episodes == 30
    assert n_steps == sum(len(shard(s)["steps"]) for s in range(5))


def test_shards_a_concurrent_writer_committed_first_are_left_out_of_a_group(
    tmp_path: Path,
) -> None:
    store = TrajectoryStore(tmp_path)
    store.commit_iteration_shard("run", 0, 9, **shard(9))  # both tables exist
    group = [store.commits.prepare_shard("run", 0, s, **shard(s)) for s in range(3)]
    handles: dict[str, Any] = {}
    catching_up = store.commits.start_catch_up(handles, [p.app_id for p in group])
    (episodes, done), (steps, _) = (future.result() for future in catching_up)
    assert not done
    # Between this writer's look at the table and its commit, another one commits shard 1.
    TrajectoryStore(tmp_path).commit_iteration_shard("run", 0, 1, **shard(1 + 20))
    committed = store.commits._commit_new_shards(group, handles, episodes, steps)
    assert committed == {group[0].app_id, group[2].app_id}
    assert store.committed_shards("run", 0) == [0, 1, 2, 9]
    by_shard = {
        row["shard"]: row["commit_id"]
        for row in store.query("SELECT DISTINCT shard, commit_id FROM episodes").to_pylist()
    }
    assert by_shard[1] != group[1].commit_id  # the other writer's rows, not this one's
    n_episodes, _ = assert_consistent(store)
    assert n_episodes == 24
    # This writer lost shard 1 before committing anything of it: no Delta reader sees its rows.
    assert raw_rows(tmp_path) == assert_consistent(store)
    assert store.vacuum().removed_rows == 0


def test_close_and_flush_wait_for_every_commit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = TrajectoryStore(tmp_path)
    original = store.commits.commit_group
    release = threading.Event()

    def slow_commit(group: Any, *args: Any) -> list[CommitResult]:
        release.wait(timeout=30)
        return original(group, *args)

    monkeypatch.setattr(store.commits, "commit_group", slow_commit)
    writer = store.shard_writer(max_in_flight=2)
    futures = [writer.submit("run", 0, s, **shard(s)) for s in range(2)]
    assert not any(f.done() for f in futures)
    assert store.committed_shards("run", 0) == []
    threading.Timer(0.3, release.set).start()
    started = time.monotonic()
    writer.flush()
    assert time.monotonic() - started >= 0.2
    assert all(f.done() for f in futures)
    assert store.committed_shards("run", 0) == [0, 1]

    release.clear()
    futures = [writer.submit("run", 0, s, **shard(s)) for s in range(2, 4)]
    threading.Timer(0.3, release.set).start()
    writer.close()
    assert all(f.result(timeout=0).committed for f in futures)
    assert store.committed_shards("run", 0) == [0, 1, 2, 3]


def test_leaving_a_with_block_by_an_error_still_waits_for_handed_over_shards(
    tmp_path: Path,
) -> None:
    store = TrajectoryStore(tmp_path)
    with pytest.raises(KeyError), store.shard_writer() as writer:
        futures = [writer.submit("run", 0, s, **shard(s)) for s in range(3)]
        raise KeyError("rollout failed")
    assert all(f.done() and f.result().committed for f in futures)
    assert store.committed_shards("run", 0) == [0, 1, 2]


def test_replaying_shards_through_a_writer_writes_nothing_twice(tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path)
    store.commit_iteration_shard("run", 0, 1, **shard(1))
    with store.shard_writer() as writer:
        first = [writer.submit("run", 0, s, **shard(s)) for s in range(4)]
    before = assert_consistent(store)
    files = sorted(p for p in tmp_path.rglob("*.parquet"))
    with store.shard_writer() as writer:
        # Different rows under the same keys (a rescheduled task): the first commits still win.
        again = [writer.submit("run", 0, s, **shard(s + 10)) for s in range(4)]
    assert [f.result().committed for f in first] == [True, False, True, True]
    assert not any(f.result().committed for f in again)
    assert assert_consistent(store) == before
    # A replay leaves no file behind either: nothing reaches storage for a shard already in.
    assert sorted(p for p in tmp_path.rglob("*.parquet")) == files


def test_max_in_flight_must_be_positive(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="max_in_flight"):
        TrajectoryStore(tmp_path).shard_writer(max_in_flight=0)


PIPELINED_WRITER = textwrap.dedent(
    """
    import sys
    from shard_data import make_shard
    from storage import TrajectoryStore

    root, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    with TrajectoryStore(root).shard_writer(max_in_flight=2) as writer:
        for shard in range(first, last):
            episodes, steps = make_shard("run", 0, shard, n_episodes=20, max_steps=20)
            future = writer.submit("run", 0, shard, episodes=episodes, steps=steps)
            future.add_done_callback(lambda f: print(f.result().shard, flush=True))
    """
)


def start_pipelined_writer(root: Path, first: int, last: int) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(TESTS_DIR)])}
    return subprocess.Popen(
        [sys.executable, "-c", PIPELINED_WRITER, str(root), str(first), str(last)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )


def test_a_killed_pipelined_writer_leaves_whole_shards_and_resumes_once(tmp_path: Path) -> None:
    committed = 0
    for delay_s in (0.0, 0.021, 0.043):
        writer = start_pipelined_writer(tmp_path, committed, committed + 200)
        assert writer.stdout is not None
        first_line = writer.stdout.readline()  # committing in a loop by now
        time.sleep(delay_s)
        writer.send_signal(signal.SIGKILL)
        output, _ = writer.communicate(timeout=30)
        reported = len((first_line + output).split())
        n_episodes, _ = assert_consistent(TrajectoryStore(tmp_path))
        # Every reported shard is visible, plus at most the two in flight (committed together,
        # killed before their futures reported).
        assert n_episodes in [20 * (committed + reported + extra) for extra in range(3)]
        committed = n_episodes // 20
    finisher = start_pipelined_writer(tmp_path, 0, committed + 3)
    finisher.communicate(timeout=60)
    assert finisher.returncode == 0
    store = TrajectoryStore(tmp_path)
    assert store.committed_shards("run", 0) == list(range(committed + 3))
    assert assert_consistent(store)[0] == 20 * (committed + 3)
