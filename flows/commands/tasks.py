"""`rollyard tasks ...` and `rollyard verify`: the task library on the command line. Each handler
is one call into `tasks_lib`; each result is a row (`--format`, JSON lines by default). The group also holds the commands of
`flows.commands.task_import` (synthesize, import-swebench) and `flows.commands.families`
(generate, new, lint)."""

from __future__ import annotations

import argparse
import sys
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from flows.cli import MAX_COUNT, MAX_WORKERS, int_between, seed
from flows.commands import families, task_import
from flows.errors import CliError
from flows.output import add_format_option, emit, progress
from rollyard.errors import EXIT_DAMAGED, EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE

VERIFY_EXIT_CODES = {"task_error": EXIT_DAMAGED}
"""`rollyard verify`'s exit code for a verdict without a score: the task is broken (4), else the
sandbox or the verifier failed (3)."""


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    tasks = subparsers.add_parser("tasks", help="generate, inspect, validate and check tasks")
    commands = tasks.add_subparsers(dest="tasks_command", required=True, metavar="COMMAND")

    demo = commands.add_parser("demo", help="write N tasks of the built-in bug-fix family")
    demo.add_argument(
        "--out", required=True, type=Path, help="a new or empty directory for the tasks"
    )
    demo.add_argument("--count", type=int_between(1, MAX_COUNT), default=10, help="tasks to write")
    demo.add_argument("--seed", type=seed, default=0, help="seed of the generator")
    add_format_option(demo, default="json")
    demo.set_defaults(handler=demo_command)

    checkout = commands.add_parser(
        "checkout", help="materialize the workspace the agent starts from"
    )
    checkout.add_argument("task", type=Path, metavar="TASK", help="the task directory")
    checkout.add_argument(
        "dest", type=Path, metavar="DEST", help="a new or empty directory (never a link)"
    )
    checkout.add_argument(
        "--solved", action="store_true", help="with the reference solution applied"
    )
    add_format_option(checkout, default="json")
    checkout.set_defaults(handler=checkout_command)

    validate = commands.add_parser(
        "validate", help="check task directories against the Harbor layout and [rollyard] schema"
    )
    validate.add_argument(
        "tasks", type=Path, nargs="+", metavar="TASK", help="task directories, or dirs of them"
    )
    add_format_option(validate, default="json")
    validate.set_defaults(handler=validate_command)

    check = commands.add_parser(
        "check", help="oracle check: the solution scores 1, the untouched workspace 0"
    )
    check.add_argument(
        "tasks", type=Path, nargs="+", metavar="TASK", help="task directories, or dirs of them"
    )
    check.add_argument(
        "--jobs", type=int_between(1, MAX_WORKERS), default=1, help="tasks checked at once"
    )
    add_format_option(check, default="json")
    check.set_defaults(handler=check_command)

    task_import.register_tasks_commands(commands)
    families.register_tasks_commands(commands)

    verify = subparsers.add_parser(
        "verify",
        help="score a workspace left by an agent against a task",
        description="Compares CANDIDATE_DIR with the task's workspace snapshot and verifies the "
        "changes in a fresh sandbox. Prints JSON: task_id, reward, status, tests, flags.",
    )
    verify.add_argument("task", type=Path, metavar="TASK", help="the task directory")
    verify.add_argument(
        "candidate", type=Path, metavar="CANDIDATE_DIR", help="the workspace the agent left"
    )
    add_format_option(verify, default="json")
    verify.set_defaults(handler=verify_command)


def _load(path: Path) -> Any:
    from tasks_lib import TaskError, load_task

    try:
        return load_task(path)
    except TaskError as error:
        raise CliError(str(error), EXIT_USAGE) from error


def demo_command(args: argparse.Namespace) -> int:
    from rollyard.out_paths import check_directory_target, filling_directory
    from tasks_lib import TaskError, generate_demo_tasks

    check_directory_target(args.out)
    try:
        with filling_directory(args.out) as staged:
            paths = generate_demo_tasks(staged.path, args.count, args.seed)
    except (TaskError, OSError) as error:
        raise CliError(f"cannot write demo tasks to {args.out}: {error}") from error
    emit(
        {
            "out": str(args.out),
            "count": len(paths),
            "seed": args.seed,
            "task_ids": [path.name for path in paths],
        }
    )
    return 0


def checkout_command(args: argparse.Namespace) -> int:
    from rollyard.out_paths import check_directory_target, filling_directory
    from sandboxes import SandboxError
    from tasks_lib import TaskError, checkout

    task = _load(args.task)
    check_directory_target(args.dest, "DEST")
    try:
        with filling_directory(args.dest, "DEST") as staged:
            checkout(task, staged.path, solved=args.solved)
    except (TaskError, SandboxError, OSError) as error:
        raise CliError(f"cannot check out {task.id} to {args.dest}: {error}") from error
    emit({"task_id": task.id, "dest": str(args.dest), "solved": args.solved})
    return 0


def _declared_id(path: Path) -> str:
    from tasks_lib.format.layout import MAX_TASK_TOML_BYTES

    try:
        if (path / "task.toml").stat().st_size > MAX_TASK_TOML_BYTES:
            return path.name  # validation names the oversized file
        doc = tomllib.loads((path / "task.toml").read_text(encoding="utf-8"))
        table = doc.get("metadata", {}).get("rollyard") or doc.get("rollyard", {})
        task_id = table.get("id")
        if isinstance(task_id, str):
            return task_id
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError, AttributeError):
        pass
    return path.name


def validate_command(args: argparse.Namespace) -> int:
    from tasks_lib import TaskNotFoundError, find_task_dirs, validate_task

    invalid = 0
    for path in find_task_dirs(args.tasks, strict=False):
        try:
            issues = [str(issue) for issue in validate_task(path)]
        except TaskNotFoundError as error:
            issues = [str(error)]
        invalid += bool(issues)
        emit({"task_id": _declared_id(path), "path": str(path), "ok": not issues, "errors": issues})
    return EXIT_FAILED if invalid else 0


def check_command(args: argparse.Namespace) -> int:
    from tasks_lib import (
        TaskError,
        TaskRefusedError,
        TaskValidationError,
        check_task,
        find_task_dirs,
        load_task,
    )

    def one(path: Path) -> dict[str, Any]:
        try:
            task = load_task(path)
        except TaskError as error:
            # One problem a line, each naming its task.toml key, as `tasks validate` lists them;
            # a task refused here (it cannot run faithfully) says so on each.
            problems = [str(error)]
            if isinstance(error, TaskValidationError):
                head = "refused task: " if isinstance(error, TaskRefusedError) else ""
                problems = [f"{head}{issue}" for issue in error.issues]
            return {
                "task_id": _declared_id(path),
                "path": str(path),
                "ok": False,
                "problems": problems,
            }
        result = check_task(task)
        summary: dict[str, Any] = {
            "task_id": task.id,
            "ok": result.ok,
            "problems": list(result.problems),
        }
        for name, verdict in (("solution", result.solution), ("untouched", result.untouched)):
            if verdict is not None:
                summary[name] = {
                    "reward": verdict.reward,
                    "status": verdict.status,
                    "flags": [flag.rule for flag in verdict.flags],
                }
        return summary

    failed = 0
    paths = find_task_dirs(args.tasks, strict=False)
    with (
        ThreadPoolExecutor(max_workers=args.jobs) as pool,
        progress("checking tasks", total=len(paths)) as advance,
    ):
        for summary in pool.map(one, paths):
            failed += not summary["ok"]
            emit(summary)
            advance(1)
    if failed:
        print(f"rollyard: {failed} of {len(paths)} task(s) failed the check", file=sys.stderr)
    return EXIT_FAILED if failed else 0


def verify_command(args: argparse.Namespace) -> int:
    from sandboxes.snapshot import TreeBounds
    from tasks_lib import CandidateChanges, TaskError, verify
    from tasks_lib.verify.candidate import CandidateBounds

    task = _load(args.task)
    try:
        # The candidate directory is a whole workspace: the task's own workspace bounds.
        bounds = CandidateBounds(tree=TreeBounds.of(task.limits))
        candidate = CandidateChanges.from_directory(
            args.candidate, task.snapshot_dir, bounds=bounds
        )
    except (TaskError, OSError) as error:
        raise CliError(str(error), EXIT_USAGE) from error
    result = verify(task, candidate)
    out = result.to_json()
    emit(
        {
            key: out[key]
            for key in ("task_id", "reward", "status", "tests", "flags", "partial_credit", "detail")
        }
    )
    if result.scored:
        return 0
    return VERIFY_EXIT_CODES.get(result.status, EXIT_UNAVAILABLE)
