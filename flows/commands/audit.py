"""`rollyard audit`: re-verify a run's top-reward trajectories and review their diffs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from flows.errors import CliError
from rollyard.errors import EXIT_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = subparsers.add_parser(
        "audit", help="replay and re-verify the top-reward trajectories of a run"
    )
    audit.add_argument("--store", default=".rollyard")
    audit.add_argument("--tasks", required=True, help="the task directory the run trained on")
    audit.add_argument("--run-id", required=True)
    audit.add_argument(
        "--iteration",
        type=int,
        action="append",
        default=[],
        help="audit this iteration (repeatable; default: all)",
    )
    audit.add_argument("--top-k", type=int, default=5, help="episodes per iteration")
    audit.add_argument("--format", choices=("table", "json"), default="table")
    audit.set_defaults(handler=audit_command)


def audit_command(args: argparse.Namespace) -> int:
    from storage import StoreError, TrajectoryStore

    if not Path(args.tasks).is_dir():
        raise CliError(f"--tasks {args.tasks} is not a directory", EXIT_USAGE)
    if args.top_k < 1:
        raise CliError(f"--top-k must be at least 1, got {args.top_k}", EXIT_USAGE)
    try:
        TrajectoryStore(args.store, create=False)
    except StoreError as error:
        raise CliError(str(error), EXIT_USAGE) from error

    from flows.audit import AuditParams, audit
    from flows.runtime import prefect_api, prefect_home_for

    params = AuditParams(
        store=args.store,
        tasks_dir=args.tasks,
        run_id=args.run_id,
        iterations=tuple(args.iteration),
        top_k=args.top_k,
    )
    with prefect_api(prefect_home_for(args.store)):
        findings = audit(params)
    if args.format == "json":
        for finding in findings:
            print(json.dumps(finding.as_row(), default=str))
    else:
        print(f"{'iteration':>9}  {'verdict':<15} {'stored':>6} {'replay':>6}  episode / why")
        for f in findings:
            why = ", ".join((*f.flags, *f.diff_rules)) or "-"
            print(
                f"{f.iteration:>9}  {f.verdict:<15} {f.stored_reward!s:>6} "
                f"{f.replayed_reward!s:>6}  {f.episode_id}  {why}"
            )
        confirmed = sum(f.verdict == "confirmed" for f in findings)
        print(f"\n{confirmed} of {len(findings)} audited episodes confirmed")
    return 0
