"""`rollyard completion bash|zsh`: print a shell completion script for every command and option,
generated from the parser itself (`shtab`), so it never lags behind the commands."""

from __future__ import annotations

import argparse
from typing import Any

SHELLS = ("bash", "zsh")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "completion",
        help="print a bash or zsh completion script",
        description=(
            "Print a completion script for SHELL. bash: `rollyard completion bash > "
            "~/.local/share/bash-completion/completions/rollyard`; zsh: `rollyard completion "
            "zsh > ~/.zfunc/_rollyard` with ~/.zfunc on $fpath before compinit."
        ),
    )
    parser.add_argument("shell", choices=SHELLS, metavar="SHELL", help="bash or zsh")
    parser.set_defaults(handler=completion_command)


def completion_command(args: argparse.Namespace) -> int:
    import shtab

    from flows.cli import build_parser

    print(shtab.complete(build_parser(), shell=args.shell))
    return 0
