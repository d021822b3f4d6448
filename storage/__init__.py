"""The trajectory lakehouse: episodes, steps, tasks, gates, metrics, reviews and checkpoints as
Delta Lake tables under one store root, committed exactly once per (run, iteration, shard) and
queried by DuckDB.

Layout: `store` (the `TrajectoryStore` front door) · `commits` (the commit engine and its design
record) · `delta_tables` (per-thread table handles, catch-up, schema checks) · `shard_log`
(pending shards read from the log) · `shard_writer` · `maintenance` (compaction, vacuum) ·
`readers` (snapshots, DuckDB views) · `tables/` (gates, metrics, tasks, reviews, checkpoints) ·
`schemas` · `records` · `data_files` · `queries` · `gates` (the Great Expectations gate; its
persisted suites in `gate_suites`, its checkpoint run and Data Docs in `gate_checkpoints`) ·
`reviews` · `report` · `errors`.

Stands alone: it imports no other rollyard package but the `rollyard` foundation. Names are
imported on first use (PEP 562), so importing a small module such as `storage.errors` does not
load deltalake or pyarrow.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from storage.commits import CommitResult
    from storage.errors import (
        CheckpointNotFoundError,
        CommitError,
        CorruptFileError,
        GateSettingsError,
        QueryError,
        RecordError,
        SchemaMismatchError,
        StoreError,
        StoreNotFoundError,
    )
    from storage.maintenance import CompactResult, VacuumResult
    from storage.queries import NAMED_QUERIES, NamedQuery
    from storage.records import EpisodeRecord, StepRecord, episode_id_for
    from storage.schemas import SCHEMA_VERSION, TABLES, TableSpec
    from storage.shard_writer import ShardWriter
    from storage.store import DEFAULT_ROOT, TrajectoryStore
    from storage.tables.checkpoints import CheckpointInfo
    from storage.tables.gates import GateResult, IterationStatus

# Each public name and the module that defines it.
_EXPORTS: dict[str, str] = {
    "CheckpointInfo": "storage.tables.checkpoints",
    "CheckpointNotFoundError": "storage.errors",
    "CommitError": "storage.errors",
    "CommitResult": "storage.commits",
    "CompactResult": "storage.maintenance",
    "CorruptFileError": "storage.errors",
    "DEFAULT_ROOT": "storage.store",
    "EpisodeRecord": "storage.records",
    "GateResult": "storage.tables.gates",
    "GateSettingsError": "storage.errors",
    "IterationStatus": "storage.tables.gates",
    "NAMED_QUERIES": "storage.queries",
    "NamedQuery": "storage.queries",
    "QueryError": "storage.errors",
    "RecordError": "storage.errors",
    "SCHEMA_VERSION": "storage.schemas",
    "SchemaMismatchError": "storage.errors",
    "ShardWriter": "storage.shard_writer",
    "StepRecord": "storage.records",
    "StoreError": "storage.errors",
    "StoreNotFoundError": "storage.errors",
    "TABLES": "storage.schemas",
    "TableSpec": "storage.schemas",
    "TrajectoryStore": "storage.store",
    "VacuumResult": "storage.maintenance",
    "episode_id_for": "storage.records",
}

__all__ = [
    "DEFAULT_ROOT",
    "NAMED_QUERIES",
    "SCHEMA_VERSION",
    "TABLES",
    "CheckpointInfo",
    "CheckpointNotFoundError",
    "CommitError",
    "CommitResult",
    "CompactResult",
    "CorruptFileError",
    "EpisodeRecord",
    "GateResult",
    "GateSettingsError",
    "IterationStatus",
    "NamedQuery",
    "QueryError",
    "RecordError",
    "SchemaMismatchError",
    "ShardWriter",
    "StepRecord",
    "StoreError",
    "StoreNotFoundError",
    "TableSpec",
    "TrajectoryStore",
    "VacuumResult",
    "episode_id_for",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'storage' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_EXPORTS})
