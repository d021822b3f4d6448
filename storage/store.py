"""The front door of the trajectory store: `TrajectoryStore` opens a store root and hands out its
parts, so one object is all a caller, a worker or a notebook needs.

    store = TrajectoryStore(".rollyard")
    store.commit_iteration_shard(run_id, iteration, shard, episodes=..., steps=...)
    store.read_episodes(run_id, iteration)           # what the trainer consumes
    store.query("SELECT ...")                        # DuckDB over one snapshot
    store.gates.iteration_status(run_id, iteration)  # and .metrics, .tasks, .reviews, .checkpoints

Episodes and steps are committed by the commit engine (`storage.commits`, which holds the design
record), kept small by `storage.maintenance` and read by `storage.readers`; each smaller table is a
module of `storage.tables`. Object storage: pass an `s3://`, `gs://` or `az://` root and
`storage_options`; concurrent writers on S3 need a locking provider configured in those options
(see the deltalake docs).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from storage import maintenance
from storage.commits import CommitEngine, CommitResult
from storage.errors import StoreNotFoundError
from storage.maintenance import CompactResult, VacuumResult
from storage.readers import SnapshotReader
from storage.records import TableInput
from storage.shard_writer import ShardWriter
from storage.tables.checkpoints import CheckpointsTable
from storage.tables.gates import GatesTable
from storage.tables.metrics import MetricsTable
from storage.tables.reviews import ReviewsTable
from storage.tables.tasks import TasksTable

if TYPE_CHECKING:
    import pyarrow as pa

    from storage.queries import StoreConnection

DEFAULT_ROOT = ".rollyard"


class TrajectoryStore:
    """A store root holding the tables episodes, steps, tasks, gates, metrics, reviews and
    checkpoints.

    `root` is a local directory (created on first write unless `create=False`) or an object-storage
    URI. Instances hold no open handles until used, so they are cheap to make in each worker, and
    they pickle as their root. Episodes and steps are committed and read through the methods here;
    the smaller tables through `gates`, `metrics`, `tasks`, `reviews` and `checkpoints`.
    """

    def __init__(
        self,
        root: str | os.PathLike[str] = DEFAULT_ROOT,
        *,
        storage_options: Mapping[str, str] | None = None,
        create: bool = True,
    ) -> None:
        text = os.fspath(root)
        remote = "://" in text and not text.startswith("file://")
        if remote:
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
        self.commits = CommitEngine(self.root, remote=remote, storage_options=storage_options or {})
        """The commit engine the tables and shard writers build on."""
        self.reader = SnapshotReader(self.commits)
        """Snapshots of the tables as Arrow datasets and DuckDB views."""
        self.gates = GatesTable(self.commits, self.reader)
        """Quality-gate evaluations and the quarantine of iterations."""
        self.metrics = MetricsTable(self.commits)
        """Per-iteration metrics."""
        self.tasks = TasksTable(self.commits)
        """The task catalog and curation verdicts."""
        self.reviews = ReviewsTable(self.commits, self.reader)
        """Human verdicts on episodes' rewards."""
        self.checkpoints = CheckpointsTable(self.commits, self.reader)
        """Policy weights and their metadata."""

    def __repr__(self) -> str:
        return f"TrajectoryStore({self.root!r})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_store, (self.root, self.commits.storage_options))

    def table_uri(self, name: str) -> str:
        """Where table `name` lives (a local path or a URI)."""
        return self.commits.table_uri(name)

    # ---- episodes and steps: writing ----------------------------------------------------------

    def commit_iteration_shard(
        self,
        run_id: str,
        iteration: int,
        shard: int,
        *,
        episodes: TableInput,
        steps: TableInput = (),
    ) -> CommitResult:
        """Commit one shard of an iteration's rollouts, exactly once; see
        `CommitEngine.commit_iteration_shard`. Replaying a shard writes nothing and returns
        `committed=False`."""
        return self.commits.commit_iteration_shard(
            run_id, iteration, shard, episodes=episodes, steps=steps
        )

    def shard_writer(self, *, max_in_flight: int = 16) -> ShardWriter:
        """A writer that commits shards on a background thread while the caller goes on.

        For a caller that commits many shards one after another: `submit` converts and checks a
        shard in the calling thread and hands it to the writer's thread, so converting shard N+1
        (or running its rollouts) overlaps the commit of shard N, and shards that queue meanwhile
        share one commit, each still exactly-once and all-or-nothing. See `ShardWriter`.
        """
        return ShardWriter(self.commits, max_in_flight=max_in_flight)

    def is_committed(self, run_id: str, iteration: int, shard: int) -> bool:
        """Whether (run_id, iteration, shard) has been committed."""
        return self.commits.is_committed(run_id, iteration, shard)

    def committed_shards(self, run_id: str, iteration: int) -> list[int]:
        """The shards of an iteration that are committed (read from the log, no data scan)."""
        return self.commits.committed_shards(run_id, iteration)

    def compact(
        self, run_id: str | None = None, iteration: int | None = None, *, min_files: int = 2
    ) -> CompactResult:
        """Rewrite each finished (run_id, iteration) partition's committed steps files as one
        file; see `storage.maintenance.compact`."""
        return maintenance.compact(self.commits, run_id, iteration, min_files=min_files)

    def vacuum(
        self,
        *,
        uncommitted_older_than: timedelta | None = None,
        retention_hours: int | None = None,
    ) -> VacuumResult:
        """Remove steps files no reader will ever see; see `storage.maintenance.vacuum`."""
        return maintenance.vacuum(
            self.commits,
            uncommitted_older_than=uncommitted_older_than,
            retention_hours=retention_hours,
        )

    # ---- episodes and steps: reading ----------------------------------------------------------

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
        excluded = () if include_quarantined else self.gates.quarantined_iterations(run_id)
        return self.reader.read_episodes(run_id, iteration, excluded=excluded, columns=columns)

    def read_steps(
        self,
        run_id: str | None = None,
        iteration: int | None = None,
        *,
        episode_ids: Sequence[str] | None = None,
        columns: Sequence[str] | None = None,
    ) -> pa.Table:
        """Committed steps, optionally of some episodes, ordered by (episode_id, step)."""
        return self.reader.read_steps(run_id, iteration, episode_ids=episode_ids, columns=columns)

    def connect(self, *, allow_writes_to: str | os.PathLike[str] | None = None) -> StoreConnection:
        """A new read-only DuckDB connection with a view per table and the derived views, all of
        one snapshot taken now (`SnapshotReader.connect`). Close it when done."""
        return self.reader.connect(allow_writes_to=allow_writes_to)

    def write_duckdb_file(self, path: str | os.PathLike[str]) -> list[str]:
        """Write a DuckDB database file with views over one snapshot of the store, for any DuckDB
        client; the tables copied rather than viewed (`SnapshotReader.write_database`)."""
        return self.reader.write_database(path)

    def query(
        self,
        sql: str,
        parameters: Sequence[Any] | None = None,
        *,
        allow_writes_to: str | os.PathLike[str] | None = None,
    ) -> pa.Table:
        """Run reading SQL over the store's views; returns an Arrow table (see `connect`)."""
        return self.reader.query(sql, parameters, allow_writes_to=allow_writes_to)

    def named(self, name: str) -> pa.Table:
        """Run one of `storage.queries.NAMED_QUERIES` by name."""
        return self.reader.named(name)


def _rebuild_store(root: str, storage_options: Mapping[str, str]) -> TrajectoryStore:
    return TrajectoryStore(root, storage_options=storage_options)
