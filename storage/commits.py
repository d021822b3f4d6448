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
  no committed episodes (`orphan_step_files`, decided from the log's file statistics);
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
rearrange committed steps files, are in `storage.maintenance`.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Collection, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeAlias

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake import Field as DeltaField
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from storage.data_files import STATS_COLUMNS, existing_data_file, write_data_file
from storage.errors import CommitError, SchemaMismatchError
from storage.records import TableInput, shard_tables
from storage.schemas import EPISODES, STEPS, TableSpec

# Delta retries a commit that lost a race to a non-conflicting one; many parallel shard writers
# need more than the library default.
MAX_COMMIT_RETRIES = 100
# Replaying the JSON log of a partitioned table made each commit slower as commits accumulated
# (20 ms -> 60 ms per commit by the 300th with the default interval of 100); a checkpoint every
# 10 commits kept it at 8-18 ms. Measured again with the store's own commits at 500 commits:
# interval 10 beat 1, 2, 5 and 25.
_TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
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


def transaction_id(*parts: object) -> str:
    """An application transaction id: what makes a commit of these parts detectable on replay."""
    # JSON keeps the parts unambiguous whatever characters a run id holds.
    return "rollyard:" + json.dumps([str(part) for part in parts], separators=(",", ":"))


def now() -> datetime:
    """The time a row is recorded at (UTC)."""
    return datetime.now(UTC)


def first_line(error: BaseException) -> str:
    """An error's first line, for a one-line message that wraps it."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _table_configuration(spec: TableSpec) -> dict[str, str | None]:
    configuration: dict[str, str | None] = dict(_TABLE_CONFIGURATION)
    columns = STATS_COLUMNS.get(spec.name)
    if columns is not None:
        # Tells other Delta writers (compaction, say) to collect the same statistics.
        configuration["delta.dataSkippingStatsColumns"] = ",".join(columns)
    return configuration


class CommitEngine:
    """Opens the tables of one store root, writes their files and commits them exactly once.

    `root` is an absolute local directory or an object-storage URI (`remote`). Table handles are
    opened lazily, per thread (a handle is not meant to be shared across threads).
    """

    def __init__(self, root: str, *, remote: bool, storage_options: Mapping[str, str]) -> None:
        self.root = root
        self.remote = remote
        self.storage_options = dict(storage_options)
        self._local = threading.local()
        # Partition directories known to exist (local roots), so writes skip the mkdir.
        self._directories: set[tuple[str, str]] = set()
        # Table handles of closed shard writers, for the next writer (a handle that only catches
        # up is far cheaper than opening the table again).
        self._spare_handles: list[dict[str, DeltaTable]] = []
        self._spare_lock = threading.Lock()
        # Tables known to hold every column of their spec (see `_bring_up_to_date`).
        self._current: set[str] = set()

    def __repr__(self) -> str:
        return f"CommitEngine({self.root!r})"

    # ---- tables -------------------------------------------------------------------------------

    def table_uri(self, name: str) -> str:
        """Where table `name` lives (a local path or a URI)."""
        return f"{self.root}/{name}"

    def filesystem(self, uri: str) -> pafs.FileSystem:
        """A filesystem rooted at `uri` (a table's directory or the store root)."""
        # pyarrow's own filesystems: reading through deltalake's Python filesystem handler aborts
        # the interpreter at exit ("terminate called without an active exception").
        if self.remote:
            base, path = pafs.FileSystem.from_uri(uri)
            return pafs.SubTreeFileSystem(path, base)
        return pafs.SubTreeFileSystem(uri, pafs.LocalFileSystem())

    def take_handles(self) -> dict[str, DeltaTable]:
        """Table handles for a shard writer's thread: a closed writer's, or none yet."""
        with self._spare_lock:
            return self._spare_handles.pop() if self._spare_handles else {}

    def give_back_handles(self, handles: dict[str, DeltaTable]) -> None:
        """Keep a closed shard writer's handles for the next one."""
        with self._spare_lock:
            self._spare_handles.append(handles)

    def handles(self) -> dict[str, DeltaTable]:
        """This thread's open table handles by table name."""
        handles: dict[str, DeltaTable] = self._local.__dict__.setdefault("handles", {})
        return handles

    def open(self, spec: TableSpec, *, create: bool) -> DeltaTable | None:
        """The table's handle at its latest version, or None if absent and `create` is False."""
        return self.open_in(self.handles(), spec, create=create)[0]

    def open_in(
        self,
        handles: dict[str, DeltaTable],
        spec: TableSpec,
        *,
        create: bool,
        app_ids: Sequence[str] = (),
    ) -> tuple[DeltaTable | None, frozenset[str]]:
        """`open` with the calling thread's handles passed in, so a helper thread can catch a
        handle up while its owner waits for it; also which of `app_ids` the table has recorded."""
        table = self._catch_up(handles, spec, create=create)
        if table is None or not app_ids:
            return table, frozenset()
        return table, frozenset(a for a in app_ids if table.transaction_version(a) is not None)

    def _catch_up(
        self, handles: dict[str, DeltaTable], spec: TableSpec, *, create: bool
    ) -> DeltaTable | None:
        cached = handles.get(spec.name)
        if cached is not None:
            # Catching up on new log entries is far cheaper than opening the table again.
            cached.update_incremental()
            return cached
        uri = self.table_uri(spec.name)
        options = self.storage_options or None
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            # A directory with a `_delta_log/` but no commit in it yet is a table another writer
            # is creating right now.
            if (
                not self.remote
                and Path(uri).is_dir()
                and any(Path(uri).iterdir())
                and not Path(uri, "_delta_log").is_dir()
            ):
                raise SchemaMismatchError(
                    f"{uri}: holds files but no Delta log (_delta_log/), so it is not a rollyard "
                    "table; move it out of the store root"
                )
            if not create:
                return None
            try:
                DeltaTable.create(
                    uri,
                    schema=spec.schema,
                    partition_by=list(spec.partition_by) or None,
                    mode="ignore",
                    name=spec.name,
                    description=spec.description,
                    configuration=_table_configuration(spec),
                    storage_options=options,
                )
            except Exception:
                # Another writer may be creating it at the same time; only that case is fine.
                deadline = time.monotonic() + 5.0
                while not DeltaTable.is_deltatable(uri, storage_options=options):
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.01)
        table = DeltaTable(uri, storage_options=options)
        _check_schema(spec, table, uri)
        handles[spec.name] = table
        return table

    def _bring_up_to_date(self, spec: TableSpec, table: DeltaTable) -> None:
        """Give the table (the handle, in place) the columns added since it was written
        (`TableSpec.added`) if it lacks them, before a writer commits to it: readers read an
        older table as it is, and only a writer changes it."""
        missing = _check_schema(spec, table, self.table_uri(spec.name))
        if missing:
            _add_columns(spec, table, missing)
        self._current.add(spec.name)

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
        try:
            # Writing through the handle read above makes a concurrent commit of the same app id
            # a conflict instead of a second copy.
            added = self.write_file(spec, data, uuid.uuid4().hex)
            self.commit_files(table, spec, [added], app_ids=[app_id], app_version=app_version)
        except CommitFailedError as error:
            fresh = self.open(spec, create=False)
            done = fresh.transaction_version(app_id) if fresh is not None else None
            if done is not None and done >= app_version:
                return False
            raise CommitError(
                f"{self.table_uri(spec.name)}: commit of {app_id} failed: {first_line(error)}"
            ) from error
        return True

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


def orphan_step_files(steps: DeltaTable, episodes: DeltaTable | None) -> set[str]:
    """Paths of steps files whose shard commit never reached the episodes table: no reader sees
    them."""
    step_actions = pa.table(steps.get_add_actions(flatten=True))
    if step_actions.num_rows == 0 or "min.commit_id" not in step_actions.column_names:
        return set()
    committed: set[tuple[Any, ...]] = set()
    if episodes is not None:
        episode_actions = pa.table(episodes.get_add_actions(flatten=True))
        if episode_actions.num_rows and "min.commit_id" in episode_actions.column_names:
            committed = set(
                zip(
                    episode_actions["partition.run_id"].to_pylist(),
                    episode_actions["partition.iteration"].to_pylist(),
                    episode_actions["min.commit_id"].to_pylist(),
                    strict=True,
                )
            )
    hidden: set[str] = set()
    for path, run_id, iteration, low, high in zip(
        step_actions["path"].to_pylist(),
        step_actions["partition.run_id"].to_pylist(),
        step_actions["partition.iteration"].to_pylist(),
        step_actions["min.commit_id"].to_pylist(),
        step_actions["max.commit_id"].to_pylist(),
        strict=True,
    ):
        # A file mixing commits (rewritten by compaction) only ever holds committed rows.
        if low == high and (run_id, iteration, low) not in committed:
            hidden.add(path)
    return hidden


@dataclass(frozen=True, slots=True)
class PendingShard:
    """A shard whose steps are committed and whose episodes are not (its writer was killed
    between the two commits, or is between them now)."""

    run_id: str
    iteration: int
    shard: int
    commit_id: str

    @property
    def app_id(self) -> str:
        """The shard's application transaction id."""
        return transaction_id("shard", self.run_id, self.iteration, self.shard)


def pending_shards(
    steps: DeltaTable, episodes: DeltaTable | None, *, app_ids: Collection[str] | None = None
) -> list[PendingShard]:
    """The shards whose steps the steps table holds under the shard's transaction id (its owner's
    commit) with no committed episodes, from the log without scanning data; with `app_ids`, only
    those shards, also finding ones whose owner committed no steps file (from the log's commit
    information, a slower read only a replay of such a shard needs)."""
    found: dict[str, PendingShard] = {}
    hidden = orphan_step_files(steps, episodes)
    if hidden:
        actions = pa.table(steps.get_add_actions(flatten=True))
        for path, run_id, iteration, shard, high_shard, commit_id in zip(
            actions["path"].to_pylist(),
            actions["partition.run_id"].to_pylist(),
            actions["partition.iteration"].to_pylist(),
            actions["min.shard"].to_pylist(),
            actions["max.shard"].to_pylist(),
            actions["min.commit_id"].to_pylist(),
            strict=True,
        ):
            if path not in hidden or shard != high_shard:
                continue
            pending = PendingShard(str(run_id), int(iteration), int(shard), str(commit_id))
            if app_ids is not None and pending.app_id not in app_ids:
                continue
            # Steps committed without the transaction id are a lost commit of an older store
            # layout, never completed (`vacuum` removes them).
            if steps.transaction_version(pending.app_id) is not None:
                found.setdefault(pending.app_id, pending)
    # Shards whose episodes are in are not pending (a winner that finished): only the rest are
    # looked for in the commit information.
    missing = {
        app_id
        for app_id in app_ids or ()
        if app_id not in found
        and (episodes is None or episodes.transaction_version(app_id) is None)
    }
    if missing:
        found.update(_pending_without_steps(steps, episodes, missing))
    return list(found.values())


def _pending_without_steps(
    steps: DeltaTable, episodes: DeltaTable | None, app_ids: set[str]
) -> dict[str, PendingShard]:
    """Pending shards among `app_ids` found from the steps log's commit information (the shard's
    commit id is recorded there even when the shard has no steps file)."""
    found: dict[str, PendingShard] = {}
    for commit in steps.history():
        shards = json.loads(commit.get("rollyard.shards", "[]"))
        commit_ids = json.loads(commit.get("rollyard.commit_ids", "[]"))
        for app_id, commit_id in zip(shards, commit_ids, strict=False):
            if app_id not in app_ids or app_id in found:
                continue
            _, run_id, iteration, shard = json.loads(app_id.removeprefix("rollyard:"))
            found[app_id] = PendingShard(run_id, int(iteration), int(shard), commit_id)
        if len(found) == len(app_ids):
            break
    return found


def _check_schema(spec: TableSpec, table: DeltaTable, uri: str) -> list[pa.Field]:
    """The fields of `spec` an older table lacks (columns added since, see `TableSpec.added`);
    raises for any other difference."""
    actual = pa.schema(table.schema().to_arrow())
    missing: list[pa.Field] = []
    for expected in spec.schema:
        index = actual.get_field_index(expected.name)
        if index < 0 and expected.name in spec.added_columns:
            missing.append(expected)
            continue
        if index < 0:
            raise SchemaMismatchError(
                f"{uri}: field {expected.name!r} is missing; rollyard schema "
                f"v{spec.version} of {spec.name!r} defines it as {expected.type}"
            )
        found = actual.field(index)
        if found.type != expected.type:
            raise SchemaMismatchError(
                f"{uri}: field {expected.name!r} is {found.type} in the table but rollyard "
                f"schema v{spec.version} of {spec.name!r} defines {expected.type}; the table "
                "was written by another version or tool"
            )
    extra = [name for name in actual.names if spec.schema.get_field_index(name) < 0]
    if extra:
        raise SchemaMismatchError(
            f"{uri}: field(s) {extra} are not in rollyard schema v{spec.version} of "
            f"{spec.name!r}; the table was written by another version or tool"
        )
    return missing


def _add_columns(spec: TableSpec, table: DeltaTable, missing: Sequence[pa.Field]) -> None:
    """Add the nullable columns an older table lacks (`missing`), in one metadata-only commit
    on the handle `table`: no file is rewritten, readers see nulls in the older files. Two
    writers doing this at once conflict; the loser finds the columns there."""
    try:
        table.alter.add_columns([DeltaField.from_arrow(field) for field in missing])
    except Exception:
        table.update_incremental()
        if _check_schema(spec, table, table.table_uri):
            raise


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
