"""One table data file: rows written as a zstd Parquet file laid out as Delta writers lay it out,
and the Delta add action that registers it, with its file statistics.

Why the store writes its own files rather than calling `write_deltalake` is in `storage.commits`.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake.transaction import AddAction

from storage.errors import CommitError
from storage.schemas import TableSpec

# Every Delta commit and log replay parses the statistics of every live file, so their size sets
# the commit cost of the two big tables (measured at 500 commits: 13 ms with two stats columns,
# 27 ms with all 30). They keep statistics only for the columns the store reads from the log
# (which shard and commit attempt a file holds); partition values already prune by run and
# iteration. Other tables keep statistics on every column.
STATS_COLUMNS: dict[str, tuple[str, ...]] = {
    "episodes": ("shard", "commit_id"),
    "steps": ("shard", "commit_id"),
}
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


def write_data_file(
    filesystem: pafs.FileSystem,
    spec: TableSpec,
    data: pa.Table,
    name: str,
    partition: Mapping[str, Any] | None = None,
    *,
    uri: str,
    known_directories: set[tuple[str, str]] | None = None,
) -> AddAction:
    """Write `data` as one zstd Parquet file inside the table's directory (`filesystem` is rooted
    there, `uri` names it in errors); the action adding it to the table, with its statistics.

    Laid out as Delta writers do: partition columns live in the directory name and the log's
    partition values, not in the file. `partition` gives their values when the caller knows
    them (the commit key, already checked on every row). `known_directories` holds the partition
    directories made so far in a local store, so a write skips the mkdir (None: make none ahead,
    as in object storage). Encoded and written by one pyarrow call, which holds the GIL only
    briefly: a shard writer's thread does this while the caller's thread converts records, and
    each time a thread takes the GIL back it may wait out the other's switch interval (5 ms).
    """
    if spec.partition_by:
        if data.num_rows == 0:
            raise CommitError(f"{uri}: no rows to write")
        if partition is None:
            partition = {}
            for column in spec.partition_by:
                values = data.column(column)
                if pc.count_distinct(values).as_py() != 1:
                    raise CommitError(f"{uri}: one write must hold one {column}")
                partition[column] = values[0].as_py()
        data = data.drop_columns(list(spec.partition_by))
    partition_values, relative = data_file_path(spec, name, partition)
    directory = relative.rpartition("/")[0] + "/" if "/" in relative else ""
    if (
        directory
        and known_directories is not None
        and (spec.name, directory) not in known_directories
    ):
        filesystem.create_dir(directory.rstrip("/"), recursive=True)
        known_directories.add((spec.name, directory))
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
        stats=file_stats(collector[0], data.schema, STATS_COLUMNS.get(spec.name)),
    )


def data_file_path(
    spec: TableSpec, name: str, partition: Mapping[str, Any] | None
) -> tuple[dict[str, str | None], str]:
    """The Delta partition values and the table-relative path of the data file called `name`
    in `partition`: where `write_data_file` puts it, so a commit can find it again by name."""
    partition_values: dict[str, str | None] = {}
    directory = ""
    for column in spec.partition_by:
        value = str((partition or {})[column])
        partition_values[column] = value
        directory += f"{column}={escape_partition(value)}/"
    return partition_values, f"{directory}part-{name}.zstd.parquet"


def existing_data_file(
    filesystem: pafs.FileSystem, spec: TableSpec, name: str, partition: Mapping[str, Any]
) -> AddAction | None:
    """The action adding the data file `write_data_file` wrote as `name` in `partition` (its
    statistics read back from the file's footer), or None if there is no such file."""
    partition_values, relative = data_file_path(spec, name, partition)
    try:
        info = filesystem.get_file_info(relative)
        if info.type != pafs.FileType.File:
            return None
        with filesystem.open_input_file(relative) as handle:
            metadata = pq.ParquetFile(handle).metadata
    except FileNotFoundError:
        return None
    return AddAction(
        path=relative,
        size=info.size,
        partition_values=partition_values,
        modification_time=int(time.time() * 1000),
        data_change=True,
        stats=file_stats(metadata, metadata.schema.to_arrow_schema(), STATS_COLUMNS.get(spec.name)),
    )


def escape_partition(value: str) -> str:
    """A partition value as a directory name (percent-encoded, as Hive and Delta writers do).

    Only cosmetic: readers take partition values from the log, so an over-long value is cut and
    given a digest to keep file names within filesystem limits.
    """
    escaped = quote(value, safe="-_.~")
    if len(escaped) > 120:
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


def file_stats(metadata: pq.FileMetaData, schema: pa.Schema, columns: Sequence[str] | None) -> str:
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
