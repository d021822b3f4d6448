"""The `rollyard` command line. Each command group lives in `flows/commands/<name>.py` and
exposes `register(subparsers)`; heavy imports (Prefect, torch, GX) happen inside the handlers so
`rollyard sandbox run` starts in milliseconds. Any `RollyardError` that reaches `main` is printed
as one line and exits with its class's code (`rollyard.errors.EXIT_CODE_MEANINGS`).

The conventions every option follows (tests/docs/test_cli_help.py checks them on every command):
every option has help text; its default is shown by `HelpFormatter` (do not write it into the
help, unless the default needs words: then say "default: ..." yourself); `--store` comes from
`add_store_option` (default `ROLLYARD_STORE`); a command that prints results takes
`flows.output.add_format_option` and hands its rows to `flows.output.emit` (stdout, in the
chosen format), with summaries (`flows.output.note`), logs and `flows.output.progress` bars on
stderr.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import sys
import textwrap
from collections.abc import Sequence
from typing import Any, NoReturn

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
    "flows.commands.sft",
    "flows.commands.audit",
    "flows.commands.query",
    "flows.commands.store",
    "flows.commands.export",
    "flows.commands.curate",
    "flows.commands.serve",
    "flows.commands.server",
    "flows.commands.report",
    "flows.commands.review",
    "flows.commands.completion",
)


# The most a numeric flag accepts, shared by every command: past these a value is a typo or an
# attack on the host (a LocalCluster of 100,000 worker processes, a timeout of 30 years), not a
# bigger job. A command with a tighter bound of its own names it beside its option.
MAX_COUNT = 100_000
"""Tasks, iterations, samples, rows: how many of a thing one command makes or reads."""
MAX_GROUP_SIZE = 1_024
"""Episodes of one task in an iteration (a GRPO group) or samples of one task in an evaluation."""
MAX_SHARDS = 10_000
"""Prefect tasks (episode shards) per iteration."""
MAX_STEPS = 10_000
"""Actions in one episode."""
MAX_ATTEMPTS = 100
"""Attempts of one episode after infrastructure failures."""
MAX_IN_FLIGHT = 1_024
"""Model requests one shard keeps in flight."""
MAX_WORKERS = 256
"""Processes or threads one command starts on this host."""
MAX_SECONDS = 7 * 24 * 3600
"""Any duration: timeouts, deadlines, grace periods, schedules."""
MAX_SEED = 2**32 - 1
"""Seeds: numpy's and torch's generators take 32 bits."""


@dataclasses.dataclass(frozen=True, slots=True)
class Bounded:
    """An argparse type: a number in [`minimum`, `maximum`] (`minimum` excluded when
    `exclusive_minimum`). `--help` states the maximum of every option typed this way
    (`HelpFormatter`), and tests/adversarial/test_numeric_flags.py checks that every numeric
    option is."""

    kind: type[int] | type[float]
    minimum: float
    maximum: float
    exclusive_minimum: bool = False

    def __call__(self, text: str) -> int | float:
        try:
            value = self.kind(text)
        except ValueError:
            noun = "an integer" if self.kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {noun}, got {text!r}") from None
        if value != value:  # NaN compares false with every bound
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}")
        if self.exclusive_minimum and not value > self.minimum:
            raise argparse.ArgumentTypeError(f"must be more than {self.minimum:g}, got {text}")
        if value < self.minimum:
            raise argparse.ArgumentTypeError(f"must be at least {self.minimum:g}, got {text}")
        if value > self.maximum:
            raise argparse.ArgumentTypeError(f"must be at most {self.maximum:,g}, got {text}")
        return value

    @property
    def __name__(self) -> str:  # argparse names the type in its "invalid value" message
        return self.kind.__name__

    def stated_maximum(self) -> str:
        return f"{self.maximum:,.0f}" if self.maximum >= 1000 else f"{self.maximum:g}"

    def is_stated_in(self, text: str) -> bool:
        """Whether `text` already says this maximum ("at most 86400", "at most 86,400"); a help
        worded "tasks to keep at most" states no number."""
        return any(
            float(found.replace(",", "")) == self.maximum
            for found in re.findall(r"at most (\d[\d,]*(?:\.\d+)?)", text)
        )


def int_between(minimum: int, maximum: int) -> Bounded:
    """An argparse type: an integer in [`minimum`, `maximum`]."""
    return Bounded(int, minimum, maximum)


def positive_float_up_to(maximum: float) -> Bounded:
    """An argparse type: a number > 0 and <= `maximum`."""
    return Bounded(float, 0.0, maximum, exclusive_minimum=True)


def float_between(minimum: float, maximum: float) -> Bounded:
    """An argparse type: a number in [`minimum`, `maximum`]."""
    return Bounded(float, minimum, maximum)


seed = int_between(0, MAX_SEED)
"""Every `--seed`."""


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Help that shows each option's default, "(default: X)", unless its help already says
    what the default is (options without one, None, and flags show none), and the maximum of
    each numeric option ("at most N")."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        stated = []
        if has_shown_default(action) and "default" not in text.lower():
            stated.append("default: %(default)s")
        if isinstance(action.type, Bounded) and not action.type.is_stated_in(text):
            stated.append(f"at most {action.type.stated_maximum()}")
        if not stated:
            return text
        return f"{text} ({'; '.join(stated)})" if text else "; ".join(stated)


def has_shown_default(action: argparse.Action) -> bool:
    """Whether `--help` shows a default for `action`: an option taking a value whose default is
    a value (not None, not an empty list)."""
    return (
        bool(action.option_strings)
        and action.nargs != 0
        and action.default is not None
        and action.default is not argparse.SUPPRESS
        and action.default not in ([], ())
    )


def add_store_option(parser: argparse.ArgumentParser) -> None:
    """The `--store` option: the trajectory store root; `main` fills in `ROLLYARD_STORE` (or
    `.rollyard`) when it is not given, so `--help` and the README read the same everywhere."""
    parser.add_argument(
        "--store",
        default=None,
        help="trajectory store root, a directory or object-storage URI "
        "(default: $ROLLYARD_STORE, else .rollyard)",
    )


class _OneLineErrorParser(argparse.ArgumentParser):
    """Usage errors as one line (what is wrong, where to look) and exit code 2; help through
    `HelpFormatter` (sub-command parsers are made by the same class, so they share both)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

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
    from rollyard import __version__

    parser = _OneLineErrorParser(
        prog="rollyard",
        description="Agent RL on executable tasks: sandboxes, tasks, training, store, gates.",
        epilog=exit_codes_epilog(),
    )
    parser.add_argument(
        "--version", action="version", version=f"rollyard {__version__}", help="print the version"
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
    from flows.output import FORMATS, printing_results
    from rollyard.settings import settings

    output_format = getattr(args, "format", None)
    try:
        if getattr(args, "store", "") is None:
            args.store = settings().store
        with printing_results(output_format if output_format in FORMATS else None):
            code = args.handler(args)
    except RollyardError as error:
        print(f"rollyard: error: {one_line(error)}", file=sys.stderr)
        return exit_code_for(error)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    return int(code or 0)


if __name__ == "__main__":
    sys.exit(main())
