"""`rollyard report`: write a self-contained HTML report of a store."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli import add_store_option
from flows.errors import CliError
from flows.output import add_format_option, emit


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a store (curves, tables, gate history)",
        description=(
            "Write one HTML file, figures inlined, with the store's reward curves, held-out "
            "evaluations, quality gate history, failure taxonomy, reward-hack flags, "
            "throughput, task library and checkpoints."
        ),
    )
    add_store_option(parser)
    parser.add_argument(
        "--out",
        default=None,
        help="output file: a new path or a regular file to replace (default STORE/report.html)",
    )
    parser.add_argument("--run-id", default=None, help="report on this run only")
    parser.add_argument("--title", default="rollyard report", help="the report's title")
    add_format_option(parser)
    parser.set_defaults(handler=report_command)


def report_command(args: argparse.Namespace) -> int:
    from flows.stores import open_store
    from storage import StoreError
    from storage.report import write_report

    try:
        store = open_store(args.store)
        out = Path(args.out) if args.out else Path(store.root) / "report.html"
        path = write_report(store, out, run_id=args.run_id, title=args.title)
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    emit({"report": str(path)})
    return 0
