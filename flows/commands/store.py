"""`rollyard store`: maintenance of a trajectory store (`compact`, `vacuum`), its fsck (`check`,
`repair`) and a DuckDB database file over it for other DuckDB clients (`duckdb-file`)."""

from __future__ import annotations

import argparse
import sys
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from flows.cli import (
    MAX_COUNT,
    MAX_SECONDS,
    add_store_option,
    int_between,
    positive_float_up_to,
)
from flows.errors import CliError
from flows.output import add_format_option, emit, note
from rollyard.errors import EXIT_DAMAGED, EXIT_USAGE

if TYPE_CHECKING:
    from storage.fsck import Problem

MAX_HOURS = 365 * 24
"""A year: retention and age thresholds in hours."""


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "store",
        help="maintain a trajectory store (compact steps files, vacuum steps no reader sees)",
        description="Maintenance of a trajectory store.",
    )
    commands = parser.add_subparsers(dest="store_command", required=True, metavar="COMMAND")
    compact = commands.add_parser(
        "compact",
        help="merge each iteration's committed steps files into one",
        description=(
            "Rewrite the committed steps of each (run, iteration) holding several files as one "
            "file, one Delta commit per iteration. Readers see the same rows; steps of shards "
            "not committed are left as they are. Run it on iterations that are done."
        ),
    )
    add_store_option(compact)
    compact.add_argument("--run-id", default=None, help="only this run")
    compact.add_argument(
        "--iteration", type=int_between(0, MAX_COUNT), default=None, help="only this one"
    )
    add_format_option(compact)
    compact.set_defaults(handler=compact_command)

    vacuum = commands.add_parser(
        "vacuum",
        help="complete half-committed shards; remove steps of abandoned shard commits",
        description=(
            "Complete the shards a stopped writer left between its steps and episodes commits, "
            "then remove from the steps table the files of shard commits that lost to another "
            "commit of the same shard (only stores written by earlier versions hold any; readers "
            "already leave them out), in one Delta commit. Optionally also the steps of shards "
            "never committed, and delete unreferenced files from disk."
        ),
    )
    add_store_option(vacuum)
    vacuum.add_argument(
        "--uncommitted-older-than",
        type=positive_float_up_to(MAX_HOURS),
        metavar="HOURS",
        help=(
            "also remove steps of shards never committed, written more than HOURS ago; only "
            "when no writer of those shards can still be running"
        ),
    )
    vacuum.add_argument(
        "--retention-hours",
        type=int_between(0, MAX_HOURS),
        metavar="HOURS",
        help=(
            "then delete from disk the files no table version newer than HOURS references "
            "(Delta vacuum on episodes and steps); 0 only with no writer running"
        ),
    )
    add_format_option(vacuum)
    vacuum.set_defaults(handler=vacuum_command)

    check = commands.add_parser(
        "check",
        help="find what a crash or a damaged disk left in the store (exit 4 when anything)",
        description=(
            "Read every table's log and check the files it references (present, of the "
            "recorded size, a Parquet footer that reads and holds the recorded rows), data files "
            "no commit references, steps of shards never committed, checkpoint blobs and a "
            "stale writer lease. Prints one row per problem (kind, table, path, detail and what "
            "repair does about it), a summary on stderr; exits 4 when it found any. Reads only."
        ),
    )
    add_store_option(check)
    _grace_option(check)
    add_format_option(check)
    check.set_defaults(handler=check_command)

    repair = commands.add_parser(
        "repair",
        help="fix what `store check` finds: quarantine damaged and orphan files, drop stale leases",
        description=(
            "Run the check, show what will be done and, once confirmed, remove damaged and "
            "uncommitted files from their tables (a Delta remove action), move them and every "
            "orphan file into quarantine/<time>/ under the store (nothing is deleted) and remove "
            "a stale writer lease. Holds the writer lease meanwhile: refused while a run writes. "
            "Prints one row per problem fixed and per problem left (outcome `fixed` or "
            "`remaining`); exits 4 when any is left."
        ),
    )
    add_store_option(repair)
    repair.add_argument(
        "--yes", action="store_true", help="do not ask for confirmation (default: ask)"
    )
    _grace_option(repair)
    add_format_option(repair)
    repair.set_defaults(handler=repair_command)

    database = commands.add_parser(
        "duckdb-file",
        help="write a DuckDB database file with views over the store, for any DuckDB client",
        description=(
            "Write OUT, a DuckDB database holding a view per table (and the derived views) over "
            "one snapshot of the store, taken now: the DuckDB CLI, DBeaver or any DuckDB client "
            "opens it without rollyard. Views read the store's Parquet files in place; write the "
            "file again to see newer data. It is replaced whole, never half-written."
        ),
    )
    database.add_argument(
        "out", metavar="OUT", help="the database file to write, e.g. store.duckdb"
    )
    add_store_option(database)
    database.add_argument(
        "--install-delta",
        action="store_true",
        help=(
            "also download DuckDB's delta extension (needs network access), so `rollyard query` "
            "reads the tables through delta_scan from then on (default: off)"
        ),
    )
    add_format_option(database)
    database.set_defaults(handler=duckdb_file_command)


def duckdb_file_command(args: argparse.Namespace) -> int:
    import duckdb

    from flows.stores import open_store
    from storage import StoreError
    from storage.queries import load_delta_extension

    try:
        store = open_store(args.store)
        copied = store.write_duckdb_file(args.out)
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    installed = None
    if args.install_delta:
        with duckdb.connect() as con:
            installed = load_delta_extension(con, install=True)
        if not installed:
            note(
                "could not install DuckDB's delta extension (no network?); queries read the "
                "Parquet files directly, which shows the same rows"
            )
    emit({"out": args.out, "store": store.root, "copied": copied, "delta_extension": installed})
    return 0


def vacuum_command(args: argparse.Namespace) -> int:
    from flows.stores import writing_store
    from storage import StoreError

    older_than = (
        timedelta(hours=args.uncommitted_older_than)
        if args.uncommitted_older_than is not None
        else None
    )
    try:
        with writing_store(args.store, purpose="store vacuum") as store:
            result = store.vacuum(
                uncommitted_older_than=older_than, retention_hours=args.retention_hours
            )
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    emit(
        {
            "completed_shards": len(result.completed_shards),
            "removed_files": len(result.removed_files),
            "removed_rows": result.removed_rows,
            "deleted_files": len(result.deleted_files),
        }
    )
    return 0


def compact_command(args: argparse.Namespace) -> int:
    from flows.stores import writing_store
    from storage import StoreError

    try:
        with writing_store(args.store, purpose="store compact") as store:
            result = store.compact(run_id=args.run_id, iteration=args.iteration)
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    emit(
        {
            "partitions": len(result.partitions),
            "files_before": result.files_before,
            "files_after": result.files_after,
            "rows": result.rows,
        }
    )
    return 0


def _grace_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--grace-s",
        type=int_between(0, MAX_SECONDS),
        default=900,
        metavar="SECONDS",
        help=(
            "leave alone unreferenced files younger than this: a writer that does not take the "
            "store's lease may still commit them (0 when you know no writer runs)"
        ),
    )


def _problem_row(problem: Problem, outcome: str | None = None) -> dict[str, Any]:
    """A `store check`/`store repair` result row: the problem and what repair does about it."""
    row: dict[str, Any] = {} if outcome is None else {"outcome": outcome}
    return row | {
        "kind": problem.kind,
        "table": problem.table,
        "path": problem.path,
        "detail": problem.detail,
        "repair": problem.repair_action,
    }


def check_command(args: argparse.Namespace) -> int:
    from storage import StoreError
    from storage.fsck import check_store

    try:
        report = check_store(args.store, in_flight_grace_s=args.grace_s)
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    for problem in report.problems:
        emit(_problem_row(problem))
    if report.writer is not None:
        note(
            f"a writer is active ({report.writer.describe()}): its files in flight were not "
            "judged; check again once it is done"
        )
    if report.left_alone:
        note(f"{report.left_alone} unreferenced file(s) too recent to judge were left alone")
    if report.ok:
        note(f"{report.root}: no problems in {report.files_checked} data file(s)")
        return 0
    note(
        f"{report.root}: {len(report.problems)} problem(s) in {report.files_checked} data "
        f"file(s); run `rollyard store repair --store {args.store}` to fix what can be fixed"
    )
    return EXIT_DAMAGED


def repair_command(args: argparse.Namespace) -> int:
    from storage import StoreError
    from storage.fsck import REPAIRABLE_KINDS, check_store, repair_store

    try:
        planned = check_store(args.store, in_flight_grace_s=args.grace_s)
        fixable = [p for p in planned.problems if p.kind in REPAIRABLE_KINDS]
        if not fixable:
            for problem in planned.problems:
                emit(_problem_row(problem, "remaining"))
            note(f"{planned.root}: nothing repair can fix")
            return 0 if planned.ok else EXIT_DAMAGED
        if not args.yes:
            if not sys.stdin.isatty():
                raise CliError(
                    "store repair changes the store's tables: confirm with --yes when not "
                    "running at a terminal",
                    EXIT_USAGE,
                )
            # The plan is for the person answering, on the terminal; the rows say what was done.
            for problem in fixable:
                note(problem.line())
            answer = input(f"repair these {len(fixable)} problem(s)? [y/N] ")
            if answer.strip().lower() not in ("y", "yes"):
                note("nothing changed")
                return EXIT_DAMAGED
        result = repair_store(args.store, in_flight_grace_s=args.grace_s)
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    for problem in result.fixed:
        emit(_problem_row(problem, "fixed"))
    for problem in result.after.problems:
        emit(_problem_row(problem, "remaining"))
    moved = f"; files moved to {result.quarantine}" if result.quarantine else ""
    note(f"repaired {len(result.fixed)} problem(s){moved}")
    return 0 if result.after.ok else EXIT_DAMAGED
