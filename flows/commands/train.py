"""`rollyard train` and `rollyard demo`: the training flow from the command line. The policy
spec is checked before anything runs or is written (`training.iteration.check_training_policy`)."""

from __future__ import annotations

import argparse
import math
import os
from pathlib import Path
from typing import Any

from flows.cli import (
    MAX_ATTEMPTS,
    MAX_COUNT,
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
from flows.commands.policy_options import add_policy_options
from flows.errors import CliError
from rollyard.errors import EXIT_USAGE

DEMO_TASK_COUNT = 32
DEMO_DIFFICULTY = {"easy": 1.0}
"""The demo's tasks: one-bug tasks an untrained policy fixes now and then within its few
trials, so GRPO groups differ from the first iteration (see
`tasks_lib.sources.families.demo.generate.DIFFICULTY_LEVELS`; `benchmarks/README.md` § Learning)."""


MAX_POLICY_LAG = 64
"""Updates an async or streaming episode's policy may lag behind (the shared maxima of every
numeric flag are in `flows.cli`)."""


def _count(maximum: int) -> Any:
    return int_between(1, maximum)


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    train = subparsers.add_parser("train", help="train a policy with GRPO (Prefect flow over Dask)")
    train.add_argument("--tasks", required=True, help="directory of task directories")
    _common_train_options(train)
    train.set_defaults(handler=train_command)

    demo = subparsers.add_parser(
        "demo",
        help="the main job on embedded defaults: build demo tasks, train a few minutes, "
        "print and plot the reward curve",
    )
    # sized for a few minutes on 2 cores: 8 iterations x 8 tasks x 4 samples, 6 steps each (the
    # size `benchmarks/learning.py` measures the learning target at)
    _common_train_options(demo, iterations=8, group_size=4, tasks_per_iteration=8, max_steps=6)
    demo.add_argument(
        "--task-count",
        type=_count(MAX_COUNT),
        default=DEMO_TASK_COUNT,
        help="demo tasks to generate",
    )
    demo.set_defaults(handler=demo_command)


def _common_train_options(
    parser: argparse.ArgumentParser,
    iterations: int = 6,
    *,
    group_size: int = 4,
    tasks_per_iteration: int = 8,
    max_steps: int = 10,
) -> None:
    add_store_option(parser)
    add_policy_options(parser, sampling=False)
    parser.add_argument(
        "--trainer-model",
        metavar="DIR",
        help="openai: policies only: the served model's weights on this machine; the trainer "
        "trains a LoRA adapter on them and loads each new one into the server",
    )
    parser.add_argument(
        "--iterations",
        type=_count(MAX_COUNT),
        default=iterations,
        help="training iterations to run",
    )
    parser.add_argument(
        "--group-size",
        type=_count(MAX_GROUP_SIZE),
        default=group_size,
        help="episodes per task in an iteration, a GRPO group",
    )
    parser.add_argument(
        "--tasks-per-iteration",
        type=_count(MAX_COUNT),
        default=tasks_per_iteration,
        help="tasks sampled per iteration",
    )
    parser.add_argument(
        "--shards",
        type=_count(MAX_SHARDS),
        default=4,
        help="Prefect tasks (episode shards) per iteration",
    )
    parser.add_argument(
        "--max-steps",
        type=_count(MAX_STEPS),
        default=max_steps,
        help="actions per episode",
    )
    parser.add_argument(
        "--workers",
        type=_count(MAX_WORKERS),
        default=2,
        help="Dask worker processes",
    )
    parser.add_argument("--dask-address", default=None, help="a running Dask scheduler")
    parser.add_argument("--seed", type=seed, default=0, help="seed of task sampling and the policy")
    parser.add_argument("--run-id", default=None, help="default: run-<seed>")
    parser.add_argument("--resume", action="store_true", help="continue the run after a stop")
    parser.add_argument(
        "--mode",
        choices=("sync", "async", "streaming"),
        default="sync",
        help="async: roll out the next iterations while the trainer updates; streaming: "
        "train on each batch of finished groups as soon as it is full",
    )
    parser.add_argument(
        "--max-policy-lag",
        type=_count(MAX_POLICY_LAG),
        default=1,
        help="async, streaming: updates an episode's policy may lag behind the trainer",
    )
    parser.add_argument(
        "--max-attempts",
        type=_count(MAX_ATTEMPTS),
        default=3,
        help="attempts per episode after infra failures (sandbox crash, hang, host OOM)",
    )
    parser.add_argument(
        "--recovery-mode",
        choices=("replay", "restart"),
        default="replay",
        help="replay the recorded actions into a fresh sandbox, or restart the episode",
    )
    parser.add_argument(
        "--gate-on-failure",
        choices=("continue", "stop"),
        default="continue",
        help="after a failed quality gate (the iteration is quarantined either way)",
    )
    parser.add_argument(
        "--no-worker-timeout",
        type=positive_float_up_to(MAX_SECONDS),
        default=120.0,
        metavar="SECONDS",
        help="fail the run after the Dask cluster has had no worker this long",
    )
    parser.add_argument(
        "--episode-deadline",
        type=positive_float_up_to(MAX_SECONDS),
        default=900.0,
        metavar="SECONDS",
        help="a shard running longer than this per episode is hung: its Dask worker is "
        "restarted and the shard runs again elsewhere",
    )
    parser.add_argument(
        "--schedule",
        choices=("longest_first", "round_robin"),
        default="longest_first",
        help="how episodes are dealt into shards",
    )


def _settings(args: argparse.Namespace, tasks_dir: Path) -> Any:
    from flows.train_settings import TrainSettings

    return TrainSettings(
        tasks_dir=str(tasks_dir),
        store=str(args.store),
        run_id=args.run_id or f"run-{args.seed}",
        policy=args.policy,
        max_concurrent_requests=args.max_concurrent_requests,
        trainer_model=args.trainer_model,
        iterations=args.iterations,
        tasks_per_iteration=args.tasks_per_iteration,
        group_size=args.group_size,
        shards_per_iteration=args.shards,
        max_steps=args.max_steps,
        seed=args.seed,
        resume=args.resume,
        mode=args.mode,
        max_policy_lag=args.max_policy_lag,
        schedule=args.schedule,
        gate_on_failure=args.gate_on_failure,
        max_attempts=args.max_attempts,
        recovery_mode=args.recovery_mode,
        no_worker_timeout_s=args.no_worker_timeout,
        episode_deadline_s=args.episode_deadline,
    )


def _run_with_progress(settings: Any, args: argparse.Namespace) -> list[Any]:
    from flows.live import TrainingView
    from flows.progress import set_progress_hook
    from flows.train import run_training

    view = TrainingView(
        iterations=settings.iterations,
        episodes_total=settings.iterations * settings.tasks_per_iteration * settings.group_size,
        title=f"rollyard {args.command} {settings.run_id}",
    )
    set_progress_hook(view.hook)
    # A run stopped by a gate or by a cluster without workers raises its `FlowError`, which the
    # CLI prints with its exit code; what the run committed stays (--resume).
    try:
        with view:
            return run_training(settings, workers=args.workers, dask_address=args.dask_address)
    finally:
        set_progress_hook(None)


def _print_summary(summaries: list[Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="training summary")
    for column in (
        "iteration",
        "episodes",
        "mean reward",
        "pass rate",
        "infra errors",
        "gate",
        "policy version",
        "wall s",
    ):
        table.add_column(column, justify="right")
    for s in summaries:
        table.add_row(
            str(s.iteration),
            str(s.episodes),
            f"{s.reward_mean:.3f}",
            f"{s.pass_rate:.2f}",
            str(s.infra_errors),
            "quarantined" if s.quarantined else "passed",
            s.policy_version,
            f"{s.wall_s:.1f}",
        )
    Console().print(table)


def _check_policy(args: argparse.Namespace) -> None:
    """The spec, a trainer for it and its server, before anything runs or is written."""
    from training.iteration import check_training_policy

    check_training_policy(args.policy, trainer_model=args.trainer_model)


# Flow and task run log lines stay in the Prefect UI (and its API); on the console the live view
# shows what matters, with Prefect's warnings and errors above it.
QUIET_CONSOLE_ENV = {"PREFECT_LOGGING_HANDLERS_CONSOLE_LEVEL": "WARNING"}


def _quiet_console() -> None:
    for key, value in QUIET_CONSOLE_ENV.items():
        os.environ.setdefault(key, value)


def train_command(args: argparse.Namespace) -> int:
    _quiet_console()
    tasks_dir = Path(args.tasks)
    if not tasks_dir.is_dir():
        raise CliError(f"--tasks {tasks_dir} is not a directory", EXIT_USAGE)
    _check_policy(args)
    _print_refused(tasks_dir)
    settings = _settings(args, tasks_dir)
    from flows.train import preflight
    from storage.lease import writer_lease

    # Both before the progress display: a refusal is one line. The flow nests in this lease.
    preflight(settings)
    with writer_lease(settings.store, run_id=settings.run_id):
        try:
            summaries = _run_with_progress(settings, args)
        except ValueError as error:
            raise CliError(str(error), EXIT_USAGE) from error
    _print_summary(summaries)
    return 0


def _print_refused(tasks_dir: Path) -> None:
    """Name each task the run leaves out because no backend here runs it faithfully."""
    import sys

    from tasks_lib.format import tasks_in
    from training.iteration import split_refused

    for task in split_refused(tasks_in(tasks_dir))[1]:
        print(f"refused task {task.path.name}: {task.reason}", file=sys.stderr, flush=True)


def demo_command(args: argparse.Namespace) -> int:
    _quiet_console()
    from storage.lease import writer_lease

    _check_policy(args)
    # Before the demo writes its tasks into the store: one writer at a time.
    with writer_lease(args.store, run_id=args.run_id or f"run-{args.seed}"):
        return _demo(args)


def _demo(args: argparse.Namespace) -> int:
    from storage import TrajectoryStore
    from tasks_lib import generate_demo_tasks
    from tasks_lib.format import tasks_in

    store_root = Path(args.store)
    tasks_dir = store_root / "demo-tasks"
    if not tasks_in(tasks_dir):
        print(f"writing {args.task_count} demo tasks to {tasks_dir} ...", flush=True)
        generate_demo_tasks(tasks_dir, args.task_count, seed=args.seed, difficulty=DEMO_DIFFICULTY)
    settings = _settings(args, tasks_dir)
    store = TrajectoryStore(str(store_root))
    if store.checkpoints.recorded(settings.run_id) and not args.resume:
        # The demo is idempotent: a finished demo run is shown again, not refused.
        print(f"run {settings.run_id} already in {store_root}; showing it (--resume continues it)")
    else:
        _print_summary(_run_with_progress(settings, args))
    curve = store.named("reward_curve")
    rows = [r for r in curve.to_pylist() if r.get("run_id") in (None, settings.run_id)]
    print("\nreward curve (from the store):")
    for row in rows:
        print("  " + "  ".join(f"{k}={_fmt(v)}" for k, v in row.items()))
    plot = store_root / f"reward_curve_{settings.run_id}.png"
    _plot_curve(rows, plot)
    print(f"\nplot saved to {plot}")
    _print_where_to_look(store_root)
    return 0


def _print_where_to_look(store_root: Path) -> None:
    """The commands that show the run further (the README's "Where to look")."""
    from storage.gx_project import docs_site_dir

    store = str(store_root)
    print("\nlook further:")
    for command, what in (
        (f"rollyard report --store {store}", "HTML report: curves, gates, failures, checkpoints"),
        (
            f"rollyard server start --store {store}",
            "Prefect UI with this run's flow and task runs, kept up until `server stop`",
        ),
        (f"ROLLYARD_STORE={store} notebooks/", "the analysis notebooks read this store"),
        (
            str(docs_site_dir(str(store_root.absolute())) / "index.html"),
            "GX Data Docs of every gate run",
        ),
    ):
        print(f"  {command}\n      {what}")


def _fmt(value: Any) -> str:
    return f"{value:.3f}" if isinstance(value, float) else str(value)


def _plot_curve(rows: list[dict[str, Any]], path: Path) -> None:
    os.environ.setdefault("MPLBACKEND", "Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(6, 3.5))
    iterations = [row["iteration"] for row in rows]
    # An iteration with no scored episode has no mean: a gap in the line.
    means = [math.nan if row.get("mean_reward") is None else row["mean_reward"] for row in rows]
    axis.plot(iterations, means, marker="o", label="mean reward")
    if rows and "pass_rate" in rows[0]:
        axis.plot(iterations, [row["pass_rate"] for row in rows], marker="s", label="pass rate")
    axis.set_xlabel("iteration")
    axis.set_ylim(-0.05, 1.05)
    axis.legend()
    axis.set_title("rollyard demo: reward per iteration")
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
