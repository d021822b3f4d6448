"""`rollyard sft`: the supervised warm start (reference solutions replayed as tool calls, then a
fine-tune), written as a Hugging Face directory for `--policy hf:OUT`."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

from flows.cli import (
    MAX_COUNT,
    MAX_WORKERS,
    add_store_option,
    int_between,
    positive_float_up_to,
    seed,
)
from flows.output import add_format_option, emit

MAX_BATCH_SIZE = 4_096
"""Transcripts in one optimizer step."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "sft",
        help="fine-tune a local model on tasks' reference solutions replayed as tool calls",
    )
    parser.add_argument("--tasks", required=True, type=Path, help="directory of task directories")
    parser.add_argument("--policy", required=True, help="hf:DIR, the model to start from")
    parser.add_argument(
        "--out", required=True, type=Path, help="a new or empty directory for the model"
    )
    parser.add_argument(
        "--steps",
        type=int_between(1, MAX_COUNT),
        default=200,
        help="optimizer steps of the fine-tune",
    )
    parser.add_argument(
        "--batch-size",
        type=int_between(1, MAX_BATCH_SIZE),
        default=4,
        help="transcripts per optimizer step",
    )
    parser.add_argument(
        "--learning-rate",
        type=positive_float_up_to(1.0),
        default=1e-3,
        help="peak AdamW learning rate",
    )
    parser.add_argument(
        "--context-first-steps",
        type=int_between(0, MAX_COUNT),
        default=0,
        help="of --steps, how many first train only the reply tokens that must be read from the "
        "prompt or the tool results (the names and values a task gives), then every token: "
        "for a model with no pretraining, which otherwise settles on the replies' fixed tokens",
    )
    parser.add_argument(
        "--context-first-learning-rate",
        type=positive_float_up_to(1.0),
        default=None,
        help="peak learning rate of the --context-first-steps (default: --learning-rate); a "
        "lower --learning-rate for the steps on every token keeps what the first ones learnt",
    )
    parser.add_argument(
        "--threads",
        type=int_between(1, 1024),
        default=None,
        help="torch threads of the fine-tune (default: torch's own count); a fixed count "
        "repeats a run bit for bit",
    )
    parser.add_argument(
        "--seed", type=seed, default=0, help="seed of the transcripts' order and the replays"
    )
    parser.add_argument(
        "--no-test-run",
        action="store_true",
        help="transcripts submit right after the edits (no run of the tests: shorter episodes)",
    )
    parser.add_argument(
        "--file-changes",
        choices=("edit", "rewrite", "both"),
        default="edit",
        help="how transcripts change a file that exists: edit (edit_file on the changed "
        "blocks), rewrite (the whole new file written with run_command), or both (a "
        "transcript of each per task: a corpus with two styles)",
    )
    add_store_option(parser)
    parser.add_argument(
        "--workers", type=int_between(1, MAX_WORKERS), default=2, help="Dask worker processes"
    )
    parser.add_argument("--dask-address", default=None, help="a running Dask scheduler")
    add_format_option(parser, default="json")
    parser.set_defaults(handler=sft_command)


def sft_command(args: argparse.Namespace) -> int:
    from flows.sft import SFTParams, run_sft_flow
    from flows.stores import writing_store
    from rollyard.out_paths import check_directory_target, filling_directory
    from training.lm.sft import SFTSettings

    params = SFTParams(
        tasks_dir=str(args.tasks),
        policy=args.policy,
        out=str(args.out),
        settings=SFTSettings(
            steps=args.steps,
            batch_size=args.batch_size,
            learning_rate=args.learning_rate,
            seed=args.seed,
            context_first_steps=args.context_first_steps,
            context_first_learning_rate=args.context_first_learning_rate,
            threads=args.threads,
        ),
        run_tests=not args.no_test_run,
        change_styles=("edit", "rewrite") if args.file_changes == "both" else (args.file_changes,),
    )
    params.model_dir()  # a spec that is not hf:DIR fails here, before anything starts
    check_directory_target(args.out)
    # The model is written into a staging directory renamed to --out once whole.
    # The lease: the flow's Prefect database lives under the store, one writer at a time.
    with (
        writing_store(args.store, purpose="sft", create=True),
        filling_directory(args.out) as staged,
    ):
        result = run_sft_flow(
            dataclasses.replace(params, out=str(staged.path)),
            store=args.store,
            workers=args.workers,
            dask_address=args.dask_address,
        )
    emit(dataclasses.asdict(result) | {"out_dir": str(staged.final(result.out_dir))})
    return 0
