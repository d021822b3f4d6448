"""The streaming buffer's rules: batches as soon as full, partial batches carried over, the
staleness bound per group (stale groups dropped and counted, never trained on), each group
consumed once; a step commits once to the real Delta store with its lags recorded."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from rollyard.status import EpisodeStatus
from storage import TrajectoryStore
from training.streaming import CompletedGroup, StreamBuffer, commit_step
from training.trajectory import EpisodeKey, Trajectory


def _group(wave: int, index: int, planned_at_update: int, size: int = 2) -> CompletedGroup:
    trajectories = []
    for sample in range(size):
        key = EpisodeKey("run", wave, group_index=index, sample_index=sample)
        task_id = f"task-{index}"
        trajectories.append(
            Trajectory(
                episode_id=key.episode_id(task_id),
                group_id=key.group_id(task_id),
                key=key,
                task_id=task_id,
                task_version="1",
                instruction="fix it",
                snapshot_digest="sha256:x",
                sandbox_backend="bwrap",
                policy_version=f"p@{planned_at_update}",
                status=EpisodeStatus.OK,
                steps=(),
                terminated=True,
                truncated=False,
                reward=float(sample % 2),
                passed=sample % 2 == 1,
            )
        )
    return CompletedGroup(tuple(trajectories), planned_at_update, "worker-a")


def test_a_batch_is_taken_as_soon_as_full_and_a_partial_one_waits() -> None:
    buffer = StreamBuffer(batch_groups=2, max_policy_lag=1)
    buffer.add(_group(0, 0, planned_at_update=0))
    assert buffer.take_batch(trainer_updates=0) is None  # one group: carried over
    buffer.add(_group(0, 1, planned_at_update=0))
    buffer.add(_group(1, 0, planned_at_update=0))
    batch = buffer.take_batch(trainer_updates=0)
    assert batch is not None
    assert [g.trajectories[0].key.iteration for g in batch.trained] == [0, 0]
    assert batch.stale == () and len(buffer) == 1  # the third group waits for the next batch


def test_groups_past_the_bound_are_dropped_counted_and_committed_with_the_next_batch() -> None:
    buffer = StreamBuffer(batch_groups=1, max_policy_lag=1)
    straggler = _group(0, 0, planned_at_update=0)
    buffer.add(straggler)
    buffer.add(_group(2, 0, planned_at_update=2))
    batch = buffer.take_batch(trainer_updates=2)  # the straggler is 2 updates behind
    assert batch is not None
    assert batch.stale == (straggler,)
    assert batch.stale_episodes == 2 and batch.max_policy_lag == 0
    assert len(buffer) == 0


@settings(max_examples=60, deadline=None)
@given(
    arrivals=st.lists(st.integers(min_value=0, max_value=3), min_size=1, max_size=40),
    batch_groups=st.integers(min_value=1, max_value=4),
    max_policy_lag=st.integers(min_value=0, max_value=2),
)
def test_every_group_is_consumed_once_and_no_trained_group_exceeds_the_bound(
    arrivals: list[int], batch_groups: int, max_policy_lag: int
) -> None:
    """Groups arrive planned `delay` updates before the trainer's current count; whatever the
    order, a trained group is never past the bound and no group is consumed twice."""
    buffer = StreamBuffer(batch_groups=batch_groups, max_policy_lag=max_policy_lag)
    updates = 0
    consumed: list[str] = []
    for index, delay in enumerate(arrivals):
        buffer.add(_group(index, 0, planned_at_update=max(updates - delay, 0)))
        while batch := buffer.take_batch(updates):
            assert len(batch.trained) == batch_groups
            assert all(g.lag_at(updates) <= max_policy_lag for g in batch.trained)
            assert all(g.lag_at(updates) > max_policy_lag for g in batch.stale)
            consumed += [g.trajectories[0].group_id for g in batch.groups]
            updates += 1
    assert len(consumed) == len(set(consumed))
    assert len(consumed) + len(buffer) == len(arrivals)


def test_a_step_commits_once_rekeyed_with_each_groups_lag(tmp_path: Path) -> None:
    store = TrajectoryStore(str(tmp_path / "store"))
    buffer = StreamBuffer(batch_groups=2, max_policy_lag=1)
    for group in (_group(0, 3, 0), _group(1, 3, 1), _group(1, 0, 2)):
        buffer.add(group)
    batch = buffer.take_batch(trainer_updates=2)
    assert batch is not None and len(batch.stale) == 1
    every, trained, result = commit_step(store, batch, run_id="run", step=5)
    assert result.committed and len(every) == 6 and len(trained) == 4
    assert not commit_step(store, batch, run_id="run", step=5)[2].committed  # replay: no write
    rows = store.query(
        "SELECT group_index, policy_lag, count(*) AS n, count(DISTINCT episode_id) AS ids "
        "FROM episodes WHERE run_id = 'run' AND iteration = 5 GROUP BY ALL ORDER BY 1"
    ).to_pylist()
    # slots 0-1 trained (lags 1, 0); slot 2 is the stale group (lag 2), kept once
    assert [(r["group_index"], r["policy_lag"], r["n"], r["ids"]) for r in rows] == [
        (0, 1, 2, 2),
        (1, 0, 2, 2),
        (2, 2, 2, 2),
    ]
