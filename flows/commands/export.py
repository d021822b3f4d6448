"""`rollyard export`: committed, non-quarantined episodes from the store as a Hugging Face,
TRL or verl Parquet dataset (`training.export`)."""

from __future__ import annotations

import argparse
from typing import Any

from flows.errors import CliError


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
    parser.add_argument("--store", default=".rollyard", help="store root (default ./.rollyard)")
    parser.add_argument("--run", default=None, metavar="RUN_ID", help="one run (default: all)")
    parser.add_argument(
        "--iterations",
        default=None,
        metavar="A:B",
        help="iterations A to B, B excluded (A: and :B leave an end open; A alone is one)",
    )
    parser.add_argument("--format", choices=("hf", "trl", "verl"), default="hf")
    parser.add_argument("--out", required=True, help="a new (or empty) directory")
    parser.add_argument(
        "--include-masked",
        action="store_true",
        help="also episodes without a training signal (with null advantages)",
    )
    parser.set_defaults(handler=export_command)


def export_command(args: argparse.Namespace) -> int:
    from storage import StoreError, TrajectoryStore
    from training.export import export_store
    from training.stored import IterationRange

    iterations = IterationRange.parse(args.iterations) if args.iterations else None
    try:
        store = TrajectoryStore(args.store, create=False)
        result = export_store(
            store,
            args.out,
            export_format=args.format,
            run_id=args.run,
            iterations=iterations,
            include_masked=args.include_masked,
        )
    except StoreError as error:
        raise CliError(str(error)) from error
    print(
        f"exported {result.rows} episode(s) of {result.episodes_read} read, as {args.format}, "
        f"to {result.path}"
    )
    return 0
