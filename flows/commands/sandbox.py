"""`rollyard sandbox ...`: run one command in a fresh sandbox, check the host, sweep orphans.
A `SandboxError` reaches the CLI's `main`, which exits with its code (3 for a host that cannot
run sandboxes, 2 for a bad snapshot or limits)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from flows.cli import positive_float, positive_int
from flows.errors import CliError
from rollyard.errors import EXIT_USAGE


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = subparsers.add_parser("sandbox", help="run commands in isolated sandboxes")
    commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run CMD in a fresh sandbox over a copy-on-write view of WORKSPACE",
        description="Runs CMD in a fresh sandbox (cwd = the workspace) and prints one JSON "
        "object. WORKSPACE itself is never modified.",
    )
    run.add_argument("--timeout-s", type=positive_float, default=None, help="wall-clock limit")
    run.add_argument("--memory-mb", type=positive_int, default=None)
    run.add_argument("--pids", type=positive_int, default=None)
    run.add_argument("--disk-mb", type=positive_int, default=None)
    run.add_argument("--output-bytes", type=positive_int, default=None)
    run.add_argument("--cpus", type=positive_float, default=None)
    run.add_argument("workspace", metavar="WORKSPACE", help="directory the sandbox starts from")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]")
    run.set_defaults(handler=run_command)

    check = commands.add_parser("check", help="check that this host can run sandboxes")
    check.set_defaults(handler=check_command)

    sweep = commands.add_parser(
        "sweep", help="reclaim sandboxes whose owning process died (processes, mounts, cgroups)"
    )
    sweep.set_defaults(handler=sweep_command)


def run_command(args: argparse.Namespace) -> int:
    from sandboxes import Limits, open_sandbox

    command = list(args.cmd)
    if command and command[0] == "--":
        command = command[1:]
    if not command:
        raise CliError("no command given: use `rollyard sandbox run WORKSPACE -- CMD`", EXIT_USAGE)
    workspace = Path(args.workspace)
    if not workspace.is_dir():
        raise CliError(f"workspace {workspace} is not a directory", EXIT_USAGE)
    overrides = {
        "wall_time_s": args.timeout_s,
        "memory_mb": args.memory_mb,
        "pids": args.pids,
        "disk_mb": args.disk_mb,
        "output_bytes": args.output_bytes,
        "cpus": args.cpus,
    }
    limits = Limits(**{k: v for k, v in overrides.items() if v is not None})
    with open_sandbox(workspace, limits=limits) as sandbox:
        result = sandbox.execute(command)
        diff = sandbox.diff()
        digest = sandbox.snapshot_digest
    report = {
        "exit_code": result.exit_code,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "timed_out": result.timed_out,
        "oom_killed": result.oom_killed,
        "output_truncated": result.output_truncated,
        "duration_s": round(result.duration_s, 6),
        "changed_paths": list(diff.changed_paths),
        "added": list(diff.added),
        "modified": list(diff.modified),
        "deleted": list(diff.deleted),
        "snapshot_digest": digest,
    }
    json.dump(report, sys.stdout)
    sys.stdout.write("\n")
    return 0


def check_command(args: argparse.Namespace) -> int:
    from sandboxes.host import check_host

    bwrap = check_host()
    print(f"ok: bwrap backend usable ({bwrap})")
    return 0


def sweep_command(args: argparse.Namespace) -> int:
    from sandboxes.host import host_layout, sweep_orphans

    reclaimed = sweep_orphans(host_layout())
    print(f"reclaimed {len(reclaimed)} orphaned sandbox(es)")
    return 0
