"""The trajectory lakehouse: Delta Lake tables under one store root, queried by DuckDB.

Why Delta Lake (through `deltalake`): it gives atomic appends (a commit is one log file created
with put-if-absent, so a killed writer leaves only unreferenced Parquet files that no reader sees),
optimistic concurrency with automatic retry for concurrent appends, application transaction ids
(`txn` actions) that make a replayed commit detectable inside the same atomic step, and object
storage through the same code path. A home-made manifest would have to re-implement all four.

How a shard commit stays atomic across two tables. Delta commits one table at a time, so a shard is
committed in two steps: first its steps (tagged with a fresh `commit_id`), then its episodes, with
the shard's application transaction id in the same commit. The episodes commit is the commit point:

- replay: if the episodes table already holds the shard's transaction id, nothing is written;
- killed writer: steps whose (run_id, iteration, shard, commit_id) match no committed episodes are
  orphans, and every read of `steps` leaves their files out (decided from the Delta log's file
  statistics, without scanning data);
- two writers of the same shard: the second episodes commit fails Delta's conflict check on the
  transaction id, so exactly one wins, and the loser's steps are orphans (`vacuum` removes them
  from the table).

How a table write goes, and why (ingest speed). The store writes each shard's rows itself as one
zstd Parquet file per table (pyarrow; partition columns in the directory name and the log, as Delta
writers lay them out) and registers it with `DeltaTable.create_write_transaction`: one Delta commit
carrying the add actions, their file statistics and the transaction ids. Measured at about 500
commits in a table, a `write_deltalake` append took 45-145 ms (two or all columns with statistics);
now the file takes 5-10 ms and the commit 8-15 ms. A delta-rs commit costs mostly a replay of the
table's state: it reloads the state from the last checkpoint (hence `delta.checkpointInterval` 10:
longer intervals replay more JSON, shorter ones write checkpoints too often) and parses every live
file's statistics, so the two big tables keep statistics only for the two columns the store reads
from the log (`_STATS_COLUMNS`). The handle does not advance past its own commit, and a commit on a
stale handle costs far more (measured: about 140 ms ten versions behind, against 8 ms on a current
one), so each commit first catches both handles up with `update_incremental`, in helper threads
while the calling thread converts the records (the replay releases the GIL). Files reach storage
only once their shard is known not to be in, so a replay leaves no file behind.

Shards can be committed together (`_commit_group`): one steps commit adding every shard's steps
file, then one episodes commit adding every shard's episodes file with each shard's transaction
id. That is still all-or-nothing and exactly-once per shard, and pays for the catch-up and the two
commits once. `shard_writer()` does this for a caller committing many shards in sequence:
`ShardWriter.submit` converts a shard in the calling thread and queues it for one background
thread, which commits whatever has queued as one group while the caller converts the next shards
(or runs their rollouts). The background thread's work is nearly all native (Parquet encoding,
the Delta commits), but it needs the GIL between those calls, and while the caller's thread runs
Python each of those hand-overs can wait out the interpreter's switch interval (5 ms; measured: a
group commit of 8 shards that takes 12 ms alone took 460 ms beside a busy Python thread when its
files were encoded in memory and stored in separate calls). Hence one pyarrow call per file
(encode and write), and groups, which take fewer hand-overs per shard the more shards queue.

Compaction (`compact`) rewrites a finished iteration's committed steps files as one file in one
Delta commit (remove the old ones, add the new one), so the number of live files, which every
commit and every snapshot pays for, grows with iterations rather than shards; the train loop runs
it on each iteration it finishes.

Reads take one snapshot of every table when a reader is made (`connect`, `read_*`), so a query never
mixes versions. DuckDB reads the snapshot's live Parquet files of episodes and steps with its own
reader in a local store, and every other table (and remote stores) as Arrow datasets built from
the log (its delta extension needs a download).
Object storage: pass an `s3://`, `gs://` or `az://` root and `storage_options`; concurrent writers
on S3 need a locking provider configured in those options (see the deltalake docs).
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import threading
import time
import uuid
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import CommitProperties, DeltaTable, PostCommitHookProperties, Transaction
from deltalake import Schema as DeltaSchema
from deltalake.exceptions import CommitFailedError
from deltalake.transaction import AddAction, RemoveAction

from storage.errors import (
    CheckpointNotFoundError,
    CommitError,
    CorruptFileError,
    QueryError,
    RecordError,
    SchemaMismatchError,
    StoreNotFoundError,
)
from storage.queries import (
    DERIVED_VIEWS,
    NAMED_QUERIES,
    StoreConnection,
    export_directory,
    open_connection,
    refusal,
    restrict,
)
from storage.records import (
    NESTED_STEPS,
    GivenColumn,
    TableInput,
    conform,
    read_parquet_file,
    unnest_steps,
)
from storage.schemas import (
    CHECKPOINTS,
    EPISODES,
    GATES,
    METRICS,
    OBSERVATION_CAP_CHARS,
    REVIEW_VERDICTS,
    REVIEWS,
    STEPS,
    TABLES,
    TASKS,
    TableSpec,
)

if TYPE_CHECKING:
    import duckdb

DEFAULT_ROOT = ".rollyard"
# Tables DuckDB reads with its own Parquet reader in a local store (see `_register`).
_NATIVE_TABLES = ("episodes", "steps")
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"
_NESTED = frozenset({NESTED_STEPS})
# Delta retries a commit that lost a race to a non-conflicting one; many parallel shard writers
# need more than the library default.
MAX_COMMIT_RETRIES = 100
_CHECKPOINT_BLOBS = "checkpoint_blobs"
# Replaying the JSON log of a partitioned table made each commit slower as commits accumulated
# (20 ms -> 60 ms per commit by the 300th with the default interval of 100); a checkpoint every
# 10 commits kept it at 8-18 ms. Measured again with the store's own commits at 500 commits:
# interval 10 beat 1, 2, 5 and 25.
_TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}
# Every Delta commit and log replay parses the statistics of every live file, so their size sets
# the commit cost of the two big tables (measured at 500 commits: 13 ms with two stats columns,
# 27 ms with all 30). They keep statistics only for the columns the store reads from the log
# (which shard and commit attempt a file holds); partition values already prune by run and
# iteration. Other tables keep statistics on every column.
_STATS_COLUMNS: dict[str, tuple[str, ...]] = {
    "episodes": ("shard", "commit_id"),
    "steps": ("shard", "commit_id"),
}
# After each commit Delta writes a checkpoint when the table's interval says so; old log files
# are only removed past the default retention.
_POST_COMMIT = PostCommitHookProperties(create_checkpoint=True)
# Parquet statistics (min/max per row group) skip nothing on free text and random ids, and
# computing them for strings took a sixth of a steps file's encoding time.
_NO_PARQUET_STATISTICS: dict[str, frozenset[str]] = {
    "steps": frozenset({"episode_id", "action_kind", "action_text", "observation"}),
}
# Dictionary encoding where it pays (repeated ids and kinds); off for columns of mostly distinct
# values, where it costs write time and saves nothing. True means every column.
_DICTIONARY_COLUMNS: dict[str, bool | list[str]] = {
    "steps": ["episode_id", "commit_id", "shard", "action_kind", "action_text", "observation"],
}


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
class _PreparedShard:
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


@dataclass(frozen=True, slots=True)
class VacuumResult:
    """What `TrajectoryStore.vacuum` did: steps files removed from the table (and their rows),
    and files Delta's vacuum deleted from storage."""

    removed_files: tuple[str, ...]
    removed_rows: int
    deleted_files: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CompactResult:
    """What `TrajectoryStore.compact` did: the (run_id, iteration) partitions of the steps table
    rewritten, how many files they held before and after, and the rows moved."""

    partitions: tuple[tuple[str, int], ...]
    files_before: int
    files_after: int
    rows: int


@dataclass(frozen=True, slots=True)
class GateResult:
    """One expectation's outcome in a quality-gate evaluation."""

    expectation: str
    success: bool
    observed: str | None = None
    details: str | None = None


@dataclass(frozen=True, slots=True)
class IterationStatus:
    """Whether an iteration's data may be trained on, and why not."""

    run_id: str
    iteration: int
    quarantined: bool
    reasons: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """The metadata row of a stored checkpoint."""

    run_id: str
    policy_version: str
    parent_policy_version: str | None
    iteration: int
    trained_on_iterations: tuple[int, ...]
    n_episodes: int
    blob_path: str
    sha256: str
    size_bytes: int
    metadata: Mapping[str, Any]
    created_at: datetime


def _table_configuration(spec: TableSpec) -> dict[str, str | None]:
    configuration: dict[str, str | None] = dict(_TABLE_CONFIGURATION)
    columns = _STATS_COLUMNS.get(spec.name)
    if columns is not None:
        # Tells other Delta writers (compaction, say) to collect the same statistics.
        configuration["delta.dataSkippingStatsColumns"] = ",".join(columns)
    return configuration


def _app_id(*parts: object) -> str:
    # JSON keeps the parts unambiguous whatever characters a run id holds.
    return "rollyard:" + json.dumps([str(part) for part in parts], separators=(",", ":"))


def _now() -> datetime:
    return datetime.now(UTC)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def _escape_partition(value: str) -> str:
    """A partition value as a directory name (percent-encoded, as Hive and Delta writers do).

    Only cosmetic: readers take partition values from the log, so an over-long value is cut and
    given a digest to keep file names within filesystem limits.
    """
    escaped = quote(value, safe="-_.~")
    if len(escaped) > 120:
        import hashlib

        escaped = escaped[:80] + "-" + hashlib.sha256(value.encode()).hexdigest()[:16]
    return escaped


def _stat_value(value: Any) -> Any:
    """A Parquet statistic as a Delta stats JSON value, or None where it cannot be one."""
    if isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, str):
        # Long strings would need Delta's truncation rules for max values; skip them.
        return value if len(value) <= 64 else None
    if isinstance(value, datetime):
        # Delta statistics are UTC; a timestamp without a zone is taken as UTC, as Delta does.
        value = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        return value.strftime("%Y-%m-%dT%H:%M:%S.") + f"{value.microsecond // 1000:03d}Z"
    return None


def _file_stats(metadata: pq.FileMetaData, schema: pa.Schema, columns: Sequence[str] | None) -> str:
    """Delta file statistics (numRecords, min/max, null counts) from the written file's footer.

    For `columns`, or every top-level primitive column when None; a column without usable
    statistics in some row group gets none (readers then simply cannot skip on it).
    """
    wanted = {
        name
        for name in (schema.names if columns is None else columns)
        if name in schema.names and not pa.types.is_nested(schema.field(name).type)
    }
    minimum: dict[str, Any] = {}
    maximum: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    unknown: set[str] = set()
    for group_index in range(metadata.num_row_groups):
        group = metadata.row_group(group_index)
        for column_index in range(group.num_columns):
            column = group.column(column_index)
            name = column.path_in_schema
            if name not in wanted or name in unknown:
                continue
            statistics = column.statistics
            if statistics is None or not statistics.has_null_count:
                unknown.add(name)
                continue
            nulls[name] = nulls.get(name, 0) + statistics.null_count
            if not statistics.has_min_max:
                if statistics.null_count != group.num_rows:
                    unknown.add(name)
                continue
            low, high = _stat_value(statistics.min), _stat_value(statistics.max)
            if low is None or high is None:
                unknown.add(name)
                continue
            if name not in minimum or low < minimum[name]:
                minimum[name] = low
            if name not in maximum or high > maximum[name]:
                maximum[name] = high
    for name in unknown:
        minimum.pop(name, None)
        maximum.pop(name, None)
        nulls.pop(name, None)
    return json.dumps(
        {
            "numRecords": metadata.num_rows,
            "minValues": minimum,
            "maxValues": maximum,
            "nullCount": nulls,
        },
        separators=(",", ":"),
    )


class TrajectoryStore:
    """A store root holding the tables episodes, steps, tasks, gates, metrics and checkpoints.

    `root` is a local directory (created on first write unless `create=False`) or an object-storage
    URI. Instances hold no open handles, so they are cheap to make in each worker and pickle.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = DEFAULT_ROOT,
        *,
        storage_options: Mapping[str, str] | None = None,
        create: bool = True,
    ) -> None:
        text = os.fspath(root)
        self._remote = "://" in text and not text.startswith("file://")
        self._storage_options = dict(storage_options or {})
        if self._remote:
            self.root = text.rstrip("/")
        else:
            path = Path(text.removeprefix("file://")).absolute()
            if not path.exists():
                if not create:
                    raise StoreNotFoundError(
                        f"{path}: no store here; pass the directory that holds the tables "
                        "(episodes/, steps/, ...) or write to it first"
                    )
                path.mkdir(parents=True, exist_ok=True)
            elif not path.is_dir():
                raise StoreNotFoundError(f"{path}: is a file, not a store directory")
            self.root = str(path)
        # Open table handles, per thread: a handle is not meant to be shared across threads.
        self._local = threading.local()
        # Partition directories known to exist (local roots), so writes skip the mkdir.
        self._directories: set[tuple[str, str]] = set()
        # Table handles of closed shard writers, for the next writer (a handle that only catches
        # up is far cheaper than opening the table again).
        self._spare_handles: list[dict[str, DeltaTable]] = []
        self._spare_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TrajectoryStore({self.root!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_store, (self.root, self._storage_options))

    # ---- tables -------------------------------------------------------------------------------

    def table_uri(self, name: str) -> str:
        """Where table `name` lives (a local path or a URI)."""
        return f"{self.root}/{name}"

    def _take_handles(self) -> dict[str, DeltaTable]:
        """Table handles for a shard writer's thread: a closed writer's, or none yet."""
        with self._spare_lock:
            return self._spare_handles.pop() if self._spare_handles else {}

    def _give_back_handles(self, handles: dict[str, DeltaTable]) -> None:
        with self._spare_lock:
            self._spare_handles.append(handles)

    def _handles(self) -> dict[str, DeltaTable]:
        """This thread's open table handles by table name."""
        handles: dict[str, DeltaTable] = self._local.__dict__.setdefault("handles", {})
        return handles

    def _open(self, spec: TableSpec, *, create: bool) -> DeltaTable | None:
        """The table's handle at its latest version, or None if absent and `create` is False."""
        return self._open_in(self._handles(), spec, create=create)[0]

    def _open_in(
        self,
        handles: dict[str, DeltaTable],
        spec: TableSpec,
        *,
        create: bool,
        app_ids: Sequence[str] = (),
    ) -> tuple[DeltaTable | None, frozenset[str]]:
        """`_open` with the calling thread's handles passed in, so a helper thread can catch a
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
        options = self._storage_options or None
        if not DeltaTable.is_deltatable(uri, storage_options=options):
            # A directory with a `_delta_log/` but no commit in it yet is a table another writer
            # is creating right now.
            if (
                not self._remote
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
        self._check_schema(spec, table, uri)
        handles[spec.name] = table
        return table

    def _check_schema(self, spec: TableSpec, table: DeltaTable, uri: str) -> None:
        actual = pa.schema(table.schema().to_arrow())
        for expected in spec.schema:
            index = actual.get_field_index(expected.name)
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

    def _filesystem(self, uri: str) -> pafs.FileSystem:
        # pyarrow's own filesystems: reading through deltalake's Python filesystem handler aborts
        # the interpreter at exit ("terminate called without an active exception").
        if self._remote:
            base, path = pafs.FileSystem.from_uri(uri)
            return pafs.SubTreeFileSystem(path, base)
        return pafs.SubTreeFileSystem(uri, pafs.LocalFileSystem())

    def _write(
        self,
        table: DeltaTable,
        data: pa.Table | None,
        *,
        spec: TableSpec,
        app_ids: Sequence[str] = (),
        app_version: int = 1,
        metadata: Mapping[str, str] | None = None,
        name: str | None = None,
        partition: Mapping[str, Any] | None = None,
        written: Sequence[AddAction] | None = None,
    ) -> None:
        """Add files to the table in one Delta commit: `data` written as one Parquet file, or the
        files in `written`, already written with `_write_file`.

        The commit carries the application transaction ids `app_ids` (at `app_version`). `data`
        holds one partition (every caller writes one key's rows). A writer killed before the
        commit leaves only files the log does not reference, which no reader sees.
        """
        if written is None:
            assert data is not None
            written = [self._write_file(spec, data, name or uuid.uuid4().hex, partition)]
        table.create_write_transaction(
            list(written),
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

    def _write_file(
        self,
        spec: TableSpec,
        data: pa.Table,
        name: str,
        partition: Mapping[str, Any] | None = None,
    ) -> AddAction:
        """Write `data` as one zstd Parquet file inside the table's directory; the action adding
        it to the table, with its statistics.

        Laid out as Delta writers do: partition columns live in the directory name and the log's
        partition values, not in the file. `partition` gives their values when the caller knows
        them (the commit key, already checked on every row). Encoded and written by one pyarrow
        call, which holds the GIL only briefly: a shard writer's thread does this while the
        caller's thread converts records, and each time a thread takes the GIL back it may wait
        out the other's switch interval (5 ms).
        """
        partition_values: dict[str, str | None] = {}
        directory = ""
        if spec.partition_by:
            if data.num_rows == 0:
                raise CommitError(f"{self.table_uri(spec.name)}: no rows to write")
            for column in spec.partition_by:
                if partition is not None:
                    value = partition[column]
                else:
                    values = data.column(column)
                    value = values[0].as_py()
                    if pc.count_distinct(values).as_py() != 1:
                        raise CommitError(
                            f"{self.table_uri(spec.name)}: one write must hold one {column}"
                        )
                partition_values[column] = str(value)
                directory += f"{column}={_escape_partition(str(value))}/"
            data = data.drop_columns(list(spec.partition_by))
        relative = f"{directory}part-{name}.zstd.parquet"
        filesystem = self._filesystem(self.table_uri(spec.name))
        if directory and not self._remote and (spec.name, directory) not in self._directories:
            filesystem.create_dir(directory.rstrip("/"), recursive=True)
            self._directories.add((spec.name, directory))
        try:
            stream = filesystem.open_output_stream(relative)
        except FileNotFoundError:  # the directory went away since it was made
            filesystem.create_dir(directory.rstrip("/"), recursive=True)
            stream = filesystem.open_output_stream(relative)
        collector: list[pq.FileMetaData] = []
        unindexed = _NO_PARQUET_STATISTICS.get(spec.name, frozenset())
        with stream:
            pq.write_table(
                data,
                stream,
                compression="zstd",
                use_dictionary=_DICTIONARY_COLUMNS.get(spec.name, True),
                write_statistics=[name for name in data.column_names if name not in unindexed],
                metadata_collector=collector,
            )
            size = stream.tell()
        return AddAction(
            # The path as on the filesystem: delta-rs percent-encodes it into the log.
            path=relative,
            size=size,
            partition_values=partition_values,
            modification_time=int(time.time() * 1000),
            data_change=True,
            stats=_file_stats(collector[0], data.schema, _STATS_COLUMNS.get(spec.name)),
        )

    def _append_once(
        self, spec: TableSpec, data: pa.Table, *, app_id: str, app_version: int = 1
    ) -> bool:
        """Append `data` unless the table already holds `app_id` at `app_version` or later."""
        table = self._open(spec, create=True)
        assert table is not None
        done = table.transaction_version(app_id)
        if done is not None and done >= app_version:
            return False
        try:
            # Writing through the handle read above makes a concurrent commit of the same app id
            # a conflict instead of a second copy.
            self._write(table, data, spec=spec, app_ids=[app_id], app_version=app_version)
        except CommitFailedError as error:
            fresh = self._open(spec, create=False)
            done = fresh.transaction_version(app_id) if fresh is not None else None
            if done is not None and done >= app_version:
                return False
            raise CommitError(
                f"{self.table_uri(spec.name)}: commit of {app_id} failed: {_first_line(error)}"
            ) from error
        return True

    # ---- episodes and steps ---------------------------------------------------------------------

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
        after another can overlap them with `shard_writer`.
        """
        # Both table handles catch up on the log in helper threads (Delta's log replay releases
        # the GIL), and the episodes table is asked whether the shard is in, while this thread
        # converts and checks the records.
        handles = self._handles()
        catching_up = self._start_catch_up(handles, [_app_id("shard", run_id, iteration, shard)])
        try:
            prepared = self._prepare_shard(run_id, iteration, shard, episodes, steps)
        finally:
            wait(catching_up)
        return self._commit_group([prepared], handles, catching_up)[0]

    def shard_writer(self, *, max_in_flight: int = 16) -> ShardWriter:
        """A writer that commits shards on a background thread while the caller goes on.

        For a caller that commits many shards one after another: `submit` converts and checks a
        shard in the calling thread and hands it to the writer's thread, so converting shard N+1
        (or running its rollouts) overlaps the commit of shard N, and shards that queue meanwhile
        share one commit, each still exactly-once and all-or-nothing. See `ShardWriter`.
        """
        return ShardWriter(self, max_in_flight=max_in_flight)

    def _start_catch_up(
        self, handles: dict[str, DeltaTable], app_ids: Sequence[str]
    ) -> list[Future[tuple[DeltaTable | None, frozenset[str]]]]:
        """Catch the episodes and steps handles in `handles` up, in helper threads; the episodes
        one also finds which of `app_ids` are in."""
        return [
            _helpers().submit(self._open_in, handles, EPISODES, create=False, app_ids=app_ids),
            _helpers().submit(self._open_in, handles, STEPS, create=False),
        ]

    def _prepare_shard(
        self, run_id: str, iteration: int, shard: int, episodes: TableInput, steps: TableInput
    ) -> _PreparedShard:
        """A shard's records converted and checked, with a fresh commit id: all of a shard
        commit that needs no table."""
        source = f"shard (run_id={run_id!r}, iteration={iteration}, shard={shard})"
        commit_id = uuid.uuid4().hex[:20]
        key = {"run_id": run_id, "iteration": iteration, "shard": shard}
        episode_table, step_table = self._shard_tables(
            episodes, steps, key=key, overwrite={"commit_id": commit_id}, source=source
        )
        return _PreparedShard(
            run_id=run_id,
            iteration=iteration,
            shard=shard,
            source=source,
            commit_id=commit_id,
            app_id=_app_id("shard", run_id, iteration, shard),
            episodes=episode_table,
            steps=step_table,
        )

    def _commit_group(
        self,
        group: Sequence[_PreparedShard],
        handles: dict[str, DeltaTable],
        catching_up: list[Future[tuple[DeltaTable | None, frozenset[str]]]] | None = None,
    ) -> list[CommitResult]:
        """Commit prepared shards together, one result per shard in order: all their steps files
        in one steps commit, then all their episodes files in one episodes commit carrying every
        shard's transaction id, the commit point of each.

        Each shard stays what a commit of its own makes it: all of it visible or none (one Delta
        commit adds all of its episodes), exactly once (a shard already in, or given twice, is
        skipped, and its files never reach storage; one a concurrent writer commits first makes
        the commit fail Delta's check on its transaction id, and the rest are committed again
        without it). Committing shards together pays for the catch-up and the two commits once
        (`ShardWriter` groups what has queued). `handles` are table handles only this thread uses
        while it runs; `catching_up`, those handles being caught up (`_start_catch_up`), started
        when not given.
        """
        if catching_up is None:
            catching_up = self._start_catch_up(handles, [p.app_id for p in group])
        wait(catching_up)
        (episodes_table, done), (steps_table, _) = (future.result() for future in catching_up)
        todo: dict[str, _PreparedShard] = {}
        for prepared in group:
            if prepared.app_id not in done:
                todo.setdefault(prepared.app_id, prepared)
        committed: set[str] = set()
        if todo:
            committed = self._commit_new_shards(
                list(todo.values()), handles, episodes_table, steps_table
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
        shards: list[_PreparedShard],
        handles: dict[str, DeltaTable],
        episodes_table: DeltaTable | None,
        steps_table: DeltaTable | None,
    ) -> set[str]:
        """The two commits of `_commit_group` for shards not in the table when it was caught up;
        the transaction ids this call committed (those a concurrent writer won are left out)."""
        metadata = {
            "rollyard.shards": json.dumps([p.app_id for p in shards]),
            "rollyard.commit_ids": json.dumps([p.commit_id for p in shards]),
        }
        if episodes_table is None:
            episodes_table, _ = self._open_in(handles, EPISODES, create=True)
            assert episodes_table is not None
        # Written now, every file stays invisible until its table's commit adds it; the
        # episodes commit is each shard's commit point. The episodes files are written in a
        # helper thread while the steps files are written and committed.
        episodes_files = _helpers().submit(
            lambda: [
                self._write_file(EPISODES, p.episodes, p.commit_id, p.partition) for p in shards
            ]
        )
        try:
            with_steps = [p for p in shards if p.steps.num_rows]
            if with_steps:
                if steps_table is None:
                    steps_table, _ = self._open_in(handles, STEPS, create=True)
                assert steps_table is not None
                step_adds = [
                    self._write_file(STEPS, p.steps, p.commit_id, p.partition) for p in with_steps
                ]
                self._write(steps_table, None, spec=STEPS, metadata=metadata, written=step_adds)
        finally:
            wait([episodes_files])
        added = dict(zip((p.app_id for p in shards), episodes_files.result(), strict=True))
        remaining = list(added)
        while True:
            try:
                self._write(
                    episodes_table,
                    None,
                    spec=EPISODES,
                    app_ids=remaining,
                    metadata=metadata,
                    written=[added[app_id] for app_id in remaining],
                )
                return set(remaining)
            except CommitFailedError as error:
                # Another writer committed some of these shards first: commit the others again
                # without them (their steps files are orphans, left out of every read). If it
                # committed none of them, the failure is something else.
                fresh, won = self._open_in(handles, EPISODES, create=False, app_ids=remaining)
                if fresh is None or not won:
                    sources = ", ".join(p.source for p in shards if p.app_id in remaining)
                    raise CommitError(
                        f"{self.table_uri('episodes')}: commit of {sources} failed: "
                        f"{_first_line(error)}; retry the commit, it is safe to replay"
                    ) from error
                episodes_table = fresh
                remaining = [app_id for app_id in remaining if app_id not in won]
                if not remaining:
                    return set()

    def _shard_tables(
        self,
        episodes: TableInput,
        steps: TableInput,
        *,
        key: Mapping[str, Any],
        overwrite: Mapping[str, Any],
        source: str,
    ) -> tuple[pa.Table, pa.Table]:
        """A shard's records as checked episodes and steps tables (steps capped)."""
        nested = unnest_steps(episodes, f"episodes of {source}")
        if nested is not None and (
            isinstance(steps, pa.Table | pa.RecordBatch | str | os.PathLike) or steps
        ):
            raise RecordError(
                f"{source}: steps given both nested in the episodes and as `steps`; pass them "
                "one way"
            )
        episode_table = conform(
            EPISODES,
            episodes,
            key=key,
            overwrite=overwrite,
            source=f"episodes of {source}",
            ignore=_NESTED if nested is not None else frozenset(),
        )
        owners: dict[str, GivenColumn] | None = None
        if nested is not None:
            steps, owner_ids, counts = nested
            # Nested steps take their episode's id: the converted ids, repeated, instead of
            # converting the same strings again for every step.
            positions = np.repeat(np.arange(len(counts)), counts)
            owners = {
                "episode_id": GivenColumn(
                    owner_ids, episode_table.column("episode_id").combine_chunks().take(positions)
                )
            }
        step_table = conform(
            STEPS, steps, key=key, overwrite=overwrite, source=f"steps of {source}", given=owners
        )
        _check_shard(episode_table, step_table, source)
        return episode_table, _cap_observations(step_table)

    def is_committed(self, run_id: str, iteration: int, shard: int) -> bool:
        """Whether (run_id, iteration, shard) has been committed."""
        table = self._open(EPISODES, create=False)
        if table is None:
            return False
        return table.transaction_version(_app_id("shard", run_id, iteration, shard)) is not None

    def vacuum(
        self,
        *,
        uncommitted_older_than: timedelta | None = None,
        retention_hours: int | None = None,
    ) -> VacuumResult:
        """Remove steps that no reader will ever see, in one Delta commit on the steps table.

        Always removed: steps files of shard commits that lost, i.e. whose shard is committed
        under another commit id (a losing concurrent writer, or a killed writer whose shard was
        replayed); their writer can never commit them. With `uncommitted_older_than`, also steps
        files of shards not committed at all and older than that (a killed writer's that nobody
        replayed); pass it only when no writer of those shards can still be running, since a
        writer between its steps commit and its episodes commit looks just like that.

        Readers hide these files anyway; removing them keeps the raw Delta table (as other
        engines read it) free of them. The files stay on disk for time travel until Delta's
        vacuum deletes them: with `retention_hours`, that runs on both tables afterwards and
        deletes removed files and files never committed (a killed writer's Parquet files) older
        than that many hours. A running writer's file is uncommitted until its commit, so keep
        `retention_hours` above the longest a commit can take (0 only with no writer running).
        """
        steps = self._open(STEPS, create=False)
        episodes = self._open(EPISODES, create=False)
        if steps is None:
            return VacuumResult((), 0, ())
        cutoff = None
        if uncommitted_older_than is not None:
            cutoff = int((_now() - uncommitted_older_than).timestamp() * 1000)
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
            self._rearrange_steps(steps, removals, "vacuum orphaned steps")
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
        return VacuumResult(tuple(unquote(r["path"]) for r in dead), rows, tuple(deleted))

    def compact(
        self, run_id: str | None = None, iteration: int | None = None, *, min_files: int = 2
    ) -> CompactResult:
        """Rewrite the committed steps of each (run_id, iteration) partition holding at least
        `min_files` files as one file, one Delta commit per partition (remove the old files, add
        the new one, as a rearrangement: `dataChange` false). Optionally for one run or iteration.

        A shard commit writes one steps file, so a table gets a file per shard; every Delta commit
        and every reader's snapshot pays for each live file (see the module notes), and so does
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
        steps = self._open(STEPS, create=False)
        if steps is None:
            return CompactResult((), 0, 0, 0)
        episodes = self._open(EPISODES, create=False)
        actions = pa.table(steps.get_add_actions(flatten=True))
        if actions.num_rows == 0:
            return CompactResult((), 0, 0, 0)
        left_out = _orphan_step_files(steps, episodes) | {
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
        filesystem = self._filesystem(self.table_uri(STEPS.name))
        done: list[tuple[str, int]] = []
        files_before = rows = 0
        for key, files in sorted(by_partition.items()):
            if len(files) < min_files:
                continue
            rows += self._compact_partition(steps, filesystem, key, files)
            done.append(key)
            files_before += len(files)
        return CompactResult(tuple(done), files_before, len(done), rows)

    def _compact_partition(
        self,
        steps: DeltaTable,
        filesystem: pafs.FileSystem,
        key: tuple[str, int],
        files: list[dict[str, Any]],
    ) -> int:
        """Merge one partition's `files` (add-action rows) into one file in one commit; the
        number of rows moved."""
        uri = self.table_uri(STEPS.name)
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
                f"{self.table_uri('steps')}: partition run_id={key[0]!r} iteration={key[1]} "
                f"reads {merged.num_rows} rows but the log records {expected}; not compacted"
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
        added = self._write_file(STEPS, table, f"compacted-{uuid.uuid4().hex[:20]}", partition)
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
            self._rearrange_steps(
                steps, [*removed, dataclasses.replace(added, data_change=False)], "compact steps"
            )
        except CommitFailedError as error:
            raise CommitError(
                f"{self.table_uri('steps')}: compacting run_id={key[0]!r} iteration={key[1]} "
                f"conflicted with another change to its files ({_first_line(error)}); run it "
                "again"
            ) from error
        return int(table.num_rows)

    def _rearrange_steps(
        self, steps: DeltaTable, actions: Sequence[AddAction | RemoveAction], operation: str
    ) -> None:
        """One maintenance commit on the steps table (files removed or replaced, no shard's
        transaction), named in the log by `operation`."""
        steps.create_write_transaction(
            list(actions),
            "append",
            self._delta_schema(STEPS, steps),
            list(STEPS.partition_by),
            commit_properties=CommitProperties(
                custom_metadata={"rollyard.operation": operation},
                max_commit_retries=MAX_COMMIT_RETRIES,
            ),
            post_commithook_properties=_POST_COMMIT,
        )

    def committed_shards(self, run_id: str, iteration: int) -> list[int]:
        """The shards of an iteration that are committed (read from the log, no data scan)."""
        table = self._open(EPISODES, create=False)
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

    def read_episodes(
        self,
        run_id: str | None = None,
        iteration: int | None = None,
        *,
        include_quarantined: bool = False,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Committed episodes, by default only of iterations no quality gate quarantined.

        This is what the trainer consumes: `read_episodes(run_id, iteration)`.
        """
        dataset = self._datasets(("episodes",))["episodes"]
        condition = _key_filter(run_id, iteration)
        if not include_quarantined:
            for q_run, q_iteration in self.quarantined_iterations(run_id):
                excluded = (pads.field("run_id") == q_run) & (
                    pads.field("iteration") == q_iteration
                )
                condition = ~excluded if condition is None else condition & ~excluded
        return self._scan(dataset, "episodes", condition, columns)

    def read_steps(
        self,
        run_id: str | None = None,
        iteration: int | None = None,
        *,
        episode_ids: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Committed steps, optionally of some episodes, ordered by (episode_id, step)."""
        dataset = self._datasets(("steps",))["steps"]
        condition = _key_filter(run_id, iteration)
        if episode_ids is not None:
            chosen = pads.field("episode_id").isin(pa.array(list(episode_ids), pa.string()))
            condition = chosen if condition is None else condition & chosen
        table = self._scan(dataset, "steps", condition, columns)
        if {"episode_id", "step"} <= set(table.column_names):
            table = table.sort_by([("episode_id", "ascending"), ("step", "ascending")])
        return table

    def _scan(
        self,
        dataset: pads.Dataset,
        name: str,
        condition: pads.Expression | None,
        columns: Sequence[str] | None,
    ) -> pa.Table:
        try:
            return dataset.to_table(
                columns=list(columns) if columns is not None else None, filter=condition
            )
        except (pa.ArrowException, OSError) as error:
            self._raise_if_corrupt((name,))
            raise QueryError(f"reading {self.table_uri(name)}: {_first_line(error)}") from error

    # ---- quality gates --------------------------------------------------------------------------

    def record_gates(
        self,
        run_id: str,
        iteration: int,
        suite: str,
        results: Sequence[GateResult],
        *,
        quarantined: bool,
        reason: str | None = None,
        evaluation: int = 0,
    ) -> bool:
        """Record one evaluation of a gate suite and its verdict for an iteration.

        A quarantined iteration keeps its data; `read_episodes` and the `training_episodes` view
        leave it out. The latest `evaluation` of each suite decides, so lifting a quarantine is
        recording a later evaluation with `quarantined=False`. Replays of the same evaluation
        write nothing (returns False).
        """
        evaluated_at = _now()
        rows: list[dict[str, Any]] = [
            {
                "kind": "expectation",
                "expectation": r.expectation,
                "success": r.success,
                "observed": r.observed,
                "details": r.details,
            }
            for r in results
        ]
        rows.append(
            {"kind": "verdict", "expectation": suite, "success": not quarantined, "reason": reason}
        )
        for row in rows:
            row.update(
                run_id=run_id,
                iteration=iteration,
                suite=suite,
                quarantined=quarantined,
                evaluation=evaluation,
                evaluated_at=evaluated_at,
            )
        source = f"gates of (run_id={run_id!r}, iteration={iteration}, suite={suite!r})"
        data = conform(GATES, rows, key={}, source=source)
        return self._append_once(
            GATES,
            data,
            app_id=_app_id("gates", run_id, iteration, suite),
            app_version=evaluation + 1,
        )

    def mark_quarantined(
        self,
        run_id: str,
        iteration: int,
        *,
        reason: str,
        quarantined: bool = True,
        suite: str = "manual",
        evaluation: int = 0,
    ) -> bool:
        """Quarantine (or, with `quarantined=False`, release) an iteration by hand."""
        return self.record_gates(
            run_id,
            iteration,
            suite,
            (),
            quarantined=quarantined,
            reason=reason,
            evaluation=evaluation,
        )

    def quarantined_iterations(self, run_id: str | None = None) -> list[tuple[str, int]]:
        """(run_id, iteration) pairs whose latest verdict of some suite is quarantined."""
        sql = "SELECT DISTINCT run_id, iteration FROM gate_verdicts WHERE quarantined"
        with self._connection(("gates",)) as con:
            rows = con.sql(sql).fetchall()
        return sorted((str(r), int(i)) for r, i in rows if run_id is None or r == run_id)

    def iteration_status(self, run_id: str, iteration: int) -> IterationStatus:
        """Whether the trainer may consume an iteration, and the reasons if not."""
        sql = """SELECT suite, reason FROM gate_verdicts
                 WHERE quarantined AND run_id = ? AND iteration = ? ORDER BY suite"""
        with self._connection(("gates",)) as con:
            rows = con.execute(sql, [run_id, iteration]).fetchall()
        reasons = tuple(f"{suite}: {reason or 'no reason given'}" for suite, reason in rows)
        return IterationStatus(run_id, iteration, bool(rows), reasons)

    # ---- metrics and tasks ----------------------------------------------------------------------

    def record_metrics(
        self,
        run_id: str,
        iteration: int,
        values: Mapping[str, float | None],
        *,
        source: str = "trainer",
    ) -> bool:
        """Append one iteration's metrics from one source, once (a replay writes nothing)."""
        recorded_at = _now()
        rows = [
            {
                "run_id": run_id,
                "iteration": iteration,
                "source": source,
                "name": name,
                "value": None if value is None else float(value),
                "recorded_at": recorded_at,
            }
            for name, value in values.items()
        ]
        data = conform(METRICS, rows, key={}, source=f"metrics of run {run_id!r}")
        return self._append_once(
            METRICS, data, app_id=_app_id("metrics", run_id, iteration, source)
        )

    def record_tasks(self, tasks: TableInput, *, batch_id: str) -> bool:
        """Append task catalog / curation rows as one batch, once per `batch_id`.

        The latest row per (task_id, task_version) is what the `tasks_latest` view shows.
        """
        data = conform(
            TASKS,
            tasks,
            key={},
            source=f"tasks batch {batch_id!r}",
            overwrite={"batch_id": batch_id, "recorded_at": _now()},
        )
        return self._append_once(TASKS, data, app_id=_app_id("tasks", batch_id))

    # ---- human reviews --------------------------------------------------------------------------

    def record_review(
        self,
        episode_id: str,
        verdict: str,
        *,
        reviewer: str,
        note: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> str:
        """Record a reviewer's verdict (`agree` / `disagree` with the episode's reward); returns
        the review id. `context` fills the episode's fields (run_id, iteration, task_id,
        task_version, family, verifier, reward, episode_status); missing ones are read from the
        episodes table. Recording the same verdict and note again writes nothing."""
        if verdict not in REVIEW_VERDICTS:
            raise RecordError(
                f"review verdict {verdict!r} for episode {episode_id!r}; use one of "
                f"{', '.join(REVIEW_VERDICTS)}"
            )
        if not reviewer.strip():
            raise RecordError("a review needs a reviewer name; pass reviewer='...'")
        row: dict[str, Any] = dict(self._episode_context(episode_id))
        row.update({k: v for k, v in (context or {}).items() if v is not None})
        review_id = (
            "review-"
            + uuid.uuid5(
                uuid.NAMESPACE_URL, json.dumps([episode_id, reviewer, verdict, note or ""])
            ).hex
        )
        row.update(
            review_id=review_id,
            episode_id=episode_id,
            verdict=verdict,
            note=note,
            reviewer=reviewer,
            reviewed_at=_now(),
        )
        data = conform(REVIEWS, [row], key={}, source=f"review of episode {episode_id!r}")
        self._append_once(REVIEWS, data, app_id=_app_id("review", review_id))
        return review_id

    def _episode_context(self, episode_id: str) -> dict[str, Any]:
        sql = """
            SELECT e.run_id, e.iteration, e.task_id, e.task_version, t.family,
                   e.reward, e.status AS episode_status
            FROM episodes e
            LEFT JOIN (SELECT task_id, task_version, family FROM tasks_latest) t
                   USING (task_id, task_version)
            WHERE e.episode_id = ?
            LIMIT 1
        """
        rows = self.query(sql, [episode_id]).to_pylist()
        return rows[0] if rows else {}

    def read_reviews(self) -> pa.Table:
        """Every reviewer's latest verdict per episode."""
        return self.query("SELECT * FROM reviews_latest ORDER BY reviewed_at, review_id")

    # ---- checkpoints ----------------------------------------------------------------------------

    def save_checkpoint(
        self,
        run_id: str,
        policy_version: str,
        state_dict: Mapping[str, Any],
        *,
        iteration: int,
        trained_on_iterations: Sequence[int] = (),
        n_episodes: int = 0,
        parent_policy_version: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo:
        """Store a torch state dict for (run_id, policy_version), once; returns its metadata.

        The weights go to a content-addressed blob, so a replay or a crash before the metadata
        commit leaves at most an unreferenced blob. Saving a version that exists returns the
        existing record unchanged.
        """
        import torch  # torch is heavy; only checkpoint users pay for it

        existing = self._find_checkpoint(run_id, policy_version)
        if existing is not None:
            return existing
        buffer = io.BytesIO()
        torch.save(dict(state_dict), buffer)
        payload = buffer.getvalue()
        import hashlib

        digest = hashlib.sha256(payload).hexdigest()
        blob_path = f"{_CHECKPOINT_BLOBS}/{digest[:2]}/{digest}.pt"
        self._put_blob(blob_path, payload)
        row = {
            "run_id": run_id,
            "policy_version": policy_version,
            "parent_policy_version": parent_policy_version,
            "iteration": iteration,
            "trained_on_iterations": list(trained_on_iterations),
            "n_episodes": n_episodes,
            "blob_path": blob_path,
            "sha256": digest,
            "size_bytes": len(payload),
            "metadata": json.dumps(dict(metadata or {}), sort_keys=True),
            "created_at": _now(),
        }
        data = conform(CHECKPOINTS, [row], key={}, source=f"checkpoint {run_id}/{policy_version}")
        self._append_once(CHECKPOINTS, data, app_id=_app_id("checkpoint", run_id, policy_version))
        found = self._find_checkpoint(run_id, policy_version)
        assert found is not None
        return found

    def load_checkpoint(
        self, run_id: str, policy_version: str, *, map_location: str = "cpu"
    ) -> tuple[dict[str, Any], CheckpointInfo]:
        """Load the state dict stored for (run_id, policy_version), checking its digest."""
        import hashlib

        import torch

        info = self._find_checkpoint(run_id, policy_version)
        if info is None:
            known = ", ".join(c.policy_version for c in self.list_checkpoints(run_id)) or "none"
            raise CheckpointNotFoundError(
                f"no checkpoint for run {run_id!r} policy version {policy_version!r} in "
                f"{self.root}; versions stored for this run: {known}"
            )
        payload = self._get_blob(info.blob_path)
        if hashlib.sha256(payload).hexdigest() != info.sha256:
            raise CorruptFileError(
                f"{self.root}/{info.blob_path}: checkpoint bytes do not match their recorded "
                f"sha256 {info.sha256}; restore the file or save the checkpoint again"
            )
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
        return dict(state), info

    def list_checkpoints(self, run_id: str | None = None) -> list[CheckpointInfo]:
        """Checkpoints recorded in the store, oldest first."""
        dataset = self._datasets(("checkpoints",))["checkpoints"]
        condition = None if run_id is None else pads.field("run_id") == run_id
        rows = self._scan(dataset, "checkpoints", condition, None).to_pylist()
        rows.sort(key=lambda row: (row["created_at"], row["policy_version"]))
        return [_checkpoint_info(row) for row in rows]

    def _find_checkpoint(self, run_id: str, policy_version: str) -> CheckpointInfo | None:
        matches = [c for c in self.list_checkpoints(run_id) if c.policy_version == policy_version]
        return matches[0] if matches else None

    def _put_blob(self, relative: str, payload: bytes) -> None:
        if self._remote:
            filesystem, base = pafs.FileSystem.from_uri(self.root)
            # Object stores make a put atomic: no partial blob is ever visible.
            with filesystem.open_output_stream(f"{base}/{relative}") as stream:
                stream.write(payload)
            return
        target = Path(self.root, relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        temporary.write_bytes(payload)
        os.replace(temporary, target)

    def _get_blob(self, relative: str) -> bytes:
        try:
            if self._remote:
                filesystem, base = pafs.FileSystem.from_uri(self.root)
                with filesystem.open_input_stream(f"{base}/{relative}") as stream:
                    return bytes(stream.read())
            return Path(self.root, relative).read_bytes()
        except (OSError, pa.ArrowException) as error:
            raise CorruptFileError(
                f"{self.root}/{relative}: checkpoint file unreadable ({_first_line(error)})"
            ) from error

    # ---- queries --------------------------------------------------------------------------------

    def _snapshot(self, names: Sequence[str]) -> tuple[dict[str, DeltaTable | None], set[str]]:
        """Handles of the named tables at their latest version (None if absent), and the steps
        files readers must leave out (orphans)."""
        tables = {name: self._open(TABLES[name], create=False) for name in names}
        hidden: set[str] = set()
        if "steps" in names and tables["steps"] is not None:
            episodes = tables.get("episodes") or self._open(EPISODES, create=False)
            hidden = _orphan_step_files(tables["steps"], episodes)
        return tables, hidden

    def _datasets(self, names: Sequence[str] = tuple(TABLES)) -> dict[str, pads.Dataset]:
        """One snapshot of each named table as an Arrow dataset (empty if the table is absent)."""
        tables, hidden = self._snapshot(names)
        return {name: self._dataset(name, table, hidden) for name, table in tables.items()}

    def _dataset(self, name: str, table: DeltaTable | None, hidden: set[str]) -> pads.Dataset:
        spec = TABLES[name]
        if table is None:
            return pads.dataset(spec.schema.empty_table())
        return _snapshot_dataset(spec, table, self._filesystem(self.table_uri(name)), hidden)

    def _register(
        self,
        con: duckdb.DuckDBPyConnection,
        names: Sequence[str],
        *,
        native: bool = True,
    ) -> list[str]:
        """Make a view per named table on `con`, all from one snapshot taken now; returns the
        table directories DuckDB reads itself.

        With `native`, the big tables of a local store are read by DuckDB's own Parquet reader
        over the snapshot's file list (the reward-curve query over 10 million steps took 0.65 s so
        against 0.85-1.0 s through Arrow datasets); the rest, and remote stores, through Arrow
        datasets.
        """
        import duckdb

        tables, hidden = self._snapshot(names)
        native_directories: list[str] = []
        for name, table in tables.items():
            if native and table is not None and name in _NATIVE_TABLES and not self._remote:
                sql = _parquet_view_sql(TABLES[name], table, self.table_uri(name), hidden)
                if sql is not None:
                    try:
                        con.execute(f"CREATE VIEW {name} AS {sql}")
                        native_directories.append(self.table_uri(name))
                        continue
                    except duckdb.Error:
                        pass  # the Arrow dataset below reads what DuckDB's reader cannot
            con.register(name, self._dataset(name, table, hidden))
        return native_directories

    def connect(self, *, allow_writes_to: str | os.PathLike[str] | None = None) -> StoreConnection:
        """A new read-only DuckDB connection with a view per table and the derived views.

        The views show one snapshot, taken now, of committed data only. The connection runs only
        reading SQL and reaches no file outside the store's tables (`storage.queries.restrict`);
        `allow_writes_to` names a directory outside the store that `COPY ... TO` may write in.
        Close the connection when done (it is a context manager).
        """
        write_directory = (
            None if allow_writes_to is None else export_directory(allow_writes_to, self.root)
        )
        con = open_connection()
        try:
            read_directories = self._register(con, tuple(TABLES), native=write_directory is None)
            for name, sql in DERIVED_VIEWS.items():
                con.execute(f"CREATE VIEW {name} AS {sql}")
        except BaseException:
            con.close()
            raise
        return restrict(con, read_directories=read_directories, write_directory=write_directory)

    @contextmanager
    def _connection(self, names: Sequence[str]) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection with only `names` registered (plus derived views that need only those)."""
        import duckdb

        con = duckdb.connect()
        try:
            self._register(con, names)
            if "gates" in names:
                con.execute(f"CREATE VIEW gate_verdicts AS {DERIVED_VIEWS['gate_verdicts']}")
            yield con
        finally:
            con.close()

    def query(
        self,
        sql: str,
        parameters: Sequence[Any] | None = None,
        *,
        allow_writes_to: str | os.PathLike[str] | None = None,
    ) -> pa.Table:
        """Run reading SQL over the store's views (see `connect`); returns an Arrow table (empty
        for a COPY, which runs only with `allow_writes_to`)."""
        import duckdb

        con = self.connect(allow_writes_to=allow_writes_to)
        try:
            relation = con.sql(sql, parameters)
            return relation.to_arrow_table() if relation is not None else pa.table({})
        except duckdb.PermissionException as error:
            raise refusal(error, con.write_directory) from None
        except (duckdb.ParserException, duckdb.CatalogException, duckdb.BinderException) as error:
            raise QueryError(f"SQL error: {_first_line(error)}") from error
        except duckdb.Error as error:
            self._raise_if_corrupt(tuple(TABLES))
            raise QueryError(f"query failed: {_first_line(error)}") from error
        finally:
            con.close()

    def named(self, name: str) -> pa.Table:
        """Run one of `storage.queries.NAMED_QUERIES` by name."""
        query = NAMED_QUERIES.get(name)
        if query is None:
            raise QueryError(f"no named query {name!r}; known: {', '.join(sorted(NAMED_QUERIES))}")
        return self.query(query.sql)

    def _raise_if_corrupt(self, names: Sequence[str]) -> None:
        """After a failed read, find an unreadable data file and raise naming it."""
        for name in names:
            table = self._open(TABLES[name], create=False)
            if table is None:
                continue
            filesystem = self._filesystem(self.table_uri(name))
            for relative in table.file_uris():
                path = relative.removeprefix(self.table_uri(name) + "/")
                if self._remote or os.path.isabs(relative):
                    path = relative.split(f"/{name}/", 1)[-1]
                try:
                    with filesystem.open_input_file(path) as handle:
                        pq.ParquetFile(handle).metadata  # noqa: B018 - reading it is the check
                except (pa.ArrowException, OSError) as error:
                    raise CorruptFileError(
                        f"{self.table_uri(name)}/{path}: unreadable Parquet file in table "
                        f"{name!r} ({_first_line(error)}); restore it from a backup or remove "
                        "the commit that added it"
                    ) from error


class ShardWriter:
    """Commits shards in the order given, on one background thread, while the caller goes on.

    Made by `TrajectoryStore.shard_writer`. `submit` converts and checks a shard's records in the
    calling thread (so a bad record raises there, and the caller may reuse its lists once it
    returns), then queues the shard for the writer's thread. That thread takes every shard queued
    by the time it is free and commits them together (`TrajectoryStore._commit_group`): one steps
    commit, then one episodes commit carrying each shard's transaction id, the commit point of
    every shard in it. Shards arriving faster than one commit takes so share the cost of a commit
    instead of queueing behind one commit each. Each shard stays exactly-once on its own: a killed
    process leaves every shard either committed or invisible (a group becomes visible at once),
    and replaying any of them writes nothing twice. At most `max_in_flight` shards wait or are
    being committed (so at most that many share a commit, and their tables are what the writer
    holds in memory); `submit` blocks until some are done when that many are.

    A shard is committed once the future `submit` returns has its `CommitResult`, and every
    submitted shard once `flush` or `close` returns. A failed commit stops the writer: the shards
    of that commit and every later one are not committed (their futures fail), and the error is
    raised by the next `submit`, `flush` or `close`; replay the shards that did not commit (it is
    safe). Use it as a context manager, which closes it (waiting for every commit) on the way out.
    Submit from one thread.
    """

    def __init__(self, store: TrajectoryStore, *, max_in_flight: int = 16) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.store = store
        self.max_in_flight = max_in_flight
        self._pending: deque[Future[CommitResult]] = deque()
        # Shards submitted and not yet taken by the writer's thread, with their futures.
        self._queue: deque[tuple[_PreparedShard, Future[CommitResult]]] = deque()
        self._queue_lock = threading.Lock()
        # Used by the writer's thread only, one commit at a time; handed back on close.
        self._handles = store._take_handles()
        self._executor: ThreadPoolExecutor | None = None
        # Set by the writer's thread when a commit fails; raised once to the caller.
        self._failure: BaseException | None = None
        self._reported = False
        self._closed = False

    def __repr__(self) -> str:
        return f"ShardWriter({self.store.root!r}, pending={len(self._pending)})"

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if error is None:
            self.close()
            return
        # The block failed: still wait for what was handed over, and let its error through.
        with suppress(Exception):
            self.close()

    def submit(
        self,
        run_id: str,
        iteration: int,
        shard: int,
        *,
        episodes: TableInput,
        steps: TableInput = (),
    ) -> Future[CommitResult]:
        """Convert and check a shard now, and queue its commit; arguments as for
        `TrajectoryStore.commit_iteration_shard`. Raises a record error here, and the error of
        an earlier shard's failed commit."""
        if self._closed:
            raise CommitError(f"{self!r} is closed; make another with store.shard_writer()")
        self._raise_failure()
        prepared = self.store._prepare_shard(run_id, iteration, shard, episodes, steps)
        while len(self._pending) >= self.max_in_flight:
            wait([self._pending[0]])
            self._collect()
        self._raise_failure()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rollyard-shard-writer")
        future: Future[CommitResult] = Future()
        with self._queue_lock:
            self._queue.append((prepared, future))
        # One task per shard; a task finding the queue emptied by an earlier one does nothing.
        self._executor.submit(self._commit_queued)
        self._pending.append(future)
        return future

    def flush(self) -> None:
        """Wait until every submitted shard is committed; raises a failed commit's error."""
        wait(list(self._pending))
        self._collect()
        self._raise_failure()

    def close(self) -> None:
        """Wait for every submitted shard and stop the writer's thread; raises a failed commit's
        error unless already raised. A closed writer takes no more shards."""
        try:
            wait(list(self._pending))
            self._collect()
            self._raise_failure(again=False)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if not self._closed:
                self._closed = True
                self.store._give_back_handles(self._handles)

    def _commit_queued(self) -> None:
        # Runs on the writer's thread: commits everything queued so far as one group, in order.
        with self._queue_lock:
            group = list(self._queue)
            self._queue.clear()
        if not group:
            return
        failure = self._failure
        if failure is not None:
            for prepared, future in group:
                future.set_exception(
                    CommitError(
                        f"{prepared.source}: not committed, because an earlier shard of this "
                        f"writer failed ({_first_line(failure)}); replay it, it is safe to"
                    )
                )
            return
        try:
            results = self.store._commit_group([prepared for prepared, _ in group], self._handles)
        except BaseException as error:
            self._failure = error
            for _, future in group:
                future.set_exception(error)
            return
        for (_, future), result in zip(group, results, strict=True):
            future.set_result(result)

    def _collect(self) -> None:
        while self._pending and self._pending[0].done():
            self._pending.popleft()

    def _raise_failure(self, *, again: bool = True) -> None:
        """Raise a failed commit's error the first time; then, with `again`, that the writer
        stopped (closing after the error was seen raises nothing more)."""
        failure = self._failure
        if failure is None or (self._reported and not again):
            return
        if not self._reported:
            self._reported = True
            raise failure
        raise CommitError(
            f"{self!r} stopped after a failed commit ({_first_line(failure)}); replay the shards "
            "that did not commit with another writer"
        )


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


def _rebuild_store(root: str, storage_options: Mapping[str, str]) -> TrajectoryStore:
    return TrajectoryStore(root, storage_options=storage_options)


def _key_filter(run_id: str | None, iteration: int | None) -> pads.Expression | None:
    condition: pads.Expression | None = None
    if run_id is not None:
        condition = pads.field("run_id") == run_id
    if iteration is not None:
        by_iteration = pads.field("iteration") == iteration
        condition = by_iteration if condition is None else condition & by_iteration
    return condition


def _check_shard(episodes: pa.Table, steps: pa.Table, source: str) -> None:
    if episodes.num_rows == 0:
        raise RecordError(f"{source}: no episodes; a shard commit needs at least one episode")
    ids = episodes["episode_id"].combine_chunks()
    if pc.count_distinct(ids).as_py() != episodes.num_rows:
        counts = pc.value_counts(ids)
        duplicate = next(c["values"] for c in counts.to_pylist() if c["counts"] > 1)
        raise RecordError(f"{source}: episode_id {duplicate!r} appears more than once")
    if steps.num_rows:
        position = pc.index_in(steps["episode_id"], value_set=ids)
        if position.null_count:
            first = pc.index(pc.is_null(position), True).as_py()
            raise RecordError(
                f"{source}: step row {first} belongs to episode "
                f"{steps['episode_id'][first].as_py()!r}, which is not among this shard's episodes"
            )
        # (episode position, step) packed into one integer: a cheap uniqueness check. Sorting
        # and comparing neighbours took 0.15 ms at 20,480 steps, `count_distinct` 2.3 ms.
        packed = pc.add(
            pc.multiply(position.cast(pa.int64()), 1 << 32), steps["step"].cast(pa.int64())
        )
        ordered = np.sort(packed.to_numpy())
        if bool((ordered[1:] == ordered[:-1]).any()):
            raise RecordError(f"{source}: some (episode_id, step) pair appears more than once")


def _cap_observations(steps: pa.Table) -> pa.Table:
    observation = steps["observation"]
    lengths = pc.utf8_length(observation).cast(pa.int64())
    index = steps.schema.get_field_index("observation_chars")
    steps = steps.set_column(
        index, steps.schema.field(index), pc.coalesce(steps["observation_chars"], lengths)
    )
    longest = pc.max(lengths).as_py()
    if longest is not None and longest > OBSERVATION_CAP_CHARS:
        capped = pc.utf8_slice_codeunits(observation, 0, OBSERVATION_CAP_CHARS)
        position = steps.schema.get_field_index("observation")
        steps = steps.set_column(position, steps.schema.field(position), capped)
    return steps


def _snapshot_dataset(
    spec: TableSpec, table: DeltaTable, filesystem: pafs.FileSystem, hidden: set[str]
) -> pads.Dataset:
    """The table's live files at the handle's version as an Arrow dataset, minus `hidden`.

    Built from the log's add actions rather than `DeltaTable.to_pyarrow_dataset`, which spends
    most of a query's fixed cost casting each file's partition values one by one.
    """
    if table.protocol().min_reader_version > 1:
        # Newer reader features (deletion vectors, column mapping) need the library's reader.
        return table.to_pyarrow_dataset(filesystem=filesystem)
    actions = pa.table(table.get_add_actions(flatten=True))
    parquet = pads.ParquetFileFormat()
    partition_values = [actions[f"partition.{c}"].to_pylist() for c in spec.partition_by]
    fragments = []
    for index, path in enumerate(actions["path"].to_pylist()):
        if path in hidden:
            continue
        condition = pads.scalar(True)
        for column, values in zip(spec.partition_by, partition_values, strict=True):
            condition = condition & (pads.field(column) == values[index])
        fragments.append(
            parquet.make_fragment(
                unquote(path), filesystem=filesystem, partition_expression=condition
            )
        )
    return pads.FileSystemDataset(fragments, spec.schema, parquet, filesystem)


def _parquet_view_sql(spec: TableSpec, table: DeltaTable, uri: str, hidden: set[str]) -> str | None:
    """SQL reading the table's live files at the handle's version with DuckDB's Parquet reader,
    columns in schema order; None where that reader would not see the same rows.

    Partition values come from the directory names (`key=value`, percent-decoded by DuckDB), so
    every file's directory must decode to the partition values in the log (long values are cut
    in directory names), and the root must hold no glob characters or `=`. Every file must hold
    every other column of the schema: true of all files rollyard and delta-rs write for schema v1;
    a schema change that adds columns must read with `union_by_name` or fall back here.
    """
    if table.protocol().min_reader_version > 1 or any(c in uri for c in "*?[]{}="):
        return None
    actions = pa.table(table.get_add_actions(flatten=True))
    if actions.num_rows == 0:
        return None
    partition_values = [actions[f"partition.{c}"].to_pylist() for c in spec.partition_by]
    files = []
    for index, path in enumerate(actions["path"].to_pylist()):
        if path in hidden:
            continue
        relative = unquote(path)
        directories = relative.split("/")[:-1]
        expected = [
            f"{column}={values[index]}"
            for column, values in zip(spec.partition_by, partition_values, strict=True)
        ]
        if [unquote(d) for d in directories] != expected or _HIVE_NULL in relative:
            return None  # DuckDB would read the cut value, or that name as null
        files.append(f"{uri}/{relative}")
    if not files:
        return None
    types = {"string": "VARCHAR", "int64": "BIGINT"}
    hive_types = []
    for column in spec.partition_by:
        duck = types.get(str(spec.schema.field(column).type))
        if duck is None:
            return None
        hive_types.append(f"'{column}': {duck}")
    listed = ", ".join("'" + f.replace("'", "''") + "'" for f in files)
    options = (
        f", hive_partitioning = true, hive_types = {{{', '.join(hive_types)}}}"
        if spec.partition_by
        else ", hive_partitioning = false"
    )
    columns = ", ".join(f'"{name}"' for name in spec.schema.names)
    return f"SELECT {columns} FROM read_parquet([{listed}]{options})"


def _orphan_step_files(steps: DeltaTable, episodes: DeltaTable | None) -> set[str]:
    """Paths of steps files whose shard commit never reached the episodes table."""
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


def _checkpoint_info(row: Mapping[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(
        run_id=row["run_id"],
        policy_version=row["policy_version"],
        parent_policy_version=row["parent_policy_version"],
        iteration=row["iteration"],
        trained_on_iterations=tuple(row["trained_on_iterations"]),
        n_episodes=row["n_episodes"],
        blob_path=row["blob_path"],
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        metadata=json.loads(row["metadata"] or "{}"),
        created_at=row["created_at"],
    )
