"""`rollyard tasks synthesize` and `rollyard tasks import-swebench`: tasks from real repositories.
`flows.commands.tasks` adds both to its group; output is JSON lines."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from flows.cli import MAX_COUNT, MAX_WORKERS, int_between, seed
from flows.errors import CliError
from flows.output import add_format_option, emit, note, progress
from rollyard.errors import EXIT_DAMAGED, EXIT_FAILED

EXIT_NOTHING = EXIT_FAILED
"""Nothing was kept or imported."""
EXIT_SOME_ROWS_FAILED = EXIT_DAMAGED
"""Some rows were imported, others are broken tasks (each reported with its error)."""


def register_tasks_commands(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Add the import commands to the `tasks` group's sub-commands."""

    synth = commands.add_parser(
        "synthesize",
        help="bug-fix tasks from a Python project with a pytest suite (AST mutants)",
        description="Injects bugs with AST mutation operators, keeps the mutants the project's "
        "own tests catch reliably, and writes each as a Harbor task under --out. Prints one JSON "
        "report: mutants tried, tasks kept, verdict counts, time.",
    )
    synth.add_argument("project", type=Path, metavar="PROJECT_DIR",
                       help="root of the Python project to mutate")  # fmt: skip
    synth.add_argument(
        "--out", required=True, type=Path, help="a new or empty directory for the tasks"
    )
    synth.add_argument("--max", type=int_between(1, MAX_COUNT), default=10, dest="max_tasks",
                       help="tasks to keep (default 10)")  # fmt: skip
    synth.add_argument("--max-mutants", type=int_between(1, MAX_COUNT), default=None,
                       help="mutants to try (default 8 per task)")  # fmt: skip
    synth.add_argument("--seed", type=seed, default=0, help="seed of the mutant choice")
    synth.add_argument("--workers", type=int_between(0, MAX_WORKERS), default=0,
                       help="evaluate mutants on a local Dask cluster of N workers (0: in process)")  # fmt: skip
    synth.add_argument("--scheduler", default=None,
                       help="address of a Dask scheduler to evaluate mutants on")  # fmt: skip
    synth.add_argument("--no-check", action="store_true",
                       help="skip the oracle check of each kept task")  # fmt: skip
    add_format_option(synth, default="json")
    synth.set_defaults(handler=synthesize_command)

    swebench = commands.add_parser(
        "import-swebench",
        help="Harbor tasks from SWE-bench instance rows and local clones",
        description="Reads SWE-bench instances (JSONL: instance_id, repo, base_commit, patch, "
        "test_patch, FAIL_TO_PASS, PASS_TO_PASS, problem_statement) and writes one task per row "
        "from the clones under --repos (OWNER/NAME, OWNER__NAME or NAME). Each task runs in its "
        "repository's environment image, built in layers keyed by content (base, env, instance; "
        "docs/swebench.md); an instance is admitted only when its FAIL_TO_PASS tests fail before "
        "the gold patch and pass after it, and its PASS_TO_PASS tests pass both times (needs a "
        "Docker engine). Prints one JSON line per row; a bad or refused row is reported with the "
        "reason and the rest still import.",
    )
    swebench.add_argument("instances", type=Path, metavar="FILE.jsonl",
                          help="SWE-bench instances, one JSON object per line")  # fmt: skip
    swebench.add_argument("--repos", required=True, type=Path,
                          help="mirror directory of local clones (bare or not)")  # fmt: skip
    swebench.add_argument(
        "--out", required=True, type=Path, help="a new or empty directory for the tasks"
    )
    swebench.add_argument("--specs", type=Path, default=None, metavar="FILE.json",
                          help="install specs by repo and version, in SWE-bench's shape "
                          "(default: the local Python, pip install -e .)")  # fmt: skip
    swebench.add_argument(
        "--limit", type=int_between(1, MAX_COUNT), default=None, help="rows to read (default: all)"
    )
    swebench.add_argument("--no-check", action="store_true",
                          help="write the tasks without building their images or checking the "
                          "gold patch (not admitted: check them with `rollyard tasks check`)")  # fmt: skip
    add_format_option(swebench, default="json")
    swebench.set_defaults(handler=import_swebench_command)


def synthesize_command(args: argparse.Namespace) -> int:
    from rollyard.out_paths import check_directory_target, filling_directory
    from sandboxes import SandboxError
    from tasks_lib import TaskError
    from tasks_lib.curate import CurationSettings
    from tasks_lib.sources.synthesize import synthesize_tasks

    if not args.project.is_dir():
        raise CliError(f"{args.project} is not a directory; pass a Python project root")
    check_directory_target(args.out)
    client = None
    cluster = None
    try:
        if args.scheduler or args.workers > 0:
            from distributed import Client, LocalCluster

            from flows.runtime import local_cluster_kwargs

            if args.scheduler:
                client = Client(args.scheduler)
            else:
                cluster = LocalCluster(**local_cluster_kwargs(args.workers))
                client = Client(cluster)
        # A mutant breaking more tests than curation admits is dropped here already.
        max_fail_to_pass = CurationSettings.from_env().max_fail_to_pass
        with (
            progress(f"synthesizing tasks from {args.project}"),
            filling_directory(args.out) as staged,
        ):
            report = synthesize_tasks(
                args.project, staged.path, max_tasks=args.max_tasks, seed=args.seed,
                max_mutants=args.max_mutants, executor=client, check=not args.no_check,
                max_fail_to_pass=max_fail_to_pass,
            )  # fmt: skip
            if not report.tasks_kept:
                staged.discard()
    except (TaskError, SandboxError, OSError) as error:
        raise CliError(f"cannot synthesize tasks from {args.project}: {error}") from error
    finally:
        if client is not None:
            client.close()
        if cluster is not None:
            cluster.close()
    if report.hardlinks_left_out:
        note(
            f"rollyard: left out {len(report.hardlinks_left_out)} hard-linked file(s) whose other "
            f"names lie outside {args.project} (e.g. {report.hardlinks_left_out[0]}); copy the "
            "project with `cp -r` to keep them"
        )
    emit(report.to_json() | {"task_dirs": [str(staged.final(d)) for d in report.task_dirs]})
    return 0 if report.tasks_kept else EXIT_NOTHING


def import_swebench_command(args: argparse.Namespace) -> int:
    from rollyard.out_paths import check_directory_target, filling_directory
    from tasks_lib import TaskError
    from tasks_lib.sources.swebench import ImportedRow, import_swebench

    def emit_row(row: ImportedRow) -> None:
        task_dir = str(staged.final(row.task_dir)) if row.task_dir else ""
        emit(row.to_json() | {"task_dir": task_dir})

    check_directory_target(args.out)
    try:
        with filling_directory(args.out) as staged:
            report = import_swebench(
                args.instances, args.repos, staged.path, limit=args.limit, specs=args.specs,
                check=not args.no_check, progress=emit_row,
            )  # fmt: skip
            if not report.imported:
                staged.discard()
    except (TaskError, OSError) as error:
        raise CliError(str(error)) from error
    print(
        f"rollyard: imported {report.imported} of {len(report.rows)} row(s)"
        + (f"; {report.failed} failed (see their error)" if report.failed else ""),
        file=sys.stderr,
    )
    if not report.imported:
        return EXIT_NOTHING
    return EXIT_SOME_ROWS_FAILED if report.failed else 0
