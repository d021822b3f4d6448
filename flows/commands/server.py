"""`rollyard server start|stop|status`: a long-lived local Prefect server (API and UI) for a
store, which every later `rollyard` command, `rollyard serve` and notebooks on that store use."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from flows.cli import add_store_option, int_between
from rollyard.errors import EXIT_UNAVAILABLE


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "server",
        help="start, stop or show the long-lived local Prefect server (API and UI) of a store",
        description=(
            "Manage one `prefect server start` for a store, its database under STORE/prefect. "
            "While it runs, every rollyard command on the store (train, demo, evaluate, serve, "
            "...) and `flows.runtime.connect(store)` in Python use it instead of starting a "
            "server of their own, so flow runs stay in one UI. PREFECT_API_URL, when set, "
            "wins over both."
        ),
    )
    commands = parser.add_subparsers(dest="server_command", required=True, metavar="COMMAND")
    for name, help_text in (
        ("start", "start the server in the background (nothing happens if it runs already)"),
        ("stop", "stop the server"),
        ("status", "say whether the server runs and where (exit code 3 when it does not)"),
    ):
        command = commands.add_parser(name, help=help_text)
        add_store_option(command)
        if name == "start":
            command.add_argument(
                "--port",
                type=int_between(1, 65535),
                default=None,
                help="port to serve on (default: 4200, or the next free one)",
            )
        command.set_defaults(handler=server_command)


def server_command(args: argparse.Namespace) -> int:
    from flows.runtime import (
        prefect_home_for,
        quiet_environment,
        running_server,
        start_server,
        stop_server,
    )

    quiet_environment()
    home = prefect_home_for(str(Path(args.store).absolute()))
    if args.server_command == "start":
        state = start_server(home, port=args.port)
        print(f"Prefect server running (pid {state.pid})")
        print(f"  UI:  {state.ui_url}")
        print(f"  API: {state.api_url}")
        print(f"rollyard commands with --store {args.store} use it; elsewhere:")
        print(f"  export PREFECT_API_URL={state.api_url}")
        return 0
    if args.server_command == "stop":
        stopped = stop_server(home)
        print(f"stopped the server at {stopped.ui_url}" if stopped else "no server was running")
        return 0
    running = running_server(home)
    if running is None:
        print(f"no server running for {args.store} (`rollyard server start` starts one)")
        return EXIT_UNAVAILABLE
    print(f"running (pid {running.pid}): UI {running.ui_url}, API {running.api_url}")
    return 0
