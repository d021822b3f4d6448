"""`rollyard query`: run SQL or a named query over a trajectory store and print the result."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli import add_store_option
from flows.errors import CliError
from flows.output import ResultPrinter, add_format_option, emit
from rollyard.errors import EXIT_USAGE


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "query",
        help="run SQL or a named query over the trajectory store",
        description=(
            "Run DuckDB SQL over the store's views (episodes, steps, tasks, gates, metrics, "
            "checkpoints, training_episodes, iteration_status, gate_verdicts, tasks_latest), "
            "or a named query. Queries are read-only: SELECT (or EXPLAIN of one) over the "
            "store's tables, no other file, no extension, no configuration change. To export, "
            "name a directory with --allow-writes-to and COPY (SELECT ...) TO 'DIR/FILE'."
        ),
    )
    parser.add_argument("sql", nargs="?", help="the SQL to run")
    add_store_option(parser)
    parser.add_argument("--named", metavar="NAME", help="run a named query instead of SQL")
    parser.add_argument("--list-named", action="store_true", help="list the named queries")
    add_format_option(parser)
    parser.add_argument(
        "--allow-writes-to",
        metavar="DIR",
        default=None,
        help="let COPY ... TO write files under DIR (an existing directory outside the store)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from flows.stores import open_store
    from storage import NAMED_QUERIES, StoreError

    if args.list_named:
        for name, query in sorted(NAMED_QUERIES.items()):
            emit({"name": name, "description": query.description})
        return 0
    if (args.sql is None) == (args.named is None):
        raise CliError("give either SQL or --named NAME (see --list-named)", EXIT_USAGE)
    try:
        store = open_store(args.store)
        if args.named:
            table = store.named(args.named)
        else:
            table = store.query(args.sql, allow_writes_to=args.allow_writes_to)
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    printer = ResultPrinter(args.format, columns=table.column_names)
    # Rows in batches: a large result never sits in memory twice as Python objects.
    for batch in table.to_batches(max_chunksize=10_000):
        printer.rows(batch.to_pylist())
    printer.close()
    return 0
