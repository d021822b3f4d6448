"""`rollyard sandbox ...`: run one command in a fresh sandbox, check the host, sweep orphans,
inspect and prune the snapshot cache. A `SandboxError` reaches the CLI's `main`, which exits with
its code (3 for a host that cannot run sandboxes, 2 for a bad snapshot or limits)."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from flows.cli import int_between, positive_float_up_to
from flows.errors import CliError
from flows.output import add_format_option, emit, note
from rollyard.errors import EXIT_USAGE
from sandboxes.base import LIMIT_MAXIMA

# flag -> (Limits field, help); each flag's maximum is the field's (sandboxes.base.LIMIT_MAXIMA).
RUN_LIMIT_FLAGS = {
    "--timeout-s": ("wall_time_s", "wall-clock limit of the command"),
    "--cpu-time-s": ("cpu_time_s", "CPU seconds the command may use in all"),
    "--memory-mb": ("memory_mb", "memory of all its processes together"),
    "--pids": ("pids", "processes and threads alive at once"),
    "--cpus": ("cpus", "CPU bandwidth in cores"),
    "--disk-mb": ("disk_mb", "bytes the workspace may grow by, and the size of /tmp"),
    "--output-bytes": ("output_bytes", "captured bytes per stream"),
    "--workspace-mb": ("workspace_mb", "size of WORKSPACE, apparent and allocated bytes"),
    "--workspace-files": ("workspace_files", "files and directories in WORKSPACE"),
}


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    sandbox = subparsers.add_parser("sandbox", help="run commands in isolated sandboxes")
    commands = sandbox.add_subparsers(dest="sandbox_command", required=True, metavar="COMMAND")

    run = commands.add_parser(
        "run",
        help="run CMD in a fresh sandbox over a copy-on-write view of WORKSPACE",
        description="Runs CMD in a fresh sandbox (cwd = the workspace) and prints one JSON "
        "object. WORKSPACE itself is never modified.",
    )
    from sandboxes.base import Limits

    defaults = Limits()
    for flag, (field, help_text) in RUN_LIMIT_FLAGS.items():
        maximum = LIMIT_MAXIMA[field]
        default = getattr(defaults, field)
        parse = (
            positive_float_up_to(maximum) if isinstance(default, float) else int_between(1, maximum)
        )
        run.add_argument(
            flag, dest=field, type=parse, default=None, metavar=field.rsplit("_", 1)[-1].upper(),
            help=f"{help_text} (default {default:g}, at most {maximum})"
            if isinstance(default, float) else f"{help_text} (default {default}, at most {maximum})",
        )  # fmt: skip
    run.add_argument("workspace", metavar="WORKSPACE", help="directory the sandbox starts from")
    run.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD [ARGS...]",
                     help="the command to run, after --")  # fmt: skip
    add_format_option(run, default="json")
    run.set_defaults(handler=run_command)

    check = commands.add_parser("check", help="check that this host can run sandboxes")
    add_format_option(check)
    check.set_defaults(handler=check_command)

    sweep = commands.add_parser(
        "sweep", help="reclaim sandboxes whose owning process died (processes, mounts, cgroups)"
    )
    add_format_option(sweep)
    sweep.set_defaults(handler=sweep_command)

    cache = commands.add_parser(
        "cache",
        help="inspect and prune the snapshot cache (private copies of workspaces)",
        description="The bwrap backend keeps a private copy of each workspace it opened, by "
        "content digest. After each new copy, least recently used ones beyond the budget "
        "(ROLLYARD_SNAPSHOT_CACHE_MB, default 4096) that no sandbox has mounted are evicted.",
    )
    cache_commands = cache.add_subparsers(dest="cache_command", required=True, metavar="ACTION")
    listing = cache_commands.add_parser("list", help="entries, least recently used first")
    add_format_option(listing)
    listing.set_defaults(handler=cache_list_command)
    prune = cache_commands.add_parser(
        "prune",
        help="evict least recently used entries down to a size",
        description="Evicts least recently used entries until the cache holds at most --max-mb; "
        "entries mounted by a sandbox, or opened in the last minute, stay.",
    )
    prune.add_argument(
        "--max-mb", type=int_between(0, LIMIT_MAXIMA["disk_mb"]), default=None,
        help="size to prune down to (default: the budget; 0 evicts every entry not in use)",
    )  # fmt: skip
    add_format_option(prune)
    prune.set_defaults(handler=cache_prune_command)


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
    overrides = {field: getattr(args, field) for field, _ in RUN_LIMIT_FLAGS.values()}
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
    emit(report)
    return 0


def check_command(args: argparse.Namespace) -> int:
    from sandboxes.host import check_host

    bwrap = check_host()
    emit({"backend": "bwrap", "usable": True, "bwrap": str(bwrap)})
    return 0


def sweep_command(args: argparse.Namespace) -> int:
    from sandboxes.host import host_layout, sweep_orphans

    reclaimed = sweep_orphans(host_layout())
    emit({"reclaimed": len(reclaimed), "sandboxes": list(reclaimed)})
    return 0


# A manual prune leaves entries opened this recently: an opener between its cache hit and its
# mount is not yet visible as a mount.
_MANUAL_PRUNE_GRACE_S = 60.0


def cache_list_command(args: argparse.Namespace) -> int:
    from sandboxes.host import host_layout
    from sandboxes.snapshot import SnapshotCache, default_cache_budget_bytes

    entries = SnapshotCache(host_layout().snapshots).entries()
    now = time.time()
    for entry in entries:
        emit(
            {
                "digest": entry.name,
                "size_mb": round(entry.size_bytes / (1 << 20), 1),
                "last_used": _ago(now - entry.last_used),
                "in_use": entry.mounted,
            }
        )
    total_mb = sum(e.size_bytes for e in entries) / (1 << 20)
    note(
        f"{len(entries)} entries, {total_mb:.1f} MB of a {default_cache_budget_bytes() >> 20} MB "
        "budget"
    )
    return 0


def cache_prune_command(args: argparse.Namespace) -> int:
    from sandboxes.host import host_layout
    from sandboxes.snapshot import SnapshotCache, default_cache_budget_bytes

    budget = default_cache_budget_bytes() if args.max_mb is None else args.max_mb << 20
    cache = SnapshotCache(host_layout().snapshots)
    evicted = cache.prune(budget, grace_s=_MANUAL_PRUNE_GRACE_S)
    freed_mb = sum(e.size_bytes for e in evicted) / (1 << 20)
    kept_mb = sum(e.size_bytes for e in cache.entries()) / (1 << 20)
    emit({"evicted": len(evicted), "freed_mb": round(freed_mb, 1), "kept_mb": round(kept_mb, 1)})
    return 0


def _ago(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"
