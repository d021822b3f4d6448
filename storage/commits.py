"""The commit engine: how rows reach the store's Delta Lake tables, exactly once.

Why Delta Lake (through `deltalake`): it gives atomic appends (a commit is one log file created
with put-if-absent, so a killed writer leaves only unreferenced Parquet files that no reader sees),
optimistic concurrency with automatic retry for concurrent appends, application transaction ids
(`txn` actions) that make a replayed commit detectable inside the same atomic step, and object
storage through the same code path. A home-made manifest would have to re-implement all four.

How a shard commit stays exactly once across two tables, for every Delta reader. Delta commits
one table at a time, so a shard is committed in two steps, each carrying the shard's application
transaction id: first its steps, then its episodes. Both data files are written before either
commit, and named by the shard commit's fresh `commit_id`.

- the steps commit decides who owns the shard: of two writers of the same shard, the second steps
  commit fails Delta's conflict check on the transaction id (or its writer sees the id already
  there), so the loser commits nothing at all and its files stay unreferenced: no Delta reader
  (rollyard, deltalake, polars, DuckDB's delta extension, Spark) ever sees a losing shard's rows;
- the episodes commit is the commit point (`is_committed`): rollyard's readers show a shard
  once its episodes are in, and leave out steps files whose (run_id, iteration, commit_id) match
  no committed episodes (`storage.shard_log.orphan_step_files`, from the log's file statistics);
- a writer killed between the two commits leaves its steps committed and its episodes file
  written but not committed ("pending"). Whoever comes next completes it (`roll_forward`): a
  replay of the shard, a concurrent writer of it, or `vacuum`, each committing the owner's own
  episodes file (found by name from the steps file's commit id) under the shard's transaction id,
  so two completions cannot both land. A replay that completes a pending shard returns
  `committed=False`: the shard is the killed writer's, not the replay's;
- a shard with no steps has only the episodes commit, which decides and commits at once;
- replay: a shard whose transaction id the episodes table holds is skipped, nothing written.

How a table write goes, and why (ingest speed). The store writes each shard's rows itself as one
zstd Parquet file per table (`storage.data_files`; partition columns in the directory name and the
log, as Delta writers lay them out) and registers it with `DeltaTable.create_write_transaction`:
one Delta commit carrying the add actions, their file statistics and the transaction ids. Measured
at about 500 commits in a table, a `write_deltalake` append took 45-145 ms (two or all columns with
statistics); now the file takes 5-10 ms and the commit 8-15 ms. A delta-rs commit costs mostly a
replay of the table's state: it reloads the state from the last checkpoint (hence
`delta.checkpointInterval` 10: longer intervals replay more JSON, shorter ones write checkpoints
too often) and parses every live file's statistics, so the two big tables keep statistics only for
the two columns the store reads from the log (`STATS_COLUMNS`). The handle does not advance past
its own commit, and a commit on a stale handle costs far more (measured: about 140 ms ten versions
behind, against 8 ms on a current one), so each commit first catches both handles up with
`update_incremental`, in helper threads while the calling thread converts the records (the replay
releases the GIL). Files reach storage only once their shard is known not to be in, so a replay
leaves no file behind.

Shards can be committed together (`CommitEngine.commit_group`): one steps commit adding every
shard's steps file, then one episodes commit adding every shard's episodes file with each shard's
transaction id. That is still all-or-nothing and exactly-once per shard, and pays for the catch-up
and the two commits once. `storage.shard_writer.ShardWriter` does this for a caller committing many
shards in sequence: `submit` converts a shard in the calling thread and queues it for one
background thread, which commits whatever has queued as one group while the caller converts the
next shards (or runs their rollouts). The background thread's work is nearly all native (Parquet
encoding, the Delta commits), but it needs the GIL between those calls, and while the caller's
thread runs Python each of those hand-overs can wait out the interpreter's switch interval (5 ms;
measured: a group commit of 8 shards that takes 12 ms alone took 460 ms beside a busy Python thread
when its files were encoded in memory and stored in separate calls). Hence one pyarrow call per
file (encode and write), and groups, which take fewer hand-overs per shard the more shards queue.

The smaller tables (gates, metrics, tasks, reviews, checkpoints) append one batch per commit with
`append_once`, keyed by an application transaction id of their own. Compaction and vacuum, which
rearrange committed steps files, are in `storage.maintenance`; opening, catching up and schema
checks of the table handles, in `storage.delta_tables`; reading pending shards from the log, in
`storage.shard_log`.
"""

from __future__ import annotations

import json
import os
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from storage.data_files import existing_data_file, write_data_file
from storage.delta_tables import StoreTables, transaction_id
from storage.errors import CommitError
from storage.records import TableInput, shard_tables
from storage.schemas import EPISODES, STEPS, TableSpec
from storage.shard_log import PendingShard, pending_shards

# Delta retries a commit that lost a race to a non-conflicting one; many parallel shard writers
# need more than the library default.
MAX_COMMIT_RETRIES = 100
CONFLICT_RETRIES = 3
"""Commits of a shard retried on a fresh handle after a conflict that no shard of theirs lost
(another writer's metadata commit), before the failure is raised."""
# After each commit Delta writes a checkpoint when the table's interval says so; old log files
# are only removed past the default retention.
_POST_COMMIT = PostCommitHookProperties(create_checkpoint=True)

# A table handle being caught up in a helper thread, and which of the asked transaction ids the
# table holds.
CatchUp: TypeAlias = Future[tuple[DeltaTable | None, frozenset[str]]]


@dataclass(frozen=True, slots=True)
class CommitResult:
    """What `commit_iteration_shard` did: `committed` is False when the shard was already there."""

    run_id: str
    iteration: int
    shard: int
    committed: bool
    commit_id: str | None
    n_episodes: int
    n_steps: int


@dataclass(frozen=True, slots=True)
class PreparedShard:
    """A shard's checked tables and commit identity, ready to commit from any thread."""

    run_id: str
    iteration: int
    shard: int
    source: str
    commit_id: str
    app_id: str
    episodes: pa.Table
    steps: pa.Table

    @property
    def partition(self) -> dict[str, Any]:
        """The partition values of the shard's files in both tables."""
        return {"run_id": self.run_id, "iteration": self.iteration}


def now() -> datetime:
    """The time a row is recorded at (UTC)."""
    return datetime.now(UTC)


def first_line(error: BaseException) -> str:
    """An error's first line, for a one-line message that wraps it."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


class CommitEngine(StoreTables):
    """Writes the files of one store root's tables and commits them exactly once, through the
    per-thread table handles of `StoreTables`."""

    def __init__(self, root: str, *, remote: bool, storage_options: Mapping[str, str]) -> None:
        super().__init__(root, remote=remote, storage_options=storage_options)
        # Partition directories known to exist (local roots), so writes skip the mkdir.
        self._directories: set[tuple[str, str]] = set()

    # ---- writing ------------------------------------------------------------------------------

    def write_file(
        self,
        spec: TableSpec,
        data: pa.Table,
        name: str,
        partition: Mapping[str, Any] | None = None,
    ) -> AddAction:
        """Write `data` as one Parquet file of the table (`storage.data_files.write_data_file`);
        the action that adds it, which no reader sees until a commit carries it."""
        uri = self.table_uri(spec.name)
        return write_data_file(
            self.filesystem(uri),
            spec,
            data,
            name,
            partition,
            uri=uri,
            known_directories=None if self.remote else self._directories,
        )

    def commit_files(
        self,
        table: DeltaTable,
        spec: TableSpec,
        actions: Sequence[AddAction | RemoveAction],
        *,
        app_ids: Sequence[str] = (),
        app_version: int = 1,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        """One Delta commit of `actions` (files added, or removed and replaced) on the table,
        carrying the application transaction ids `app_ids` (at `app_version`) and `metadata`.

        A writer killed before the commit leaves only files the log does not reference, which no
        reader sees.
        """
        if spec.added and spec.name not in self._current:
            self._bring_up_to_date(spec, table)
        table.create_write_transaction(
            list(actions),
            "append",
            self._delta_schema(spec, table),
            list(spec.partition_by) or None,
            commit_properties=CommitProperties(
                custom_metadata=dict(metadata or {}),
                max_commit_retries=MAX_COMMIT_RETRIES,
                app_transactions=[Transaction(app_id, app_version) for app_id in app_ids] or None,
            ),
            post_commithook_properties=_POST_COMMIT,
        )

    def _delta_schema(self, spec: TableSpec, table: DeltaTable) -> DeltaSchema:
        schemas: dict[str, DeltaSchema] = self._local.__dict__.setdefault("schemas", {})
        schema = schemas.get(spec.name)
        if schema is None:
            schema = schemas[spec.name] = table.schema()
        return schema

    def append_once(
        self, spec: TableSpec, data: pa.Table, *, app_id: str, app_version: int = 1
    ) -> bool:
        """Append `data` (one partition's rows) unless the table already holds `app_id` at
        `app_version` or later; whether it was appended."""
        table = self.open(spec, create=True)
        assert table is not None
        done = table.transaction_version(app_id)
        if done is not None and done >= app_version:
            return False
        # Writing through the handle read above makes a concurrent commit of the same app id
        # a conflict instead of a second copy.
        added = self.write_file(spec, data, uuid.uuid4().hex)
        for retries_left in range(CONFLICT_RETRIES, -1, -1):
            try:
                self.commit_files(table, spec, [added], app_ids=[app_id], app_version=app_version)
                return True
            except CommitFailedError as error:
                fresh = self.open(spec, create=False)
                done = fresh.transaction_version(app_id) if fresh is not None else None
                if done is not None and done >= app_version:
                    return False
                if fresh is None or retries_left == 0:
                    raise CommitError(
                        f"{self.table_uri(spec.name)}: commit of {app_id} failed: "
                        f"{first_line(error)}"
                    ) from error
                table = fresh  # another writer's metadata commit (see `_commit_until_done`)
        raise AssertionError("unreachable: the last attempt returns or raises")

    # ---- episodes and steps: the shard commit -------------------------------------------------

    def commit_iteration_shard(
        self,
        run_id: str,
        iteration: int,
        shard: int,
        *,
        episodes: TableInput,
        steps: TableInput = (),
    ) -> CommitResult:
        """Commit one shard of an iteration's rollouts, exactly once.

        `episodes` and `steps` are records, mappings, Arrow tables or Parquet file paths. Episode
        mappings may instead carry their steps nested under "steps" (a nested step may leave out
        `episode_id`). Calling this again for the same (run_id, iteration, shard) writes nothing
        and returns `committed=False`, whatever the data. A caller committing many shards one
        after another can overlap them with a shard writer (`TrajectoryStore.shard_writer`).
        """
        # Both table handles catch up on the log in helper threads (Delta's log replay releases
        # the GIL), and the episodes table is asked whether the shard is in, while this thread
        # converts and checks the records.
        handles = self.handles()
        catching_up = self.start_catch_up(
            handles, [transaction_id("shard", run_id, iteration, shard)]
        )
        try:
            prepared = self.prepare_shard(run_id, iteration, shard, episodes, steps)
        finally:
            wait(catching_up)
        return self.commit_group([prepared], handles, catching_up)[0]

    def start_catch_up(
        self, handles: dict[str, DeltaTable], app_ids: Sequence[str]
    ) -> list[CatchUp]:
        """Catch the episodes and steps handles in `handles` up, in helper threads; each also
        finds which of `app_ids` it holds."""
        return [
            _helpers().submit(self.open_in, handles, EPISODES, create=False, app_ids=app_ids),
            _helpers().submit(self.open_in, handles, STEPS, create=False, app_ids=app_ids),
        ]

    def prepare_shard(
        self, run_id: str, iteration: int, shard: int, episodes: TableInput, steps: TableInput
    ) -> PreparedShard:
        """A shard's records converted and checked, with a fresh commit id: all of a shard
        commit that needs no table."""
        source = f"shard (run_id={run_id!r}, iteration={iteration}, shard={shard})"
        commit_id = uuid.uuid4().hex[:20]
        key = {"run_id": run_id, "iteration": iteration, "shard": shard}
        episode_table, step_table = shard_tables(
            episodes, steps, key=key, overwrite={"commit_id": commit_id}, source=source
        )
        return PreparedShard(
            run_id=run_id,
            iteration=iteration,
            shard=shard,
            source=source,
            commit_id=commit_id,
            app_id=transaction_id("shard", run_id, iteration, shard),
            episodes=episode_table,
            steps=step_table,
        )

    def commit_group(
        self,
        group: Sequence[PreparedShard],
        handles: dict[str, DeltaTable],
        catching_up: list[CatchUp] | None = None,
    ) -> list[CommitResult]:
        """Commit prepared shards together, one result per shard in order: all their steps files
        in one steps commit, then all their episodes files in one episodes commit, each commit
        carrying every shard's transaction id (see the module docstring).

        Each shard stays what a commit of its own makes it: all of it visible or none to
        rollyard's readers, none of it to any reader unless this writer owns it, exactly once (a
        shard already in, or given twice, is skipped, and its files never reach storage; one a
        concurrent writer owns is left out of both commits, and completed if that writer was
        killed halfway). Committing shards together pays for the catch-up and the two commits
        once (`ShardWriter` groups what has queued). `handles` are table handles only this
        thread uses while it runs; `catching_up`, those handles being caught up
        (`start_catch_up`), started when not given.
        """
        if catching_up is None:
            catching_up = self.start_catch_up(handles, [p.app_id for p in group])
        wait(catching_up)
        (episodes_table, done), (steps_table, owned) = (f.result() for f in catching_up)
        todo: dict[str, PreparedShard] = {}
        for prepared in group:
            if prepared.app_id not in done:
                todo.setdefault(prepared.app_id, prepared)
        committed: set[str] = set()
        if todo:
            committed = self._commit_new_shards(
                list(todo.values()), handles, episodes_table, steps_table, owned
            )
        results = []
        for p in group:
            new = todo.get(p.app_id) is p and p.app_id in committed
            results.append(
                CommitResult(
                    p.run_id,
                    p.iteration,
                    p.shard,
                    new,
                    p.commit_id if new else None,
                    p.episodes.num_rows,
                    p.steps.num_rows,
                )
            )
        return results

    def _commit_new_shards(
        self,
        shards: list[PreparedShard],
        handles: dict[str, DeltaTable],
        episodes_table: DeltaTable | None,
        steps_table: DeltaTable | None,
        owned_by_others: frozenset[str] = frozenset(),
    ) -> set[str]:
        """The two commits of `commit_group` for shards not in the episodes table when it was
        caught up; the transaction ids whose data this call committed. Shards whose steps
        another writer committed (`owned_by_others`, or found so at the steps commit) are only
        completed with that writer's episodes file."""
        commit_ids = {p.app_id: p.commit_id for p in shards}
        ours = [p for p in shards if p.app_id not in owned_by_others]
        # Both tables exist before any file is written into their directories.
        if episodes_table is None:
            episodes_table, _ = self.open_in(handles, EPISODES, create=True)
        if steps_table is None:
            steps_table, _ = self.open_in(handles, STEPS, create=True)
        assert episodes_table is not None and steps_table is not None
        # Every file is written before the first commit, so a writer killed after its steps
        # commit leaves the episodes file its shard is completed with. Files stay invisible
        # until a commit adds them; the episodes files are written in a helper thread.
        episodes_files = _helpers().submit(
            lambda: {
                p.app_id: self.write_file(EPISODES, p.episodes, p.commit_id, p.partition)
                for p in ours
            }
        )
        try:
            step_adds: dict[str, AddAction | None] = {
                p.app_id: (
                    self.write_file(STEPS, p.steps, p.commit_id, p.partition)
                    if p.steps.num_rows
                    else None  # a shard without steps still claims its id in the steps table
                )
                for p in ours
            }
        finally:
            wait([episodes_files])
        episode_adds: dict[str, AddAction | None] = dict(episodes_files.result())
        lost: set[str] = set(owned_by_others)
        if ours:
            lost |= self._commit_until_done(handles, STEPS, steps_table, step_adds, commit_ids)
        if lost:
            steps_table, _ = self.open_in(handles, STEPS, create=False)
            episodes_table, _ = self.open_in(handles, EPISODES, create=False)
            assert steps_table is not None and episodes_table is not None
            pending = {
                shard.app_id: shard
                for shard in pending_shards(steps_table, episodes_table, app_ids=lost)
            }
            for app_id in lost:
                # Another writer owns the shard: this writer's files stay unreferenced, and the
                # owner's episodes file is committed if the owner stopped halfway.
                episode_adds.pop(app_id, None)
                owner = pending.get(app_id)
                action = self._episodes_file_of(owner) if owner is not None else None
                if owner is not None and action is not None:
                    episode_adds[app_id] = action
                    commit_ids[app_id] = owner.commit_id
        if episode_adds:
            # Shards of this writer that a concurrent completion committed first are still its.
            self._commit_until_done(handles, EPISODES, episodes_table, episode_adds, commit_ids)
        return {p.app_id for p in ours if p.app_id not in lost}

    def _commit_until_done(
        self,
        handles: dict[str, DeltaTable],
        spec: TableSpec,
        table: DeltaTable,
        adds: Mapping[str, AddAction | None],
        commit_ids: Mapping[str, str],
    ) -> set[str]:
        """Commit `adds` (at most one file per shard, keyed by transaction id) to the table, with
        each shard's transaction id, and its commit id in the commit's metadata; the ids another
        writer committed there first, left out."""
        remaining = list(adds)
        lost: set[str] = set()
        retries_left = CONFLICT_RETRIES
        while remaining:
            try:
                self.commit_files(
                    table,
                    spec,
                    [a for a in (adds[app_id] for app_id in remaining) if a is not None],
                    app_ids=remaining,
                    metadata={
                        "rollyard.shards": json.dumps(remaining),
                        "rollyard.commit_ids": json.dumps([commit_ids[a] for a in remaining]),
                    },
                )
                return lost
            except CommitFailedError as error:
                # Another writer committed some of these shards first: commit the others again
                # without them. If it committed none of them, the failure is something else.
                fresh, won = self.open_in(handles, spec, create=False, app_ids=remaining)
                if fresh is not None and not won and retries_left > 0:
                    # A conflict none of these shards caused: Delta does not retry over another
                    # writer's metadata commit ("Metadata changed since last commit", e.g. two
                    # writers creating a fresh table at once, the second landing as version 1).
                    # The files are unchanged and the transaction ids keep the retry exactly-once.
                    retries_left -= 1
                    table = fresh
                    continue
                if fresh is None or not won:
                    raise CommitError(
                        f"{self.table_uri(spec.name)}: commit of {len(remaining)} shard(s) "
                        f"({', '.join(remaining[:3])}) failed: {first_line(error)}; retry the "
                        "commit, it is safe to replay"
                    ) from error
                table = fresh
                lost |= won
                remaining = [app_id for app_id in remaining if app_id not in won]
        return lost

    def _episodes_file_of(self, shard: PendingShard) -> AddAction | None:
        """The episodes file the owner of a pending shard wrote (None if it is gone)."""
        return existing_data_file(
            self.filesystem(self.table_uri(EPISODES.name)),
            EPISODES,
            shard.commit_id,
            {"run_id": shard.run_id, "iteration": shard.iteration},
        )

    def roll_forward(self) -> list[PendingShard]:
        """Complete every pending shard: steps committed by a writer killed before its episodes
        commit. Commits each one's own episodes file under its transaction id (a concurrent
        completion or the writer itself, if still alive, cannot both land); the shards
        completed by this call."""
        steps_table = self.open(STEPS, create=False)
        if steps_table is None:
            return []
        episodes_table = self.open(EPISODES, create=True)
        assert episodes_table is not None
        adds: dict[str, AddAction | None] = {}
        pending: dict[str, PendingShard] = {}
        for shard in pending_shards(steps_table, episodes_table):
            action = self._episodes_file_of(shard)
            if action is not None:
                adds[shard.app_id], pending[shard.app_id] = action, shard
        if not adds:
            return []
        lost = self._commit_until_done(
            self.handles(),
            EPISODES,
            episodes_table,
            adds,
            {app_id: shard.commit_id for app_id, shard in pending.items()},
        )
        return [shard for app_id, shard in pending.items() if app_id not in lost]

    def is_committed(self, run_id: str, iteration: int, shard: int) -> bool:
        """Whether (run_id, iteration, shard) has been committed."""
        table = self.open(EPISODES, create=False)
        if table is None:
            return False
        return (
            table.transaction_version(transaction_id("shard", run_id, iteration, shard)) is not None
        )

    def committed_shards(self, run_id: str, iteration: int) -> list[int]:
        """The shards of an iteration that are committed (read from the log, no data scan)."""
        table = self.open(EPISODES, create=False)
        if table is None:
            return []
        actions = pa.table(table.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return []
        mask = pc.and_(
            pc.equal(actions["partition.run_id"], run_id),
            pc.equal(actions["partition.iteration"].cast(pa.int64()), iteration),
        )
        return sorted(set(actions.filter(mask)["min.shard"].to_pylist()))


_HELPERS: tuple[int, ThreadPoolExecutor] | None = None
_HELPERS_LOCK = threading.Lock()


def _helpers() -> ThreadPoolExecutor:
    """This process's helper threads for work that overlaps a commit (made again after a fork)."""
    global _HELPERS
    with _HELPERS_LOCK:
        if _HELPERS is None or _HELPERS[0] != os.getpid():
            _HELPERS = (
                os.getpid(),
                ThreadPoolExecutor(max_workers=2, thread_name_prefix="rollyard-store"),
            )
        return _HELPERS[1]
