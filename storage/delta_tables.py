"""The store's Delta tables, opened per thread: creating them, catching a handle up on the log,
and checking (and, for a writer, evolving) their schema; also the application transaction ids.

Why a commit first catches its handles up, rather than reopening the tables or committing on a
stale handle, is in the design record of `storage.commits`, whose `CommitEngine` extends
`StoreTables` and commits through these handles.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake import Field as DeltaField

from storage.data_files import STATS_COLUMNS
from storage.errors import SchemaMismatchError
from storage.schemas import TableSpec

# Replaying the JSON log of a partitioned table made each commit slower as commits accumulated
# (20 ms -> 60 ms per commit by the 300th with the default interval of 100); a checkpoint every
# 10 commits kept it at 8-18 ms. Measured again with the store's own commits at 500 commits:
# interval 10 beat 1, 2, 5 and 25.
_TABLE_CONFIGURATION = {"delta.checkpointInterval": "10"}


def transaction_id(*parts: object) -> str:
    """An application transaction id: what makes a commit of these parts detectable on replay."""
    # JSON keeps the parts unambiguous whatever characters a run id holds.
    return "rollyard:" + json.dumps([str(part) for part in parts], separators=(",", ":"))


def _table_configuration(spec: TableSpec) -> dict[str, str | None]:
    configuration: dict[str, str | None] = dict(_TABLE_CONFIGURATION)
    columns = STATS_COLUMNS.get(spec.name)
    if columns is not None:
        # Tells other Delta writers (compaction, say) to collect the same statistics.
        configuration["delta.dataSkippingStatsColumns"] = ",".join(columns)
    return configuration


class StoreTables:
    """Opens the Delta tables of one store root, per thread, at their latest version.

    `root` is an absolute local directory or an object-storage URI (`remote`). Table handles are
    opened lazily, per thread (a handle is not meant to be shared across threads).
    """

    def __init__(self, root: str, *, remote: bool, storage_options: Mapping[str, str]) -> None:
        self.root = root
        self.remote = remote
        self.storage_options = dict(storage_options)
        self._local = threading.local()
        # Table handles of closed shard writers, for the next writer (a handle that only catches
        # up is far cheaper than opening the table again).
        self._spare_handles: list[dict[str, DeltaTable]] = []
        self._spare_lock = threading.Lock()
        # Tables known to hold every column of their spec (see `_bring_up_to_date`).
        self._current: set[str] = set()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.root!r})"

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
