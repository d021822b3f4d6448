"""`rollyard curate TASK_DIR... --store DIR`: admit or reject tasks (validity, flakiness,
duplicates, contamination, difficulty) through the `curate` flow; prints a table, or with
`--format json` one JSON object per task. `--explain TASK_ID` prints why one task was admitted
or rejected (rule, other task, evidence), from the store's latest verdict."""

from __future__ import annotations

import argparse
import json
from typing import Any

from flows.cli import MAX_WORKERS, add_store_option, int_between
from flows.errors import CliError
from flows.output import add_format_option, emit, note, progress
from rollyard.errors import EXIT_USAGE

MAX_RERUNS = 1_000
"""Runs of one candidate's tests: past this a flake rate is known to three digits already."""

# The policy names without importing the curation library: `rollyard --help` stays fast.
POLICIES = ("instance", "repository", "off")
DEFAULT_POLICY = "instance"


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    curate = subparsers.add_parser(
        "curate",
        help="admit tasks that are valid, stable, new and uncontaminated (curate flow)",
        description="Runs the reference solution and the untouched workspace N times each in "
        "fresh sandboxes (plus reordered runs), rejects a task that is the same task as another "
        "of the batch or of an earlier admitted batch (same change and one more of failing "
        "tests, hidden tests, instruction, after normalising renames and formatting), checks the "
        "evaluation set under the decontamination policy and fix lines quoted in the "
        "instruction, and records each verdict in the store's tasks table. N defaults to the "
        "runs that catch a 5%% flake with 95%% confidence (59); ROLLYARD_CURATE_* variables set "
        "every threshold.",
    )
    curate.add_argument(
        "tasks",
        nargs="*",
        metavar="TASK_DIR",
        help="task directories, or directories of task directories (none with --explain alone)",
    )
    add_store_option(curate)
    curate.add_argument(
        "--eval-set",
        action="append",
        default=[],
        metavar="DIR",
        help="evaluation tasks (a task dir or a dir of them); repeatable",
    )
    curate.add_argument(
        "--decontamination",
        choices=POLICIES,
        default=DEFAULT_POLICY,
        help="instance: reject the same task as an evaluation task; repository: also every "
        "task whose code base appears in the evaluation set; off: no evaluation set checks "
        f"(default {DEFAULT_POLICY}; recorded with each verdict)",
    )
    curate.add_argument(
        "--explain",
        default=None,
        metavar="TASK_ID",
        help="print why this task was admitted or rejected (rule, other task, evidence) from "
        "the store's latest verdict; after curating TASK_DIRs when they are given",
    )
    curate.add_argument(
        "--reruns",
        type=int_between(0, MAX_RERUNS),
        default=None,
        help="fresh-sandbox runs per candidate (default: from flake rate)",
    )
    curate.add_argument(
        "--order-runs",
        type=int_between(0, MAX_RERUNS),
        default=None,
        help="reordered runs per candidate (default 2)",
    )
    curate.add_argument(
        "--reference",
        default=None,
        metavar="RUN_ID/POLICY_VERSION",
        help="checkpoint whose pass rate buckets each task's difficulty",
    )
    add_format_option(curate)
    curate.add_argument(
        "--workers", type=int_between(0, MAX_WORKERS), default=2, help="Dask worker processes"
    )
    curate.add_argument("--dask-address", default=None, help="a running Dask scheduler")
    curate.add_argument("--batch-id", default=None, help="tasks-table batch id (default: new)")
    curate.set_defaults(handler=curate_command)


def curate_command(args: argparse.Namespace) -> int:
    if not args.tasks and args.explain is None:
        raise CliError("give the task directories to curate, or --explain TASK_ID", EXIT_USAGE)
    if args.tasks:
        with progress(f"curating {len(args.tasks)} task path(s)"):
            verdicts = _run(args)
        if args.explain is None:
            if args.format == "table":
                _print_table(verdicts)
            else:
                for verdict in verdicts:
                    emit(dict(sorted(verdict.items())))
            return 0
    return _explain(args.store, args.explain, args.format)


def _run(args: argparse.Namespace) -> list[dict[str, Any]]:
    from flows.curate import CurateParams, run_curation, task_dirs_from
    from flows.stores import writing_store
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
            decontamination=args.decontamination,
        )
        # A writer of the tasks table (and of the Prefect database under the store).
        with writing_store(params.store, purpose="curate", create=True):
            return run_curation(
                params, workers=max(1, args.workers), dask_address=args.dask_address
            )
    except (ValueError, TaskNotFoundError, CurationError, CurationSettingsError) as error:
        raise CliError(str(error), EXIT_USAGE) from error


def _explain(store_root: str, task_id: str, output: str) -> int:
    """Print the latest verdict of `task_id` in the store: every rule, the other task and the
    similarity of each part compared."""
    from flows.stores import open_store

    rows = (
        open_store(store_root, create=True)
        .query(
            "SELECT task_id, task_version, status, reason, batch_id, recorded_at "
            "FROM tasks_latest WHERE task_id = ? ORDER BY recorded_at DESC",
            [task_id],
        )
        .to_pylist()
    )
    if not rows:
        raise CliError(
            f"no curation verdict for task {task_id!r} in the store {store_root}; curate it "
            f"first: rollyard curate TASK_DIR --store {store_root}",
            EXIT_USAGE,
        )
    row = rows[0]
    detail = json.loads(row["reason"] or "{}")
    reasons = detail.get("reasons", [])
    if output != "table":
        explained = {key: row[key] for key in ("task_id", "task_version", "status", "batch_id")}
        explained |= {"reasons": reasons, "decontamination": detail.get("decontamination")}
        emit(dict(sorted(explained.items())))
        return 0
    policy = detail.get("decontamination") or "not recorded"
    print(
        f"{row['task_id']} (version {row['task_version']}): {row['status']} in batch "
        f"{row['batch_id']}, decontamination {policy}"
    )
    if not reasons:
        print("  no rule rejected it")
    for reason in reasons:
        print(f"  {reason['rule']}: {reason['detail']}")
        if reason.get("other"):
            print(f"    other task: {reason['other']}")
        evidence = reason.get("evidence") or {}
        if evidence:
            parts = ", ".join(
                f"{part} {value:.3f}" + (" (context only)" if part == "environment" else "")
                for part, value in evidence.items()
            )
            print(f"    similarity by part: {parts}")
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
    note(f"{admitted} of {len(verdicts)} tasks admitted")
