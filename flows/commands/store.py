"""`rollyard store`: maintenance of a trajectory store (`compact`, `vacuum`)."""

from __future__ import annotations

import argparse
from datetime import timedelta
from typing import Any

from flows.cli import non_negative_int, positive_float
from flows.errors import CliError


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
    compact.add_argument("--store", default=".rollyard", help="store root (default: ./.rollyard)")
    compact.add_argument("--run-id", default=None, help="only this run")
    compact.add_argument("--iteration", type=non_negative_int, default=None, help="only this one")
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
    vacuum.add_argument("--store", default=".rollyard", help="store root (default: ./.rollyard)")
    vacuum.add_argument(
        "--uncommitted-older-than",
        type=positive_float,
        metavar="HOURS",
        help=(
            "also remove steps of shards never committed, written more than HOURS ago; only "
            "when no writer of those shards can still be running"
        ),
    )
    vacuum.add_argument(
        "--retention-hours",
        type=non_negative_int,
        metavar="HOURS",
        help=(
            "then delete from disk the files no table version newer than HOURS references "
            "(Delta vacuum on episodes and steps); 0 only with no writer running"
        ),
    )
    vacuum.set_defaults(handler=vacuum_command)


def vacuum_command(args: argparse.Namespace) -> int:
    from storage import StoreError, TrajectoryStore

    older_than = (
        timedelta(hours=args.uncommitted_older_than)
        if args.uncommitted_older_than is not None
        else None
    )
    try:
        store = TrajectoryStore(args.store, create=False)
        result = store.vacuum(
            uncommitted_older_than=older_than, retention_hours=args.retention_hours
        )
    except StoreError as error:
        raise CliError(str(error)) from error
    print(
        f"completed {len(result.completed_shards)} shard(s) a stopped writer left half-committed; "
        f"removed {len(result.removed_files)} steps file(s) ({result.removed_rows} rows) from the "
        f"steps table; deleted {len(result.deleted_files)} file(s) from disk"
    )
    return 0


def compact_command(args: argparse.Namespace) -> int:
    from storage import StoreError, TrajectoryStore

    try:
        store = TrajectoryStore(args.store, create=False)
        result = store.compact(run_id=args.run_id, iteration=args.iteration)
    except StoreError as error:
        raise CliError(str(error)) from error
    print(
        f"compacted {len(result.partitions)} partition(s): {result.files_before} steps files -> "
        f"{result.files_after} ({result.rows} rows)"
    )
    return 0
