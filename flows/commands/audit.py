"""`rollyard audit`: re-verify a run's top-reward trajectories and review their diffs."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli import MAX_COUNT, add_store_option, int_between
from flows.errors import CliError
from flows.output import add_format_option, emit, note, progress
from rollyard.errors import EXIT_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    audit = subparsers.add_parser(
        "audit", help="replay and re-verify the top-reward trajectories of a run"
    )
    add_store_option(audit)
    audit.add_argument("--tasks", required=True, help="the task directory the run trained on")
    audit.add_argument("--run-id", required=True, help="the run whose trajectories to audit")
    audit.add_argument(
        "--iteration",
        type=int_between(0, MAX_COUNT),
        action="append",
        default=[],
        help="audit this iteration (repeatable; default: all)",
    )
    audit.add_argument(
        "--top-k", type=int_between(1, MAX_COUNT), default=5, help="episodes per iteration"
    )
    add_format_option(audit)
    audit.set_defaults(handler=audit_command)


def audit_command(args: argparse.Namespace) -> int:
    from flows.stores import open_store
    from storage import StoreError
    from storage.errors import StoreNotFoundError

    if not Path(args.tasks).is_dir():
        raise CliError(f"--tasks {args.tasks} is not a directory", EXIT_USAGE)
    if args.top_k < 1:
        raise CliError(f"--top-k must be at least 1, got {args.top_k}", EXIT_USAGE)
    try:
        open_store(args.store)
    except StoreNotFoundError as error:
        raise CliError(str(error), EXIT_USAGE) from error
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error

    from flows.audit import AuditParams, audit
    from flows.runtime import prefect_api, prefect_home_for

    params = AuditParams(
        store=args.store,
        tasks_dir=args.tasks,
        run_id=args.run_id,
        iterations=tuple(args.iteration),
        top_k=args.top_k,
    )
    from storage.lease import writer_lease

    # The lease before the Prefect server, whose database lives under the store.
    with (
        writer_lease(args.store, run_id=args.run_id, purpose="audit"),
        prefect_api(prefect_home_for(args.store)),
        progress(f"auditing run {args.run_id}"),
    ):
        findings = audit(params)
    for finding in findings:
        emit(finding.as_row())
    confirmed = sum(f.verdict == "confirmed" for f in findings)
    note(f"{confirmed} of {len(findings)} audited episodes confirmed")
    return 0
