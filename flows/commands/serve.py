"""`rollyard serve`: serve the scheduled deployments (curation, evaluation, training)."""

from __future__ import annotations

import argparse
import signal
from pathlib import Path
from types import FrameType
from typing import Any

from flows.cli import MAX_COUNT, MAX_SECONDS, MAX_WORKERS, add_store_option, int_between
from flows.errors import CliError
from rollyard.errors import EXIT_USAGE


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "serve",
        help="serve the scheduled deployments: nightly curation, checkpoint evaluation, training",
        description=(
            "Register and serve three Prefect deployments until SIGTERM or Ctrl-C: "
            "curate-library/nightly-curation (cron), evaluate/evaluate-checkpoints (interval; "
            "only with --eval-tasks) and train/training (cron; resumes --run-id). Uses "
            "PREFECT_API_URL when set, else starts a local Prefect server under the store "
            "(the ephemeral API cannot schedule). Trigger a run by hand with "
            "`prefect deployment run train/training`."
        ),
    )
    add_store_option(parser)
    parser.add_argument(
        "--tasks", required=True, help="task library: curated nightly and trained on"
    )
    parser.add_argument(
        "--eval-tasks", default=None, help="held-out tasks that new checkpoints are evaluated on"
    )
    parser.add_argument("--run-id", default="run-0", help="the training run to continue")
    parser.add_argument("--train-iterations", type=int_between(1, MAX_COUNT), default=6,
                        help="iterations of each scheduled training run")  # fmt: skip
    parser.add_argument("--curate-cron", default="0 2 * * *", help="default: 02:00 daily")
    parser.add_argument("--train-cron", default="0 3 * * *", help="default: 03:00 daily")
    parser.add_argument(
        "--evaluate-every-s",
        type=int_between(1, MAX_SECONDS),
        default=900,
        help="seconds between evaluations of the newest checkpoint",
    )
    parser.add_argument("--timezone", default="UTC", help="of the cron schedules (default UTC)")
    parser.add_argument(
        "--workers", type=int_between(1, MAX_WORKERS), default=2, help="Dask worker processes"
    )
    parser.add_argument("--dask-address", default=None, help="a running Dask scheduler")
    parser.add_argument(
        "--limit", type=int_between(1, MAX_WORKERS), default=1, help="flow runs at once"
    )
    parser.add_argument(
        "--paused", action="store_true", help="register the schedules paused (runs by hand only)"
    )
    parser.set_defaults(handler=serve_command)


def _stop(signum: int, frame: FrameType | None) -> None:
    # Until Prefect's runner installs its own handler: leave through `finally` blocks, so the
    # local Prefect server this command started is stopped too.
    raise KeyboardInterrupt


def serve_command(args: argparse.Namespace) -> int:
    for option, value in (("--tasks", args.tasks), ("--eval-tasks", args.eval_tasks)):
        if value is not None and not Path(value).is_dir():
            raise CliError(f"{option} {value} is not a directory", EXIT_USAGE)
    signal.signal(signal.SIGTERM, _stop)
    from flows.deployments import ServeSettings, serve

    settings = ServeSettings(
        store=str(Path(args.store).absolute()),
        tasks_dir=str(Path(args.tasks).absolute()),
        eval_tasks_dir=str(Path(args.eval_tasks).absolute()) if args.eval_tasks else None,
        run_id=args.run_id,
        curate_cron=args.curate_cron,
        train_cron=args.train_cron,
        evaluate_interval_s=float(args.evaluate_every_s),
        timezone=args.timezone,
        train_iterations=args.train_iterations,
        workers=args.workers,
        dask_address=args.dask_address,
        paused=args.paused,
    )
    serve(settings, limit=args.limit)
    return 0
