"""The trajectory lakehouse: episodes, steps, tasks, gates, metrics and checkpoints as Delta Lake
tables under one store root, committed exactly once per (run, iteration, shard) and queried by DuckDB.

Stands alone: it imports no other rollyard package.
"""

from storage.errors import (
    CheckpointNotFoundError,
    CommitError,
    CorruptFileError,
    QueryError,
    RecordError,
    SchemaMismatchError,
    StoreError,
    StoreNotFoundError,
)
from storage.queries import NAMED_QUERIES, NamedQuery
from storage.records import EpisodeRecord, StepRecord, episode_id_for
from storage.schemas import SCHEMA_VERSION, TABLES, TableSpec
from storage.store import (
    DEFAULT_ROOT,
    CheckpointInfo,
    CommitResult,
    CompactResult,
    GateResult,
    IterationStatus,
    ShardWriter,
    TrajectoryStore,
    VacuumResult,
)

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
