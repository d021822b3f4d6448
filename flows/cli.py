"""The `rollyard` command line. Each command group lives in `flows/commands/<name>.py` and
exposes `register(subparsers)`; heavy imports (Prefect, torch, GX) happen inside the handlers so
`rollyard sandbox run` starts in milliseconds."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from typing import NoReturn

# One line per command module; each adds its sub-commands to the parser.
COMMAND_MODULES = (
    "flows.commands.tasks",
    "flows.commands.sandbox",
    "flows.commands.train",
    "flows.commands.audit",
    "flows.commands.query",
    "flows.commands.store",
    "flows.commands.task_import",
    "flows.commands.curate",
    "flows.commands.serve",
    "flows.commands.report",
    "flows.commands.domains",
)

EXIT_USAGE = 2


def int_between(minimum: int, maximum: int | None = None) -> Callable[[str], int]:
    """An argparse type: an integer >= `minimum` (and <= `maximum`, when given)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum}, got {text}")
        return value

    return parse


positive_int = int_between(1)
non_negative_int = int_between(0)


def positive_float_up_to(maximum: float | None = None) -> Callable[[str], float]:
    """An argparse type: a finite number > 0 (and <= `maximum`, when given)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not value > 0 or value == float("inf"):
            raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
        if maximum is not None and value > maximum:
            raise argparse.ArgumentTypeError(f"must be at most {maximum:g}, got {text}")
        return value

    return parse


positive_float = positive_float_up_to()


class CliError(Exception):
    """A one-line error for the user; the CLI prints it and exits with `exit_code`."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message, exit_code)
        self.message = message
        self.exit_code = exit_code


class _OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors as one line (what is wrong, where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="rollyard",
        description="Agent RL on executable tasks: sandboxes, tasks, training, store, gates.",
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.handler(args)
    except CliError as error:
        print(f"rollyard: error: {error.message}", file=sys.stderr)
        return error.exit_code
    except KeyboardInterrupt:
        return 130
    return int(code or 0)


if __name__ == "__main__":
    # Run the imported module's main: under `python -m flows.cli` this file is also loaded as
    # `__main__`, and commands raise `flows.cli.CliError`, not `__main__.CliError`.
    from flows.cli import main as imported_main

    sys.exit(imported_main())
