"""Reading the store: one snapshot of the tables per reader, as Arrow datasets or DuckDB views.

Reads take one snapshot of every table they need when a reader is made (`connect`, `read_*`,
`query`), so a query never mixes versions, and they see committed data only: steps files of
shard commits that never reached the episodes table are left out (`storage.commits`). In a
local store DuckDB reads every table through its delta extension (`delta_scan` at the snapshot's
version) where that is installed (it needs a download), else the big tables' live Parquet files
with its own reader; the rest (and remote stores) as Arrow datasets built from the log.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable

from storage.commits import CommitEngine, first_line
from storage.errors import CorruptFileError, QueryError
from storage.queries import (
    DERIVED_VIEWS,
    NAMED_QUERIES,
    StoreConnection,
    export_directory,
    load_delta_extension,
    open_connection,
    refusal,
    restrict,
)
from storage.schemas import EPISODES, TABLES, TableSpec
from storage.shard_log import orphan_step_files

if TYPE_CHECKING:
    import duckdb

# Words of Arrow's and DuckDB's errors for a data page that does not decode (its footer read).
_PAGE_DAMAGE = ("thrift", "tprotocol", "parquet", "corrupt", "decompress", "snappy", "zstd")
# Tables DuckDB reads with its own Parquet reader in a local store (see `SnapshotReader.register`).
_NATIVE_TABLES = ("episodes", "steps")
_HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"


class SnapshotReader:
    """Reads the tables of the store `engine` opens, each read from one snapshot taken then."""

    def __init__(self, engine: CommitEngine) -> None:
        self.engine = engine

    def __repr__(self) -> str:
        return f"SnapshotReader({self.engine.root!r})"

    # ---- Arrow --------------------------------------------------------------------------------

    def read_episodes(
        self,
        run_id: str | None = None,
        iteration: int | None = None,
        *,
        excluded: Sequence[tuple[str, int]] = (),
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Committed episodes, optionally of one run or iteration, leaving out the (run_id,
        iteration) pairs in `excluded`."""
        dataset = self.datasets(("episodes",))["episodes"]
        condition = _key_filter(run_id, iteration)
        for excluded_run, excluded_iteration in excluded:
            left_out = (pads.field("run_id") == excluded_run) & (
                pads.field("iteration") == excluded_iteration
            )
            condition = ~left_out if condition is None else condition & ~left_out
        return self.scan(dataset, "episodes", condition, columns)

    def read_steps(
        self,
        run_id: str | None = None,
        iteration: int | None = None,
        *,
        episode_ids: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Committed steps, optionally of some episodes, ordered by (episode_id, step)."""
        dataset = self.datasets(("steps",))["steps"]
        condition = _key_filter(run_id, iteration)
        if episode_ids is not None:
            chosen = pads.field("episode_id").isin(pa.array(list(episode_ids), pa.string()))
            condition = chosen if condition is None else condition & chosen
        table = self.scan(dataset, "steps", condition, columns)
        if {"episode_id", "step"} <= set(table.column_names):
            table = table.sort_by([("episode_id", "ascending"), ("step", "ascending")])
        return table

    def scan(
        self,
        dataset: pads.Dataset,
        name: str,
        condition: pads.Expression | None,
        columns: Sequence[str] | None,
    ) -> pa.Table:
        """The rows of table `name`'s `dataset` matching `condition`; an unreadable file raises
        an error naming it."""
        try:
            return dataset.to_table(
                columns=list(columns) if columns is not None else None, filter=condition
            )
        except (pa.ArrowException, OSError) as error:
            self.raise_if_corrupt((name,), error)
            raise QueryError(
                f"reading {self.engine.table_uri(name)}: {first_line(error)}"
            ) from error

    def snapshot(self, names: Sequence[str]) -> tuple[dict[str, DeltaTable | None], set[str]]:
        """Handles of the named tables at their latest version (None if absent), and the steps
        files readers must leave out (orphans)."""
        tables = {name: self.engine.open(TABLES[name], create=False) for name in names}
        hidden: set[str] = set()
        if "steps" in names and tables["steps"] is not None:
            episodes = tables.get("episodes") or self.engine.open(EPISODES, create=False)
            hidden = orphan_step_files(tables["steps"], episodes)
        return tables, hidden

    def datasets(self, names: Sequence[str] = tuple(TABLES)) -> dict[str, pads.Dataset]:
        """One snapshot of each named table as an Arrow dataset (empty if the table is absent)."""
        tables, hidden = self.snapshot(names)
        return {name: self._dataset(name, table, hidden) for name, table in tables.items()}

    def _dataset(self, name: str, table: DeltaTable | None, hidden: set[str]) -> pads.Dataset:
        spec = TABLES[name]
        if table is None:
            return pads.dataset(spec.schema.empty_table())
        filesystem = self.engine.filesystem(self.engine.table_uri(name))
        return _snapshot_dataset(spec, table, filesystem, hidden)

    # ---- DuckDB -------------------------------------------------------------------------------

    def register(
        self, con: duckdb.DuckDBPyConnection, names: Sequence[str], *, native: bool = True
    ) -> list[str]:
        """Make a view per named table on `con`, all from one snapshot taken now; returns the
        table directories DuckDB reads itself.

        With `native`, in a local store: where DuckDB's delta extension is installed, every table
        is read by its `delta_scan` at the snapshot's version (pending steps hidden otherwise, see
        `_delta_scan_sql`); without it, the big tables are read by DuckDB's own Parquet reader
        over the snapshot's file list (the reward-curve query over 10 million steps took 0.65 s so
        against 0.85-1.0 s through Arrow datasets); the rest, and remote stores, through Arrow
        datasets.
        """
        import duckdb

        tables, hidden = self.snapshot(names)
        native_directories: list[str] = []
        delta = native and not self.engine.remote and load_delta_extension(con)
        for name, table in tables.items():
            if delta and table is not None:
                sql = _delta_scan_sql(TABLES[name], table, self.engine.table_uri(name), hidden)
                if sql is not None:
                    con.execute(f"CREATE VIEW {name} AS {sql}")
                    native_directories.append(self.engine.table_uri(name))
                    continue
            if native and table is not None and name in _NATIVE_TABLES and not self.engine.remote:
                sql = _parquet_view_sql(TABLES[name], table, self.engine.table_uri(name), hidden)
                if sql is not None:
                    try:
                        con.execute(f"CREATE VIEW {name} AS {sql}")
                        native_directories.append(self.engine.table_uri(name))
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
            None if allow_writes_to is None else export_directory(allow_writes_to, self.engine.root)
        )
        con = open_connection()
        try:
            read_directories = self.register(con, tuple(TABLES), native=write_directory is None)
            for name, sql in DERIVED_VIEWS.items():
                con.execute(f"CREATE VIEW {name} AS {sql}")
        except BaseException:
            con.close()
            raise
        return restrict(con, read_directories=read_directories, write_directory=write_directory)

    @contextmanager
    def connection(self, names: Sequence[str]) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection with only `names` registered (plus derived views that need only those)."""
        import duckdb

        con = duckdb.connect()
        try:
            self.register(con, names)
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
            raise QueryError(f"SQL error: {first_line(error)}") from error
        except duckdb.Error as error:
            self.raise_if_corrupt(tuple(TABLES), error)
            raise QueryError(f"query failed: {first_line(error)}") from error
        finally:
            con.close()

    def named(self, name: str) -> pa.Table:
        """Run one of `storage.queries.NAMED_QUERIES` by name."""
        query = NAMED_QUERIES.get(name)
        if query is None:
            raise QueryError(f"no named query {name!r}; known: {', '.join(sorted(NAMED_QUERIES))}")
        return self.query(query.sql)

    def write_database(self, path: str | os.PathLike[str]) -> list[str]:
        """Write a DuckDB database file at `path` holding one snapshot of the store, taken now,
        that any DuckDB client (the CLI, DBeaver, another language) opens without rollyard: a
        view per table reading the snapshot's Parquet files in place where DuckDB's reader sees
        the same rows, a copy of the rows elsewhere (small tables of cut partition names, remote
        stores), and the derived views. Returns the tables copied. Written beside `path` and
        renamed over it (`rollyard.out_paths.replacing_file`: a new path or a regular file,
        never a link, directory or device), so `path` is never half-written; write it again to
        see newer data.
        """
        import duckdb

        from rollyard.out_paths import check_file_target, replacing_file

        check_file_target(path, "OUT")
        tables, hidden = self.snapshot(tuple(TABLES))
        copied: list[str] = []
        with replacing_file(path, "OUT", create=False) as partial:
            con = duckdb.connect(str(partial))
            try:
                for name, table in tables.items():
                    sql = None
                    if table is not None and not self.engine.remote:
                        uri = self.engine.table_uri(name)
                        sql = _parquet_view_sql(TABLES[name], table, uri, hidden)
                    try:
                        if sql is not None:
                            con.execute(f"CREATE VIEW {name} AS {sql}")
                            continue
                        con.register("snapshot_rows", self._dataset(name, table, hidden))
                        con.execute(f"CREATE TABLE {name} AS SELECT * FROM snapshot_rows")
                    except duckdb.Error as error:
                        # DuckDB reads the files' footers here: a damaged file fails the view.
                        self.raise_if_corrupt((name,), error)
                        raise QueryError(f"{name}: {first_line(error)}") from error
                    con.unregister("snapshot_rows")
                    copied.append(name)
                for name, sql in DERIVED_VIEWS.items():
                    con.execute(f"CREATE VIEW {name} AS {sql}")
            finally:
                con.close()
        return copied

    def raise_if_corrupt(self, names: Sequence[str], error: BaseException | None = None) -> None:
        """After a failed read, find an unreadable data file and raise naming it. Footers are
        read first; when they all read and `error` reads like a damaged page (`_PAGE_DAMAGE`),
        the files' pages too: a cost paid only on the way to an error."""
        deep = error is not None and any(w in str(error).lower() for w in _PAGE_DAMAGE)
        for depth in (False, True) if deep else (False,):
            self._find_unreadable(names, pages=depth)

    def _find_unreadable(self, names: Sequence[str], *, pages: bool) -> None:
        for name in names:
            table = self.engine.open(TABLES[name], create=False)
            if table is None:
                continue
            uri = self.engine.table_uri(name)
            filesystem = self.engine.filesystem(uri)
            for relative in table.file_uris():
                path = relative.removeprefix(uri + "/")
                if self.engine.remote or os.path.isabs(relative):
                    path = relative.split(f"/{name}/", 1)[-1]
                try:
                    with filesystem.open_input_file(path) as handle:
                        parquet = pq.ParquetFile(handle)
                        for group in range(parquet.num_row_groups if pages else 0):
                            parquet.read_row_group(group)
                except (pa.ArrowException, OSError) as error:
                    raise CorruptFileError(
                        f"{uri}/{path}: unreadable Parquet file in table {name!r} "
                        f"({first_line(error)}); restore it from a backup or remove the commit "
                        "that added it"
                    ) from error


def _key_filter(run_id: str | None, iteration: int | None) -> pads.Expression | None:
    condition: pads.Expression | None = None
    if run_id is not None:
        condition = pads.field("run_id") == run_id
    if iteration is not None:
        by_iteration = pads.field("iteration") == iteration
        condition = by_iteration if condition is None else condition & by_iteration
    return condition


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


def _delta_scan_sql(spec: TableSpec, table: DeltaTable, uri: str, hidden: set[str]) -> str | None:
    """SQL reading the table at the handle's version with DuckDB's `delta_scan`, columns in
    schema order; None where it would not show what rollyard's readers show (pending steps of a
    writer stopped between its two commits are in the steps table until the shard is completed)
    or the root holds a quote."""
    if "'" in uri or (spec.name == "steps" and hidden):
        return None
    location = uri if "://" in uri else Path(uri).absolute().as_uri()
    lacking = spec.added_columns - set(table.schema().to_arrow().names)
    nulls = _typed_nulls(spec, lacking)
    if nulls is None:
        return None
    columns = ", ".join(nulls.get(name, f'"{name}"') for name in spec.schema.names)
    return f"SELECT {columns} FROM delta_scan('{location}', version => {table.version()})"


# DuckDB's names for the types of columns added since v3 (`TableSpec.added`), which an older
# table or file lacks and a view fills with typed nulls.
_DUCK_TYPES: dict[pa.DataType, str] = {pa.map_(pa.string(), pa.float64()): "MAP(VARCHAR, DOUBLE)"}


def _typed_nulls(spec: TableSpec, names: Collection[str]) -> dict[str, str] | None:
    """A typed null select item per named column (columns added since v3); None where a type
    has no DuckDB name here (the caller then reads through Arrow)."""
    nulls = {}
    for name in sorted(names):
        duck = _DUCK_TYPES.get(spec.schema.field(name).type)
        if duck is None:
            return None
        nulls[name] = f'CAST(NULL AS {duck}) AS "{name}"'
    return nulls


def _with_added_columns(spec: TableSpec, source: str) -> str | None:
    """`source` (a table function reading the table's files) with the columns added since v3
    (`TableSpec.added`) null where a file predates them; None where it cannot be."""
    nulls = _typed_nulls(spec, spec.added_columns)
    if not nulls:
        return source if nulls is not None else None
    # A typed empty row unioned by name gives every added column its type even when no file
    # holds it yet; files that hold it give their values.
    return (
        f"(SELECT {', '.join(nulls.values())} WHERE false UNION ALL BY NAME SELECT * FROM {source})"
    )


def _parquet_view_sql(spec: TableSpec, table: DeltaTable, uri: str, hidden: set[str]) -> str | None:
    """SQL reading the table's live files at the handle's version with DuckDB's Parquet reader,
    columns in schema order; None where that reader would not see the same rows.

    Partition values come from the directory names (`key=value`, percent-decoded by DuckDB), so
    every file's directory must decode to the partition values in the log (long values are cut
    in directory names), and the root must hold no glob characters or `=`. Every file must hold
    every other column of the schema but those added since (`TableSpec.added`), which a file
    written before lacks: those are read by name and null where a file has none.
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
    if spec.added:
        options += ", union_by_name = true"
    source = _with_added_columns(spec, f"read_parquet([{listed}]{options})")
    if source is None:
        return None
    columns = ", ".join(f'"{name}"' for name in spec.schema.names)
    return f"SELECT {columns} FROM {source}"
