"""The `rollyard` command line. Each command group lives in `flows/commands/<name>.py` and
exposes `register(subparsers)`; heavy imports (Prefect, torch, GX) happen inside the handlers so
`rollyard sandbox run` starts in milliseconds. Any `RollyardError` that reaches `main` is printed
as one line and exits with its class's code (`rollyard.errors.EXIT_CODE_MEANINGS`)."""

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Callable, Sequence
from typing import NoReturn

from rollyard.errors import (
    EXIT_CODE_MEANINGS,
    EXIT_INTERRUPTED,
    EXIT_USAGE,
    RollyardError,
    exit_code_for,
)

# One line per command module; each adds its command group to the parser.
COMMAND_MODULES = (
    "flows.commands.tasks",
    "flows.commands.sandbox",
    "flows.commands.train",
    "flows.commands.evaluate",
    "flows.commands.audit",
    "flows.commands.query",
    "flows.commands.store",
    "flows.commands.export",
    "flows.commands.curate",
    "flows.commands.serve",
    "flows.commands.server",
    "flows.commands.report",
    "flows.commands.review",
)


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


class _OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors as one line (what is wrong, where to look) and exit code 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


def exit_codes_epilog() -> str:
    """The exit-code table as `--help` prints it."""
    rows = [
        textwrap.fill(meaning, 88, initial_indent=f"  {code:>3}  ", subsequent_indent=" " * 7)
        for code, meaning in EXIT_CODE_MEANINGS
    ]
    return "exit codes:\n" + "\n".join(rows)


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineErrorParser(
        prog="rollyard",
        description="Agent RL on executable tasks: sandboxes, tasks, training, store, gates.",
        epilog=exit_codes_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module_name in COMMAND_MODULES:
        importlib.import_module(module_name).register(subparsers)
    return parser


def one_line(error: BaseException) -> str:
    """An error's message on one line (a multi-line message's lines joined with `; `)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return "; ".join(lines) or type(error).__name__


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = args.handler(args)
    except RollyardError as error:
        print(f"rollyard: error: {one_line(error)}", file=sys.stderr)
        return exit_code_for(error)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
