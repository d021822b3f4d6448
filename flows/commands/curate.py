"""`rollyard curate TASK_DIR... --store DIR`: admit or reject tasks (validity, flakiness,
duplicates, contamination, difficulty) through the `curate` flow; prints a table, or with
`--format json` one JSON object per task."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flows.cli import non_negative_int
from flows.errors import CliError
from rollyard.errors import EXIT_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    curate = subparsers.add_parser(
        "curate",
        help="admit tasks that are valid, stable, new and uncontaminated (curate flow)",
        description="Runs the reference solution and the untouched workspace N times each in "
        "fresh sandboxes (plus reordered runs), checks duplicates within the tasks and against "
        "the evaluation set, n-gram contamination and fix lines quoted in the instruction, and "
        "records each verdict in the store's tasks table. N defaults to the runs that catch a "
        "5%% flake with 95%% confidence (59); ROLLYARD_CURATE_* variables set every threshold.",
    )
    curate.add_argument(
        "tasks",
        nargs="+",
        metavar="TASK_DIR",
        help="task directories, or directories of task directories",
    )
    curate.add_argument("--store", default=".rollyard", help="store root (default ./.rollyard)")
    curate.add_argument(
        "--eval-set",
        action="append",
        default=[],
        metavar="DIR",
        help="evaluation tasks (a task dir or a dir of them); repeatable",
    )
    curate.add_argument(
        "--reruns",
        type=non_negative_int,
        default=None,
        help="fresh-sandbox runs per candidate (default: from flake rate)",
    )
    curate.add_argument(
        "--order-runs",
        type=non_negative_int,
        default=None,
        help="reordered runs per candidate (default 2)",
    )
    curate.add_argument(
        "--reference",
        default=None,
        metavar="RUN_ID/POLICY_VERSION",
        help="checkpoint whose pass rate buckets each task's difficulty",
    )
    curate.add_argument("--format", choices=("table", "json"), default="table")
    curate.add_argument("--workers", type=non_negative_int, default=2, help="Dask worker processes")
    curate.add_argument("--dask-address", default=None, help="a running Dask scheduler")
    curate.add_argument("--batch-id", default=None, help="tasks-table batch id (default: new)")
    curate.set_defaults(handler=curate_command)


def curate_command(args: argparse.Namespace) -> int:
    from flows.curate import CurateParams, run_curation, task_dirs_from
    from tasks_lib.errors import CurationError, CurationSettingsError, TaskNotFoundError

    reference = (None, None)
    if args.reference:
        run_id, _, version = args.reference.partition("/")
        if not run_id or not version:
            raise CliError(f"--reference {args.reference!r}: use RUN_ID/POLICY_VERSION", EXIT_USAGE)
        reference = (run_id, version)
    if args.reruns == 0:
        raise CliError("--reruns must be at least 1", EXIT_USAGE)
    try:
        params = CurateParams(
            task_dirs=tuple(task_dirs_from(args.tasks)),
            store=str(args.store),
            eval_dirs=tuple(task_dirs_from(args.eval_set)) if args.eval_set else (),
            reruns=args.reruns,
            random_order_runs=args.order_runs,
            reference_run_id=reference[0],
            reference_policy_version=reference[1],
            batch_id=args.batch_id,
        )
        verdicts = run_curation(
            params, workers=max(1, args.workers), dask_address=args.dask_address
        )
    except (ValueError, TaskNotFoundError, CurationError, CurationSettingsError) as error:
        raise CliError(str(error), EXIT_USAGE) from error
    if args.format == "json":
        for verdict in verdicts:
            print(json.dumps(verdict, sort_keys=True))
    else:
        _print_table(verdicts)
    return 0


def _print_table(verdicts: list[dict[str, Any]]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"curation {verdicts[0]['batch_id'] if verdicts else ''}")
    for column in ("task", "verdict", "difficulty", "reasons"):
        table.add_column(column)
    for verdict in verdicts:
        reasons = "\n".join(f"{r['rule']}: {r['detail']}" for r in verdict["reasons"])
        style = "green" if verdict["verdict"] == "admitted" else "red"
        table.add_row(
            verdict["task_id"],
            f"[{style}]{verdict['verdict']}[/{style}]",
            verdict["difficulty"] or "-",
            reasons or "-",
        )
    Console(width=160).print(table)
    admitted = sum(v["verdict"] == "admitted" for v in verdicts)
    print(f"{admitted} of {len(verdicts)} tasks admitted")
