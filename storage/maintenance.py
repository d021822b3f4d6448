"""Compaction and vacuum: maintenance commits that rearrange the steps table's committed files.

Compaction (`compact`) rewrites a finished iteration's committed steps files as one file in one
Delta commit (remove the old ones, add the new one), so the number of live files, which every
commit and every snapshot pays for, grows with iterations rather than shards; the train loop runs
it on each iteration it finishes. Vacuum (`vacuum`) completes shards a killed writer left between
its two commits and removes steps files of abandoned commits of older store layouts (see
`storage.commits`), and optionally runs Delta's vacuum.
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from storage.commits import CommitEngine, first_line, now
from storage.errors import CommitError
from storage.records import read_parquet_file
from storage.schemas import EPISODES, STEPS
from storage.shard_log import orphan_step_files


@dataclass(frozen=True, slots=True)
class VacuumResult:
    """What `vacuum` did: steps files removed from the table (and their rows), files Delta's
    vacuum deleted from storage, and shards completed (their writer stopped between its steps
    and episodes commits)."""

    removed_files: tuple[str, ...]
    removed_rows: int
    deleted_files: tuple[str, ...]
    completed_shards: tuple[tuple[str, int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class CompactResult:
    """What `compact` did: the (run_id, iteration) partitions of the steps table rewritten, how
    many files they held before and after, and the rows moved."""

    partitions: tuple[tuple[str, int], ...]
    files_before: int
    files_after: int
    rows: int


def vacuum(
    engine: CommitEngine,
    *,
    uncommitted_older_than: timedelta | None = None,
    retention_hours: int | None = None,
) -> VacuumResult:
    """Complete pending shards, then remove steps that no reader will ever see, in one Delta
    commit on the steps table.

    First every shard whose writer stopped between its steps commit and its episodes commit is
    completed with that writer's own files (`CommitEngine.roll_forward`; safe beside a writer
    still running, which then finds its shard done). Then removed: steps files of shard commits
    that lost, i.e. whose shard is committed under another commit id, and, with
    `uncommitted_older_than`, steps files of shards not committed at all and older than that.
    The current commit protocol leaves neither in the table (a losing writer commits nothing);
    stores written by earlier versions may hold both. Readers hide these files anyway;
    removing them keeps the raw Delta table (as other engines read it) free of them.

    Removed files stay on disk for time travel until Delta's vacuum deletes them: with
    `retention_hours`, that runs on both tables afterwards and deletes removed files and files
    never committed (a losing writer's Parquet files) older than that many hours. A running
    writer's file is uncommitted until its commit, so keep `retention_hours` above the longest
    a commit can take (0 only with no writer running).
    """
    completed = tuple((p.run_id, p.iteration, p.shard) for p in engine.roll_forward())
    steps = engine.open(STEPS, create=False)
    episodes = engine.open(EPISODES, create=False)
    if steps is None:
        return VacuumResult((), 0, (), completed)
    cutoff = None
    if uncommitted_older_than is not None:
        cutoff = int((now() - uncommitted_older_than).timestamp() * 1000)
    actions = pa.table(steps.get_add_actions(flatten=True))
    removals: list[AddAction | RemoveAction] = []
    rows = 0
    now_ms = int(time.time() * 1000)
    dead = _dead_step_files(actions, episodes, cutoff)
    for row in dead:
        removals.append(
            RemoveAction(
                path=unquote(row["path"]),
                data_change=True,
                deletion_timestamp=now_ms,
                size=row["size_bytes"],
                partition_values={
                    column: str(row[f"partition.{column}"]) for column in STEPS.partition_by
                },
            )
        )
        rows += row["num_records"] or 0
    if removals:
        _rearrange_steps(engine, steps, removals, "vacuum orphaned steps")
    deleted: list[str] = []
    if retention_hours is not None:
        for table in (steps, episodes):
            if table is None:
                continue
            table.update_incremental()
            deleted += table.vacuum(
                retention_hours=retention_hours,
                enforce_retention_duration=False,
                dry_run=False,
                full=True,
            )
    return VacuumResult(tuple(unquote(r["path"]) for r in dead), rows, tuple(deleted), completed)


def compact(
    engine: CommitEngine,
    run_id: str | None = None,
    iteration: int | None = None,
    *,
    min_files: int = 2,
) -> CompactResult:
    """Rewrite the committed steps of each (run_id, iteration) partition holding at least
    `min_files` files as one file, one Delta commit per partition (remove the old files, add
    the new one, as a rearrangement: `dataChange` false). Optionally for one run or iteration.

    A shard commit writes one steps file, so a table gets a file per shard; every Delta commit
    and every reader's snapshot pays for each live file (see `storage.commits`), and so does
    every query opening them. Compacting iterations that are done keeps that cost flat.
    Only files of committed shards are merged: steps of a shard whose episodes commit has not
    happened (a writer between its two commits, or a killed one) stay as they are, hidden
    until their commit, and files of lost commits are left to `vacuum`. The new file mixes
    commit ids, which is how readers tell a compacted file (it holds committed rows only).
    Readers of an older snapshot keep reading the old files, which stay on disk until a Delta
    vacuum past the retention period. A concurrent compaction or vacuum of the same files
    makes this commit fail (CommitError; run it again).
    """
    if min_files < 2:
        raise ValueError(f"min_files must be >= 2, got {min_files}")
    steps = engine.open(STEPS, create=False)
    if steps is None:
        return CompactResult((), 0, 0, 0)
    episodes = engine.open(EPISODES, create=False)
    actions = pa.table(steps.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return CompactResult((), 0, 0, 0)
    left_out = orphan_step_files(steps, episodes) | {
        row["path"] for row in _dead_step_files(actions, episodes, None)
    }
    by_partition: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for row in actions.select(
        ["path", "size_bytes", "num_records", "partition.run_id", "partition.iteration"]
    ).to_pylist():
        key = (row["partition.run_id"], int(row["partition.iteration"]))
        if row["path"] in left_out or (run_id is not None and key[0] != run_id):
            continue
        if iteration is not None and key[1] != iteration:
            continue
        by_partition.setdefault(key, []).append(row)
    filesystem = engine.filesystem(engine.table_uri(STEPS.name))
    done: list[tuple[str, int]] = []
    files_before = rows = 0
    for key, files in sorted(by_partition.items()):
        if len(files) < min_files:
            continue
        rows += _compact_partition(engine, steps, filesystem, key, files)
        done.append(key)
        files_before += len(files)
    return CompactResult(tuple(done), files_before, len(done), rows)


def _compact_partition(
    engine: CommitEngine,
    steps: DeltaTable,
    filesystem: pafs.FileSystem,
    key: tuple[str, int],
    files: list[dict[str, Any]],
) -> int:
    """Merge one partition's `files` (add-action rows) into one file in one commit; the number
    of rows moved."""
    uri = engine.table_uri(STEPS.name)
    parts = [
        read_parquet_file(
            unquote(f["path"]), filesystem=filesystem, label=f"{uri}/{unquote(f['path'])}"
        )
        for f in files
    ]
    merged = pa.concat_tables(parts, promote_options="default")
    expected = sum(f["num_records"] or 0 for f in files)
    if merged.num_rows != expected:
        raise CommitError(
            f"{uri}: partition run_id={key[0]!r} iteration={key[1]} reads {merged.num_rows} "
            f"rows but the log records {expected}; not compacted"
        )
    partition = {"run_id": key[0], "iteration": key[1]}
    # The schema's column order with the partition columns back, as a shard commit writes.
    columns = [
        pa.repeat(pa.scalar(partition[f.name], type=f.type), merged.num_rows)
        if f.name in partition
        else merged.column(f.name).cast(f.type)
        for f in STEPS.schema
    ]
    table = pa.Table.from_arrays(columns, schema=STEPS.schema)
    added = engine.write_file(STEPS, table, f"compacted-{uuid.uuid4().hex[:20]}", partition)
    now_ms = int(time.time() * 1000)
    removed = [
        RemoveAction(
            path=unquote(f["path"]),
            data_change=False,
            deletion_timestamp=now_ms,
            size=f["size_bytes"],
            partition_values={"run_id": key[0], "iteration": str(key[1])},
        )
        for f in files
    ]
    try:
        _rearrange_steps(
            engine,
            steps,
            [*removed, dataclasses.replace(added, data_change=False)],
            "compact steps",
        )
    except CommitFailedError as error:
        raise CommitError(
            f"{uri}: compacting run_id={key[0]!r} iteration={key[1]} conflicted with another "
            f"change to its files ({first_line(error)}); run it again"
        ) from error
    return int(table.num_rows)


def _rearrange_steps(
    engine: CommitEngine,
    steps: DeltaTable,
    actions: list[AddAction | RemoveAction],
    operation: str,
) -> None:
    """One maintenance commit on the steps table (files removed or replaced, no shard's
    transaction), named in the log by `operation`."""
    engine.commit_files(steps, STEPS, actions, metadata={"rollyard.operation": operation})


def _dead_step_files(
    actions: pa.Table, episodes: DeltaTable | None, uncommitted_before_ms: int | None
) -> list[dict[str, Any]]:
    """Add actions of steps files no reader will see: of a shard committed under another commit
    id, or (with `uncommitted_before_ms`) of an uncommitted shard, written before that time."""
    needed = {"min.commit_id", "max.commit_id", "min.shard", "max.shard"}
    if actions.num_rows == 0 or not needed <= set(actions.column_names):
        return []
    winners: dict[tuple[Any, ...], str] = {}
    if episodes is not None:
        episode_actions = pa.table(episodes.get_add_actions(flatten=True))
        if episode_actions.num_rows and "min.commit_id" in episode_actions.column_names:
            for run_id, iteration, shard, commit_id in zip(
                episode_actions["partition.run_id"].to_pylist(),
                episode_actions["partition.iteration"].to_pylist(),
                episode_actions["min.shard"].to_pylist(),
                episode_actions["min.commit_id"].to_pylist(),
                strict=True,
            ):
                winners[(run_id, iteration, shard)] = commit_id
    dead = []
    for row in actions.to_pylist():
        low, high = row["min.commit_id"], row["max.commit_id"]
        if low is None or low != high or row["min.shard"] != row["max.shard"]:
            continue  # a compacted file holds committed rows only
        winner = winners.get(
            (row["partition.run_id"], row["partition.iteration"], row["min.shard"])
        )
        if winner is not None:
            if winner != low:
                dead.append(row)
        elif uncommitted_before_ms is not None and row["modification_time"] < uncommitted_before_ms:
            dead.append(row)
    return dead
