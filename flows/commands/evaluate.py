"""`rollyard evaluate`: roll a policy out on a directory of tasks, K samples each, through the
`evaluate_policy` flow, and print what acted and pass@k per task, per family and overall (all
of it also in the store: `rollyard query --named pass_at_k`)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli import (
    MAX_ATTEMPTS,
    MAX_GROUP_SIZE,
    MAX_SECONDS,
    MAX_SHARDS,
    MAX_STEPS,
    MAX_WORKERS,
    add_store_option,
    int_between,
    positive_float_up_to,
    seed,
)
from flows.commands.policy_options import add_policy_options, sampling_from
from flows.errors import CliError
from flows.output import add_format_option, emit, note, progress
from rollyard.errors import EXIT_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "evaluate",
        help="roll a policy out on tasks, K samples each; pass@k per task and family",
        description=(
            "Roll a policy (builtin, openai:BASE_URL#MODEL or hf:DIR) out on every task of "
            "--tasks, --samples times each, as a run of its own: episodes committed to the "
            "store once, the iteration gated, pass@k per task, per family and overall "
            "recorded. Evaluating the same policy the same way again reports the stored run."
        ),
    )
    parser.add_argument("--tasks", required=True, help="directory of task directories")
    add_store_option(parser)
    add_policy_options(parser, sampling=True)
    parser.add_argument(
        "--samples",
        type=int_between(1, MAX_GROUP_SIZE),
        default=4,
        metavar="K",
        help="samples per task",
    )
    parser.add_argument("--run-id", default=None, help="default: derived from what is evaluated")
    parser.add_argument("--max-steps", type=int_between(1, MAX_STEPS), default=8,
                        help="actions per episode")  # fmt: skip
    parser.add_argument(
        "--shards", type=int_between(1, MAX_SHARDS), default=4, help="Prefect tasks"
    )
    parser.add_argument(
        "--workers", type=int_between(1, MAX_WORKERS), default=2, help="Dask worker processes"
    )
    parser.add_argument("--dask-address", default=None, help="a running Dask scheduler")
    parser.add_argument("--seed", type=seed, default=0, help="seed of the episodes' sampling")
    parser.add_argument(
        "--max-attempts",
        type=int_between(1, MAX_ATTEMPTS),
        default=3,
        help="attempts per episode after infra failures",
    )
    parser.add_argument(
        "--no-worker-timeout",
        type=positive_float_up_to(MAX_SECONDS),
        default=120.0,
        metavar="SECONDS",
        help="fail after the Dask cluster has had no worker this long",
    )
    add_format_option(parser)
    parser.set_defaults(handler=evaluate_command)


def evaluate_command(args: argparse.Namespace) -> int:
    from flows.evaluate import PolicyEvaluationSettings, run_policy_evaluation
    from flows.stores import check_store_before_use
    from training.lm.spec import check_policy_spec, parse_policy_spec

    tasks_dir = Path(args.tasks)
    if not tasks_dir.is_dir():
        raise CliError(f"--tasks {tasks_dir} is not a directory", EXIT_USAGE)
    check_store_before_use(args.store)  # a damaged store: one line, exit 4, nothing started
    sampling = sampling_from(args)
    # Before anything runs or is written: the spec parses (exit 2) and its policy can act (a
    # server that does not answer: exit 3; one without the model or tool calling: exit 2).
    check_policy_spec(parse_policy_spec(args.policy))
    try:
        settings = PolicyEvaluationSettings(
            tasks_dir=str(tasks_dir),
            store=str(args.store),
            policy=args.policy,
            samples=args.samples,
            run_id=args.run_id,
            sampling=sampling,
            max_steps=args.max_steps,
            seed=args.seed,
            shards=args.shards,
            max_concurrent_requests=args.max_concurrent_requests,
            max_attempts=args.max_attempts,
            no_worker_timeout_s=args.no_worker_timeout,
        )
    except ValueError as error:
        raise CliError(str(error), EXIT_USAGE) from error
    with progress(f"evaluating {args.policy}"):
        result = run_policy_evaluation(
            settings, workers=args.workers, dask_address=args.dask_address
        )
    if args.format == "table":
        print_evaluation(result)
        return 0
    note(_headline(result))
    for r in result.pass_at_k:
        emit({"scope": r.scope, "key": r.key, "k": r.k, "tasks": r.tasks, "pass_at_k": r.value})
    return 0


def _headline(result: Any) -> str:
    state = "rolled out now" if result.rolled_out else "already in the store"
    return (
        f"evaluation run {result.run_id} ({state}): {result.episodes} episodes, "
        f"{result.infra_errors} without a verdict (infra), gate "
        + (f"quarantined: {result.gate_reason}" if result.quarantined else "passed")
    )


def print_evaluation(result: Any) -> None:
    """What acted, the gate's verdict and pass@k, as tables on stdout."""
    from rich.console import Console
    from rich.table import Table

    console = Console()
    state = "rolled out now" if result.rolled_out else "already in the store"
    console.print(
        f"evaluation run [bold]{result.run_id}[/bold] ({state}): {result.episodes} episodes, "
        f"{result.infra_errors} without a verdict (infra), gate "
        + (f"[red]quarantined[/red]: {result.gate_reason}" if result.quarantined else "passed")
    )
    acted = Table(title="what acted")
    for column in ("kind", "model", "version", "sampling", "episodes"):
        acted.add_column(column)
    for row in result.acted:
        acted.add_row(
            str(row["policy_kind"]),
            str(row["policy_model"] or ""),
            str(row["policy_version"]),
            str(row["sampling"] or ""),
            str(row["episodes"]),
        )
    console.print(acted)
    ks = sorted({r.k for r in result.pass_at_k})
    table = Table(title="pass@k (mean over tasks of the unbiased estimate)")
    table.add_column("scope")
    table.add_column("tasks", justify="right")
    for k in ks:
        table.add_column(f"pass@{k}", justify="right")
    by_scope: dict[tuple[str, str], dict[int, Any]] = {}
    for r in result.pass_at_k:
        by_scope.setdefault((r.scope, r.key), {})[r.k] = r
    for (scope, key), per_k in by_scope.items():
        label = "all tasks" if scope == "all" else f"{scope} {key}"
        tasks = max(r.tasks for r in per_k.values())
        cells = ["-" if per_k[k].value is None else f"{per_k[k].value:.3f}" for k in ks]
        table.add_row(label, str(tasks), *cells)
    console.print(table)
