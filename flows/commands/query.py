"""`rollyard query`: run SQL or a named query over a trajectory store and print the result."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from flows.errors import CliError
from rollyard.errors import EXIT_USAGE

FORMATS = ("table", "csv", "json")
# A terminal table wider than this many rows is cut; scripts use --format csv|json for everything.
TABLE_MAX_ROWS = 200
CELL_MAX_CHARS = 60


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
    parser.add_argument("--store", default=".rollyard", help="store root (default: ./.rollyard)")
    parser.add_argument("--named", metavar="NAME", help="run a named query instead of SQL")
    parser.add_argument("--list-named", action="store_true", help="list the named queries")
    parser.add_argument("--format", choices=FORMATS, default="table", help="output format")
    parser.add_argument(
        "--allow-writes-to",
        metavar="DIR",
        default=None,
        help="let COPY ... TO write files under DIR (an existing directory outside the store)",
    )
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from storage import NAMED_QUERIES, StoreError, TrajectoryStore
    from storage.fsck import check_before_use

    if args.list_named:
        width = max(len(name) for name in NAMED_QUERIES)
        for name, query in sorted(NAMED_QUERIES.items()):
            print(f"{name:<{width}}  {query.description}")
        return 0
    if (args.sql is None) == (args.named is None):
        raise CliError("give either SQL or --named NAME (see --list-named)", EXIT_USAGE)
    try:
        store = TrajectoryStore(args.store, create=False)
        check_before_use(store.root)
        if args.named:
            table = store.named(args.named)
        else:
            table = store.query(args.sql, allow_writes_to=args.allow_writes_to)
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    _print(table, args.format)
    return 0


def _print(table: Any, output_format: str) -> None:
    if output_format == "csv":
        import csv
        import json

        # Python's csv rather than Arrow's: Arrow cannot write list columns such as `flags`.
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(table.column_names)
        for row in table.to_pylist():
            writer.writerow(
                [
                    "" if v is None else json.dumps(v) if isinstance(v, list) else v
                    for v in row.values()
                ]
            )
        return
    if output_format == "json":
        import json

        for row in table.to_pylist():
            print(json.dumps(row, default=str))
        return
    _print_table(table)


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= CELL_MAX_CHARS else text[: CELL_MAX_CHARS - 1] + "…"


def _print_table(table: Any) -> None:
    names = list(table.column_names)
    rows = [[_cell(v) for v in row.values()] for row in table.slice(0, TABLE_MAX_ROWS).to_pylist()]
    widths = [max([len(n), *(len(r[i]) for r in rows)]) for i, n in enumerate(names)]
    print("  ".join(n.ljust(w) for n, w in zip(names, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)))
    more = table.num_rows - len(rows)
    suffix = f" ({more} not shown; use --format csv or json)" if more > 0 else ""
    print(f"({table.num_rows} row{'s' if table.num_rows != 1 else ''}){suffix}")
