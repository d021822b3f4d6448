"""`rollyard tasks generate|new|lint`: task families on the command line — write tasks of a
built-in family, scaffold a new family, report weak tasks. Output is JSON lines, like
`rollyard tasks`; `flows.commands.tasks` adds these to its group."""

from __future__ import annotations

import argparse
from pathlib import Path

from flows.cli import MAX_COUNT, int_between, seed
from flows.errors import CliError
from flows.output import add_format_option, emit, progress
from rollyard.errors import EXIT_FAILED

FAMILIES = ("data_analysis", "flags", "ops", "settings")
"""The built-in families beyond bug fixing (`rollyard tasks demo` writes bug-fix tasks)."""


def register_tasks_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the family commands to the `tasks` group's sub-commands."""
    generate = commands.add_parser(
        "generate", help="write N tasks of a built-in family (" + ", ".join(FAMILIES) + ")"
    )
    generate.add_argument("family", choices=FAMILIES, metavar="FAMILY", help=" | ".join(FAMILIES))
    generate.add_argument(
        "--out", required=True, type=Path, help="a new or empty directory for the tasks"
    )
    generate.add_argument(
        "--count", type=int_between(1, MAX_COUNT), default=8, help="tasks to write"
    )
    generate.add_argument("--seed", type=seed, default=0, help="seed of the generator")
    add_format_option(generate, default="json")
    generate.set_defaults(handler=generate_command)

    new = commands.add_parser(
        "new", help="scaffold a task family: generator, verifier choice, docs, test"
    )
    new.add_argument("name", metavar="FAMILY_NAME", help="Python package name of the family")
    new.add_argument("--dir", type=Path, default=Path("."), help="where the family package goes")
    new.add_argument("--verifier", choices=("artifact", "rules"), default="artifact",
                     help="how the family's tasks are scored: an artifact check or rules")  # fmt: skip
    add_format_option(new, default="json")
    new.set_defaults(handler=new_command)

    lint = commands.add_parser("lint", help="report weak tasks: no hidden checks, solvable by the "
                               "empty action, answer in the instruction, verifier over its budget")  # fmt: skip
    lint.add_argument("tasks", type=Path, nargs="+", metavar="DIR",
                      help="task directories, or dirs of them")  # fmt: skip
    add_format_option(lint, default="json")
    lint.add_argument("--static", action="store_true", help="skip the checks that run the verifier")
    lint.set_defaults(handler=lint_command)


def generate_command(args: argparse.Namespace) -> int:
    from rollyard.out_paths import check_directory_target, filling_directory
    from tasks_lib import TaskError

    check_directory_target(args.out)
    try:
        if args.family == "data_analysis":
            from tasks_lib.sources.families.data_analysis import (
                generate_data_analysis_tasks as generate,
            )
        elif args.family == "settings":
            from tasks_lib.sources.families.settings import generate_settings_tasks as generate
        elif args.family == "flags":
            from tasks_lib.sources.families.settings import generate_flags_tasks as generate
        else:
            from tasks_lib.sources.families.ops import generate_ops_tasks as generate
        with filling_directory(args.out) as staged:
            paths = generate(staged.path, args.count, args.seed)
    except (TaskError, OSError) as error:
        raise CliError(f"cannot write {args.family} tasks to {args.out}: {error}") from error
    emit({"family": args.family, "out": str(args.out), "count": len(paths), "seed": args.seed,
            "task_ids": [p.name for p in paths]})  # fmt: skip
    return 0


def new_command(args: argparse.Namespace) -> int:
    from tasks_lib.errors import ScaffoldError
    from tasks_lib.sources.authoring import scaffold_family

    try:
        files = scaffold_family(args.name, args.dir, verifier=args.verifier)
    except (ScaffoldError, OSError) as error:
        raise CliError(str(error)) from error
    test = next(f for f in files if f.name.startswith("test_"))
    emit({"family": args.name, "verifier": args.verifier, "files": [str(f) for f in files],
            "next": f"python -m pytest {test}"})  # fmt: skip
    return 0


def lint_command(args: argparse.Namespace) -> int:
    from tasks_lib import find_task_dirs
    from tasks_lib.sources.authoring.lint import lint_task

    weak = 0
    paths = find_task_dirs(args.tasks, strict=False)
    with progress("linting tasks", total=len(paths)) as advance:
        for path in paths:
            report = lint_task(path, run_verifier=not args.static)
            weak += report.weak
            emit(report.to_json())
            advance(1)
    return EXIT_FAILED if weak else 0
