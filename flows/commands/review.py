"""`rollyard review ...`: human spot checks of rewards — a stratified queue of episodes, one
episode's actions, recorded agreement, agreement rates, and the gate that blocks families whose
rewards reviewers disagree with. Each result is a row (`--format`, JSON lines by default)."""

from __future__ import annotations

import argparse
import getpass
from pathlib import Path
from typing import Any

from flows.cli import MAX_COUNT, add_store_option, float_between, int_between, seed
from flows.errors import CliError
from flows.output import add_format_option, emit


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    review = subparsers.add_parser(
        "review", help="human spot checks of rewards: queue, record, agreement"
    )
    group = review.add_subparsers(dest="review_command", required=True, metavar="COMMAND")
    queue = group.add_parser("queue", help="episodes to review, stratified by family and reward")
    _store_arg(queue)
    queue.add_argument("--per-stratum", type=int_between(1, MAX_COUNT), default=2,
                       help="episodes per (family, reward) stratum")  # fmt: skip
    queue.add_argument("--seed", type=seed, default=0, help="seed of the sample")
    queue.add_argument("--run-id", help="only this run's episodes (default: every run)")
    queue.add_argument("--tasks", type=Path, nargs="*", default=[], metavar="DIR",
                       help="task dirs: family and verifier kind come from them")  # fmt: skip
    queue.set_defaults(handler=queue_command)

    show = group.add_parser("show", help="an episode's actions and observations, for review")
    _store_arg(show)
    show.add_argument("episode_id", metavar="EPISODE_ID", help="the episode to show")
    show.set_defaults(handler=show_command)

    record = group.add_parser("record", help="record agree/disagree with an episode's reward")
    _store_arg(record)
    record.add_argument("episode_id", metavar="EPISODE_ID", help="the episode reviewed")
    record.add_argument("verdict", choices=("agree", "disagree"),
                        help="whether the reviewer agrees with the episode's reward")  # fmt: skip
    record.add_argument("--note", default=None, help="a free-text note kept with the review")
    record.add_argument("--reviewer", default=None, help="default: $ROLLYARD_REVIEWER or the user")
    record.add_argument("--verifier", default=None, help="verifier kind, when the store lacks it")
    record.add_argument("--family", default=None, help="task family, when the store lacks it")
    record.set_defaults(handler=record_command)

    agreement = group.add_parser("agreement", help="agreement rate per family, verifier and day")
    _store_arg(agreement)
    agreement.set_defaults(handler=agreement_command)

    gate = group.add_parser("gate", help="families whose review agreement blocks more tasks")
    _store_arg(gate)
    gate.add_argument("--min-reviews", type=int_between(1, MAX_COUNT), default=10,
                      help="reviews a family needs before its agreement counts")  # fmt: skip
    gate.add_argument("--min-agreement", type=float_between(0.0, 1.0), default=0.8,
                      help="agreement rate below which a family is blocked")  # fmt: skip
    gate.set_defaults(handler=gate_command)


def _store_arg(parser: argparse.ArgumentParser) -> None:
    add_store_option(parser)
    add_format_option(parser, default="json")


def _store(args: argparse.Namespace) -> Any:
    from flows.stores import open_store

    # Created when absent (an empty queue, no agreement yet), refused when damaged (exit 4).
    return open_store(args.store, create=True)


def queue_command(args: argparse.Namespace) -> int:
    from storage.reviews import review_queue
    from tasks_lib import TaskError, find_task_dirs, load_task

    info: dict[str, tuple[str, str]] = {}
    for path in find_task_dirs(args.tasks, strict=False):
        try:
            task = load_task(path)
        except TaskError as error:
            raise CliError(str(error)) from error
        info[task.id] = (task.family, task.verifier)
    items = review_queue(_store(args), per_stratum=args.per_stratum, seed=args.seed,
                         run_id=args.run_id, task_info=info)  # fmt: skip
    for item in items:
        emit(item.to_json())
    return 0


def show_command(args: argparse.Namespace) -> int:
    store = _store(args)
    episodes = store.query(
        "SELECT * FROM episodes WHERE episode_id = ?", [args.episode_id]
    ).to_pylist()
    if not episodes:
        raise CliError(
            f"no episode {args.episode_id!r} in {args.store}; list some with `rollyard review queue`"
        )
    steps = store.query(
        "SELECT step, action_kind, action_text, observation, exit_code FROM steps "
        "WHERE episode_id = ? ORDER BY step",
        [args.episode_id],
    ).to_pylist()
    episode = episodes[0]
    emit(
        {
            key: episode[key]
            for key in ("episode_id", "task_id", "reward", "status", "flags", "n_steps")
        }
    )
    for step in steps:
        emit(step)
    return 0


def record_command(args: argparse.Namespace) -> int:
    from flows.stores import writing_store
    from rollyard.settings import settings
    from storage import StoreError

    reviewer = args.reviewer or settings().reviewer or getpass.getuser()
    context = {"verifier": args.verifier, "family": args.family}
    try:
        with writing_store(args.store, purpose="review record", create=True) as store:
            review_id = store.reviews.record(args.episode_id, args.verdict, reviewer=reviewer,
                                            note=args.note, context=context)  # fmt: skip
    except StoreError as error:
        raise CliError(str(error), error.exit_code) from error
    emit({"review_id": review_id, "episode_id": args.episode_id, "verdict": args.verdict,
            "reviewer": reviewer})  # fmt: skip
    return 0


def agreement_command(args: argparse.Namespace) -> int:
    from storage.reviews import agreement

    for row in agreement(_store(args)):
        emit(row)
    return 0


def gate_command(args: argparse.Namespace) -> int:
    from storage.reviews import review_gate

    decisions = review_gate(
        _store(args), min_reviews=args.min_reviews, min_agreement=args.min_agreement
    )
    for decision in decisions.values():
        emit({"family": decision.family, "reviews": decision.reviews,
                "agreement_rate": decision.agreement_rate, "admit": decision.admit,
                "reason": decision.reason})  # fmt: skip
    return 0
