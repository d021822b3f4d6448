"""`rollyard export`: committed, non-quarantined episodes from the store as a Hugging Face,
TRL or verl Parquet dataset (`training.export`)."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli import add_store_option
from flows.errors import CliError
from flows.output import add_format_option, emit, progress


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "export",
        help="export committed episodes from the store as an hf, trl or verl dataset",
        description=(
            "Read the committed episodes of iterations no quality gate quarantined from the "
            "store and write OUT/train.parquet: conversations with tool calls and results, "
            "the tools' schemas, token ids and logprobs, rewards, group and per-action "
            "advantages, in the chosen layout."
        ),
    )
    add_store_option(parser)
    parser.add_argument("--run", default=None, metavar="RUN_ID", help="one run (default: all)")
    parser.add_argument(
        "--iterations",
        default=None,
        metavar="A:B",
        help="iterations A to B, B excluded (A: and :B leave an end open; A alone is one)",
    )
    parser.add_argument(
        "--layout",
        choices=("hf", "trl", "verl"),
        default="hf",
        help="the dataset layout: Hugging Face conversations, TRL or verl",
    )
    add_format_option(parser)
    parser.add_argument("--out", required=True, help="a new or empty directory (never a link)")
    parser.add_argument(
        "--include-masked",
        action="store_true",
        help="also episodes without a training signal (with null advantages)",
    )
    parser.set_defaults(handler=export_command)


def export_command(args: argparse.Namespace) -> int:
    from flows.stores import open_store
    from rollyard.out_paths import check_directory_target, filling_directory
    from storage import StoreError
    from training.export import export_store
    from training.stored import IterationRange

    iterations = IterationRange.parse(args.iterations) if args.iterations else None
    check_directory_target(args.out)
    try:
        store = open_store(args.store)
        with progress("exporting episodes"), filling_directory(args.out) as staged:
            result = export_store(
                store,
                staged.path,
                export_format=args.layout,
                run_id=args.run,
                iterations=iterations,
                include_masked=args.include_masked,
            )
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    emit(
        {
            "rows": result.rows,
            "episodes_read": result.episodes_read,
            "layout": args.layout,
            "path": str(staged.final(result.path)),
        }
    )
    return 0
