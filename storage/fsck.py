"""`store check` and `store repair`: find what a crash or a damaged disk left in a local store,
and put the store back in a state every reader and writer accepts, losing nothing.

What a crash can leave, and what repair does about each (`Problem.kind`):

- `missing`: a file the log references is gone. Repair removes it from the table (a Delta
  remove action); its rows were already unreadable.
- `truncated` / `unreadable`: a referenced file shorter than the log records, or whose Parquet
  footer does not read or disagrees with the log's row count. Repair removes it from the table
  and moves the file into `quarantine/<time>/` under the store.
- `uncommitted`: steps of a shard whose episodes never committed (a writer killed between its two
  commits, or the loser of a race). Readers already hide them; repair removes them from the
  table and quarantines the files.
- `orphan`: a data file in a table's directory that no log version ever referenced (a writer
  killed before its commit: possibly half-written). Repair quarantines it.
- `leftover`: a temporary commit or blob file of a killed writer. Repair quarantines it.
- `stale_lease`: the writer lease file of a process that died (`storage.lease`). Repair removes it.
- `log` and `blob`: a table log that does not load, a checkpoint blob missing or not matching its
  digest. Repair cannot rebuild these; the report says what to restore.

Nothing is deleted: quarantined files keep their relative paths. Findings that an active writer
could be causing (orphans, uncommitted shards, leftovers, younger than `IN_FLIGHT_GRACE_S` or
while a live writer holds the lease) are left alone. `check_before_use` is the cheap part
(referenced files exist with their recorded sizes and Parquet's magic bytes), which every command
that reads or writes a store runs first (`flows.stores.open_store`).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.transaction import RemoveAction

from storage import lease
from storage.commits import CommitEngine, first_line
from storage.errors import CorruptFileError, StoreError, StoreNotFoundError
from storage.lease import LeaseHolder
from storage.schemas import CHECKPOINTS, EPISODES, STEPS, TABLES, TableSpec
from storage.shard_log import orphan_step_files

QUARANTINE_DIR = "quarantine"
CHECKPOINT_BLOBS = "checkpoint_blobs"
IN_FLIGHT_GRACE_S = 900.0
"""Unreferenced files younger than this may be a running writer's, not a crash's: left alone."""

DAMAGE_KINDS = frozenset({"missing", "truncated", "unreadable", "log", "blob"})
"""Kinds that make a store unfit to read: what `check_before_use` refuses."""
REPAIRABLE_KINDS = frozenset(
    {"missing", "truncated", "unreadable", "uncommitted", "orphan", "leftover", "stale_lease"}
)

_REPAIR_SAYS = {
    "missing": "repair removes it from the table",
    "truncated": "repair removes it from the table and quarantines the file",
    "unreadable": "repair removes it from the table and quarantines the file",
    "uncommitted": "repair removes it from the table and quarantines the file",
    "orphan": "repair quarantines the file",
    "leftover": "repair quarantines the file",
    "stale_lease": "repair removes the lease file",
    "log": "repair cannot rebuild a table log: restore the table's _delta_log from a backup",
    "blob": "repair cannot rebuild weights: restore the blob or save the checkpoint again",
}


@dataclass(frozen=True, slots=True)
class Problem:
    """One finding of `check_store`."""

    kind: str
    table: str
    """The table it belongs to, or `-`."""
    path: str
    """Relative to the store root."""
    detail: str
    size_bytes: int | None = None
    """The file's size as the log records it (for the remove action)."""
    partition: tuple[tuple[str, str], ...] = ()
    """The file's partition values as the log records them."""

    @property
    def repair_action(self) -> str:
        """What `repair_store` does about it (or that it cannot)."""
        return _REPAIR_SAYS[self.kind]

    def line(self) -> str:
        return f"{self.kind}: {self.path}: {self.detail}; {self.repair_action}"


@dataclass(frozen=True, slots=True)
class CheckReport:
    """What `check_store` found in the store at `root`."""

    root: str
    problems: tuple[Problem, ...]
    files_checked: int
    """Live data files the logs reference."""
    writer: LeaseHolder | None
    """A live writer holding the lease (its in-flight files were not judged), or None."""
    left_alone: int
    """Unreferenced files young enough to be a running writer's."""

    @property
    def ok(self) -> bool:
        return not self.problems

    @property
    def damaged(self) -> tuple[Problem, ...]:
        return tuple(p for p in self.problems if p.kind in DAMAGE_KINDS)


@dataclass(frozen=True, slots=True)
class RepairReport:
    """What `repair_store` did: the problems fixed, where files went, and what is left."""

    fixed: tuple[Problem, ...]
    quarantine: str | None
    """The directory files were moved to (None when none moved)."""
    after: CheckReport


def check_store(
    root: str | os.PathLike[str],
    *,
    full: bool = True,
    in_flight_grace_s: float = IN_FLIGHT_GRACE_S,
    leftovers: bool = True,
) -> CheckReport:
    """Check every table of the local store at `root`: its log loads, the files it references
    exist with their recorded size and (`full`) their Parquet footer reads and holds the recorded
    row count; every data file on disk is referenced; checkpoint blobs exist and (`full`) match
    their digests. Reads only; see the module docstring for the kinds of problem.

    Unreferenced files younger than `in_flight_grace_s` are left alone: a writer that does not
    take the lease (a library caller) may be about to commit them. Pass 0 when none runs.
    `leftovers=False` looks only for damage (no log replay, no walk of the table directories):
    the cheap part `check_before_use` runs."""
    store = _local_root(root)
    state = lease.inspect(store)
    # The lease this process holds (a repair checking under it) is no other writer.
    writer = state.holder if state.held and not lease.held_here(store) else None
    problems: list[Problem] = []
    if leftovers and state.exists and not state.held:
        named = state.holder.describe() if state.holder else "an unnamed holder"
        problems.append(
            Problem("stale_lease", "-", lease.LEASE_FILE, f"left by {named}, which is gone")
        )
    cutoff_s = time.time() - in_flight_grace_s
    judge_in_flight = writer is None and leftovers
    young = 0
    files_checked = 0
    tables: dict[str, DeltaTable] = {}
    for spec in TABLES.values():
        directory = store / spec.name
        if not (directory / "_delta_log").is_dir():
            continue
        try:
            table = DeltaTable(str(directory))
            actions = pa.table(table.get_add_actions(flatten=True)).to_pylist()
        except Exception as error:  # deltalake raises several unrelated types for a bad log
            problems.append(Problem("log", spec.name, f"{spec.name}/_delta_log", first_line(error)))
            continue
        tables[spec.name] = table
        live: set[str] = set()
        for action in actions:
            files_checked += 1
            relative = unquote(action["path"])
            live.add(relative)
            problem = _check_file(spec, directory, relative, action, full=full)
            if problem is not None:
                problems.append(problem)
        if not judge_in_flight:
            continue
        referenced = _referenced_paths(directory / "_delta_log") | live
        for relative, modified_s in _data_files(directory):
            if relative in referenced:
                continue
            if modified_s > cutoff_s:
                young += 1
                continue
            problems.append(
                Problem(
                    "orphan",
                    spec.name,
                    f"{spec.name}/{relative}",
                    "a data file no commit references (a writer killed before its commit)",
                )
            )
        for leftover in sorted((directory / "_delta_log").glob("_commit_*.tmp")):
            if leftover.stat().st_mtime > cutoff_s:
                young += 1
                continue
            problems.append(
                Problem(
                    "leftover",
                    spec.name,
                    f"{spec.name}/_delta_log/{leftover.name}",
                    "a temporary commit file of a killed writer",
                )
            )
    if judge_in_flight and STEPS.name in tables:
        problems += _uncommitted_steps(tables[STEPS.name], tables.get(EPISODES.name), cutoff_s)
    if leftovers:
        problems += _check_blobs(
            store, tables.get(CHECKPOINTS.name), full, judge_in_flight, cutoff_s
        )
    return CheckReport(str(store), tuple(problems), files_checked, writer, young)


def check_before_use(root: str | os.PathLike[str]) -> None:
    """The cheap part of the check, before a command reads or writes a store: every file the
    logs reference exists with its recorded size and Parquet's magic bytes, every log loads. Raises `CorruptFileError` with
    the first damage found (the line `store check` prints for it); a store not made yet passes."""
    text = os.fspath(root)
    if "://" in text and not text.startswith("file://"):
        return
    if not Path(text.removeprefix("file://")).is_dir():
        return
    report = check_store(text, full=False, leftovers=False)
    damaged = report.damaged
    if damaged:
        more = f" (and {len(damaged) - 1} more)" if len(damaged) > 1 else ""
        raise CorruptFileError(
            f"{report.root}: {damaged[0].line()}{more}; see `rollyard store check --store "
            f"{report.root}`"
        )


def repair_store(
    root: str | os.PathLike[str], *, in_flight_grace_s: float = IN_FLIGHT_GRACE_S
) -> RepairReport:
    """Fix what `check_store` finds and can fix, holding the writer lease so no writer runs
    meanwhile: remove damaged and uncommitted files from their tables (one Delta commit per
    table), move every such file and every orphan into `quarantine/<time>/`, remove a stale
    lease. Raises `LeaseHeldError` while a live writer holds the store. `in_flight_grace_s` as
    in `check_store`."""
    store = _local_root(root)
    stale_found = lease.inspect(store)
    with lease.writer_lease(store, run_id="-", purpose="store repair"):
        report = check_store(store, in_flight_grace_s=in_flight_grace_s)
        engine = CommitEngine(str(store), remote=False, storage_options={})
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        quarantine = store / QUARANTINE_DIR / stamp
        fixed: list[Problem] = []
        by_table: dict[str, list[Problem]] = {}
        for problem in report.problems:
            if problem.kind in {"missing", "truncated", "unreadable", "uncommitted"}:
                by_table.setdefault(problem.table, []).append(problem)
        for name, found in by_table.items():
            spec = TABLES[name]
            table = engine.open(spec, create=False)
            assert table is not None  # its log loaded a moment ago
            now_ms = int(time.time() * 1000)
            removals = [
                RemoveAction(
                    path=p.path.removeprefix(f"{name}/"),
                    data_change=True,
                    deletion_timestamp=now_ms,
                    size=p.size_bytes,
                    partition_values=dict(p.partition),
                )
                for p in found
            ]
            engine.commit_files(
                table, spec, removals, metadata={"rollyard.operation": "store repair"}
            )
        moved = False
        for problem in report.problems:
            if problem.kind not in REPAIRABLE_KINDS:
                continue
            source = store / problem.path
            if source.exists():
                target = quarantine / problem.path
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(source, target)
                moved = True
            fixed.append(problem)
        if stale_found.exists and not stale_found.held:
            # Taking the lease above took the stale one over; releasing it removes the file.
            named = stale_found.holder.describe() if stale_found.holder else "an unnamed holder"
            fixed.append(
                Problem("stale_lease", "-", lease.LEASE_FILE, f"left by {named}, which is gone")
            )
    after = check_store(store, in_flight_grace_s=in_flight_grace_s)
    return RepairReport(tuple(fixed), str(quarantine) if moved else None, after)


def _local_root(root: str | os.PathLike[str]) -> Path:
    text = os.fspath(root)
    if "://" in text and not text.startswith("file://"):
        raise StoreError(
            f"{text}: store check and repair work on local stores; for object storage, check "
            "the tables with the storage provider's tools"
        )
    path = Path(text.removeprefix("file://")).absolute()
    if not path.is_dir():
        raise StoreNotFoundError(f"{path}: no store here; pass the directory that holds the tables")
    return path


def _check_file(
    spec: TableSpec, directory: Path, relative: str, action: dict[str, Any], *, full: bool
) -> Problem | None:
    partition = tuple(
        (key.removeprefix("partition."), str(value))
        for key, value in action.items()
        if key.startswith("partition.") and value is not None
    )
    recorded = action.get("size_bytes")

    def problem(kind: str, detail: str) -> Problem:
        return Problem(kind, spec.name, f"{spec.name}/{relative}", detail, recorded, partition)

    path = directory / relative
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return problem("missing", "referenced by the table's log but not on disk")
    if recorded is not None and size != recorded:
        return problem("truncated", f"{size} bytes on disk, the log records {recorded}")
    if not full:
        # Two 4-byte reads: same-size garbage (a bad disk, an overwrite) fails here, before a
        # reader fails on it somewhere inside DuckDB or Arrow.
        if not _has_parquet_magic(path, size):
            return problem("unreadable", "not a Parquet file (no PAR1 magic at its start and end)")
        return None
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except Exception as error:  # pyarrow raises OSError or ArrowInvalid for a bad footer
        return problem("unreadable", f"its Parquet footer does not read ({first_line(error)})")
    recorded_rows = action.get("num_records")
    if recorded_rows is not None and rows != recorded_rows:
        return problem("unreadable", f"holds {rows} rows, the log records {recorded_rows}")
    return None


def _has_parquet_magic(path: Path, size: int) -> bool:
    if size < 8:
        return False
    try:
        with path.open("rb") as handle:
            head = handle.read(4)
            handle.seek(size - 4)
            return head == b"PAR1" and handle.read(4) == b"PAR1"
    except OSError:
        return False


def _data_files(directory: Path) -> list[tuple[str, float]]:
    """Data files under a table's directory (its log aside), relative, with their mtimes."""
    found = []
    for dirpath, dirnames, filenames in os.walk(directory):
        if Path(dirpath) == directory and "_delta_log" in dirnames:
            dirnames.remove("_delta_log")
        for name in filenames:
            if name.endswith(".parquet"):
                full = Path(dirpath, name)
                found.append((full.relative_to(directory).as_posix(), full.stat().st_mtime))
    return sorted(found)


def _referenced_paths(log: Path) -> set[str]:
    """Every data file path any commit or checkpoint of the log added or removed: a file removed
    by compaction or vacuum is kept for time travel, not an orphan."""
    paths: set[str] = set()
    for entry in log.iterdir():
        if entry.name.endswith(".json") and entry.name[:1].isdigit():
            for line in entry.read_text().splitlines():
                if not line.strip():
                    continue
                action = json.loads(line)
                for kind in ("add", "remove"):
                    if kind in action:
                        paths.add(unquote(action[kind]["path"]))
        elif ".checkpoint" in entry.name and entry.name.endswith(".parquet"):
            checkpoint = pq.read_table(entry)
            for kind in ("add", "remove"):
                if kind in checkpoint.column_names:
                    paths |= {
                        unquote(item["path"])
                        for item in checkpoint.column(kind).to_pylist()
                        if item is not None
                    }
    return paths


def _uncommitted_steps(
    steps: DeltaTable, episodes: DeltaTable | None, cutoff_s: float
) -> list[Problem]:
    orphans = orphan_step_files(steps, episodes)
    found = []
    for action in pa.table(steps.get_add_actions(flatten=True)).to_pylist():
        if action["path"] not in orphans:
            continue
        if action["modification_time"] / 1000 > cutoff_s:
            continue  # a writer between its two commits
        relative = unquote(action["path"])
        partition = tuple(
            (key.removeprefix("partition."), str(value))
            for key, value in action.items()
            if key.startswith("partition.") and value is not None
        )
        found.append(
            Problem(
                "uncommitted",
                STEPS.name,
                f"{STEPS.name}/{relative}",
                "steps of a shard whose episodes never committed (hidden from readers)",
                action["size_bytes"],
                partition,
            )
        )
    return found


def _check_blobs(
    store: Path,
    checkpoints: DeltaTable | None,
    full: bool,
    judge_in_flight: bool,
    cutoff_s: float,
) -> list[Problem]:
    blobs = store / CHECKPOINT_BLOBS
    problems: list[Problem] = []
    recorded: dict[str, str] = {}
    if checkpoints is not None:
        try:
            rows = checkpoints.to_pyarrow_table(columns=["blob_path", "sha256"]).to_pylist()
        except Exception:  # a damaged checkpoints file, already reported as such
            rows = []
        recorded = {row["blob_path"]: row["sha256"] for row in rows}
    for relative, digest in sorted(recorded.items()):
        path = store / relative
        if not path.is_file():
            problems.append(Problem("blob", CHECKPOINTS.name, relative, "checkpoint blob missing"))
        elif full and _sha256(path) != digest:
            problems.append(
                Problem("blob", CHECKPOINTS.name, relative, f"does not match its sha256 {digest}")
            )
    if judge_in_flight and blobs.is_dir():
        for path in sorted(blobs.rglob("*")):
            if not path.is_file() or path.stat().st_mtime > cutoff_s:
                continue
            relative = path.relative_to(store).as_posix()
            if path.name.endswith(".tmp"):
                problems.append(
                    Problem("leftover", CHECKPOINTS.name, relative, "a half-written blob")
                )
    return problems


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as stream:
        for chunk in iter(lambda: stream.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
