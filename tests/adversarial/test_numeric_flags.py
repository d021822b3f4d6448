"""Every numeric flag of every command has a stated, enforced maximum: a value past it (or not a
number at all: inf, nan) is one usage line naming the flag and exit 2, before anything runs."""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.cli import Bounded, HelpFormatter, build_parser, main


def every_option(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser, argparse.Action]]:
    """Every argument of every command, sub-commands of sub-commands included."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from every_option(sub, (*path, name))
        else:
            yield path, parser, action


def is_numeric(action: argparse.Action) -> bool:
    default = action.default
    number_default = isinstance(default, int | float) and not isinstance(default, bool)
    typed = action.type is not None and action.type not in (str, Path)
    return action.nargs != 0 and (typed or number_default)


ALL = list(every_option(build_parser()))
OPTIONS = [(path, parser, action) for path, parser, action in ALL if is_numeric(action)]
IDS = [
    f"{' '.join(path)} {(action.option_strings or [action.dest])[0]}" for path, _, action in OPTIONS
]


def stated_maxima(help_text: str) -> list[float]:
    """The numbers `--help` gives after "at most" ("at most 86,400"); none for a help that merely
    reads "tasks to keep at most"."""
    return [
        float(n.replace(",", "")) for n in re.findall(r"at most (\d[\d,]*(?:\.\d+)?)", help_text)
    ]


def test_the_walk_finds_the_numeric_flags_of_every_command() -> None:
    # A guard on the walk itself: were it to find nothing, every test below would pass vacuously.
    commands = {" ".join(path) for path, _, _ in ALL}
    assert len(commands) > 40 and {"tasks synthesize", "sandbox run", "evaluate"} <= commands
    assert len(OPTIONS) > 60
    assert {"train --workers", "evaluate --temperature", "sandbox run --memory-mb"} <= set(IDS)
    # The options whose help once said "at most" without a number, so no maximum was shown.
    assert {"tasks synthesize --max", "tasks synthesize --max-mutants",
            "tasks import-swebench --limit", "evaluate --max-steps",
            "evaluate --max-tokens"} <= set(IDS)  # fmt: skip


@pytest.mark.parametrize(("path", "parser", "action"), OPTIONS, ids=IDS)
def test_every_numeric_flag_is_bounded_and_says_so(
    path: tuple[str, ...], parser: argparse.ArgumentParser, action: argparse.Action
) -> None:
    assert isinstance(action.type, Bounded), (
        f"rollyard {' '.join(path)} {action.option_strings}: type {action.type!r} has no maximum; "
        "use flows.cli.int_between / float_between / positive_float_up_to"
    )
    assert math.isfinite(action.type.maximum)
    shown = re.sub(r"\s+", " ", HelpFormatter(parser.prog)._expand_help(action))
    assert action.type.maximum in stated_maxima(shown), shown


@pytest.mark.parametrize(("path", "parser", "action"), OPTIONS, ids=IDS)
def test_values_past_the_maximum_are_one_usage_line(
    path: tuple[str, ...],
    parser: argparse.ArgumentParser,
    action: argparse.Action,
    capsys: pytest.CaptureFixture[str],
) -> None:
    bound = action.type
    assert isinstance(bound, Bounded)
    flag = action.option_strings[0]
    too_big = str(int(bound.maximum) + 1) if bound.kind is int else repr(bound.maximum * 10)
    hostile = [too_big, "1e400" if bound.kind is float else "9" * 40]
    if bound.kind is float:
        hostile += ["inf", "nan", "-inf"]
    for value in hostile:
        with pytest.raises(SystemExit) as exited:
            main([*path, f"{flag}={value}"])
        err = capsys.readouterr().err
        assert exited.value.code == 2, (value, err)
        assert len(err.strip().splitlines()) == 1 and flag in err, (value, err)
