"""Synthesis on packages it was never tuned on: pinned PyPI sdists that ship their own tests.

Per package: the tests rollyard's sandboxed run collects against plain `pytest --collect-only -q`
on the host, then `synthesize_tasks` (seeded) with mutants tried / kept / unstable / unverifiable,
then `rollyard tasks check` on every kept task. Sdists are downloaded once into a cache
(`pip download --no-deps --no-binary :all:`); each run unpacks them afresh.

    python benchmarks/synthesis_unseen.py [--cache DIR] [--only NAME ...] [--max-tasks 5]
        [--max-mutants 30] [--seed 0] [--json results.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any

from sandboxes import Limits, open_sandbox
from tasks_lib.curate import CurationSettings
from tasks_lib.errors import GenerationError
from tasks_lib.sources.synthesize import copy_clean, inspect_project, synthesize_tasks
from tasks_lib.sources.synthesize.project import add_src_shim
from tasks_lib.verify import run_pytest


@dataclasses.dataclass(frozen=True, slots=True)
class Package:
    name: str
    version: str
    style: str
    """The test styles the package brings (why it is in the set)."""


PACKAGES = (
    Package("isodate", "0.7.2", "src layout; pytest parametrized over a set, ids with % - +"),
    Package("semver", "3.0.4", "src layout; pytest parametrized, ids with + - ."),
    Package("more-itertools", "10.7.0", "unittest classes, a large suite"),
    Package("idna", "3.10", "unittest classes; data-driven (Unicode IDNA test file)"),
    Package("jmespath", "1.0.1", "data-driven (compliance JSON files), unittest"),
    Package("parse", "1.20.2", "single module; pytest parametrized"),
    Package("webcolors", "24.11.1", "src layout; unittest classes, subtests"),
    Package("xmltodict", "0.14.2", "single module; unittest classes"),
    Package("pathspec", "0.12.1", "unittest classes, many small patterns"),
    Package("six", "1.17.0", "single module, tests at the top level"),
    Package("tabulate", "0.9.0", "tests in test/; pytest functions, many format cases"),
    Package("wcwidth", "0.2.13", "pytest functions over Unicode width tables"),
    Package("markdown", "3.7", "unittest classes; data-driven syntax cases, nested test dirs"),
)


def fetch(package: Package, cache: Path) -> Path:
    """The sdist of `package` from the cache, downloaded with pip when missing."""
    folder = cache / f"{package.name}-{package.version}"
    found = sorted(folder.glob("*.tar.gz")) if folder.is_dir() else []
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--no-binary", ":all:",
             "-d", str(folder), f"{package.name}=={package.version}"],
            check=True, timeout=600,
        )  # fmt: skip
        found = sorted(folder.glob("*.tar.gz"))
    return found[0]


def unpack(archive: Path, dest: Path) -> Path:
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    [root] = [path for path in dest.iterdir() if path.is_dir()]
    return root


def plain_pytest_ids(
    project: Path, test_paths: tuple[str, ...], src_layout: bool
) -> tuple[set[str], str]:
    """What plain pytest collects on the host over the same test paths, with the project's own
    configuration (its src/ on the path, as an editable install would put it). An `addopts`
    naming a plugin this machine lacks (pytest-cov) is cleared, and said so."""
    env = {**os.environ, "PYTHONHASHSEED": "0", "PYTHONDONTWRITEBYTECODE": "1"}
    env["PYTHONPATH"] = str(project / "src") if src_layout else str(project)
    command = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"]
    note = ""
    for attempt in (command, [*command, "-o", "addopts="]):
        run = subprocess.run(
            [*attempt, *test_paths], cwd=project, env=env, capture_output=True, text=True,
            timeout=600, check=False,
        )  # fmt: skip
        if run.returncode != 4:  # 4: usage error, e.g. --cov without pytest-cov
            break
        note = "addopts cleared (names a plugin not installed)"
    # A collection error is listed as `ERROR <id> - <reason>`; the sandboxed run reports it
    # under the same id, as an error.
    lines = [line.removeprefix("ERROR ").split(" - ", 1)[0] for line in run.stdout.splitlines()]
    ids = {line for line in lines if "::" in line and not line.startswith(" ")}
    if run.returncode not in (0, 5):
        errors = sum(line.startswith("ERROR ") for line in run.stdout.splitlines())
        note = "; ".join(filter(None, [note, f"pytest exit {run.returncode}, {errors} errors"]))
    return ids, note


def rollyard_ids(project: Path, work: Path) -> tuple[set[str], tuple[str, ...], bool]:
    """The ids of one hardened sandboxed run over the workspace synthesis would use."""
    workspace = work / "collect"
    copy_clean(project, workspace)
    layout = inspect_project(workspace)
    if layout.src_layout:
        add_src_shim(workspace)
    with open_sandbox(workspace, backend="bwrap", limits=Limits(wall_time_s=600.0)) as sandbox:
        run = run_pytest(sandbox, layout.test_paths, timeout_s=600.0)
    if run.broken:
        raise GenerationError(f"the suite does not run in the sandbox: {run.broken}")
    return set(run.outcomes), layout.test_paths, layout.src_layout


def tasks_check(task_dirs: tuple[str, ...]) -> tuple[int, list[str]]:
    """`rollyard tasks check` over the kept tasks: how many pass, and the first problem of the
    others."""
    if not task_dirs:
        return 0, []
    run = subprocess.run(
        [sys.executable, "-m", "flows.cli", "tasks", "check", "--format", "json", *task_dirs],
        capture_output=True, text=True, timeout=3600, check=False,
    )  # fmt: skip
    passed = 0
    problems = []
    for line in run.stdout.splitlines():
        if not line.startswith("{"):
            continue
        row = json.loads(line)
        if row.get("ok"):
            passed += 1
        else:
            problems.append(f"{row.get('task_id')}: {(row.get('problems') or ['?'])[0]}")
    return passed, problems


def _unparametrized(test_id: str) -> str:
    return test_id.split("[", 1)[0]


def measure(package: Package, cache: Path, args: argparse.Namespace) -> dict[str, Any]:
    started = time.monotonic()
    row: dict[str, Any] = {"package": f"{package.name}=={package.version}", "style": package.style}
    with tempfile.TemporaryDirectory(prefix="rollyard-bench-unseen-") as tmp:
        work = Path(tmp)
        project = unpack(fetch(package, cache), work / "src")
        try:
            ours, test_paths, src_layout = rollyard_ids(project, work)
        except GenerationError as error:
            row.update(error=str(error), duration_s=round(time.monotonic() - started, 1))
            return row
        theirs, note = plain_pytest_ids(project, test_paths, src_layout)
        try:
            report = synthesize_tasks(
                project, work / "tasks", max_tasks=args.max_tasks, max_mutants=args.max_mutants,
                seed=args.seed, max_fail_to_pass=CurationSettings.from_env().max_fail_to_pass,
            )  # fmt: skip
        except GenerationError as error:
            row.update(error=str(error))
            report = None
        # Tests whose ids change from run to run cannot be equal between two runs; they are
        # counted apart (and left out of every task).
        varying = set(report.varying_ids) if report is not None else set()
        same = {i for i in ours if _unparametrized(i) not in varying}
        plain = {i for i in theirs if _unparametrized(i) not in varying}
        row.update(
            test_paths=list(test_paths),
            pytest_collected=len(theirs),
            rollyard_collected=len(ours),
            collected_equal=same == plain,
            only_pytest=sorted(plain - same)[:5],
            only_pytest_count=len(plain - same),
            only_rollyard=sorted(same - plain)[:5],
            only_rollyard_count=len(same - plain),
            varying_tests=sorted(varying),
            pytest_note=note,
        )
        if report is not None:
            verdicts = dict(report.verdicts)
            passed, problems = tasks_check(report.task_dirs)
            row.update(
                baseline_tests=report.baseline_tests,
                mutants_tried=report.mutants_tried,
                kept=report.tasks_kept,
                unstable=verdicts.get("unstable", 0),
                unverifiable=verdicts.get("unverifiable", 0),
                verdicts=verdicts,
                synthesis_check_failures=list(report.check_failures),
                tasks_check_passed=passed,
                tasks_check_problems=problems,
                unstable_why=[entry["why"].split(":")[0] for entry in report.to_json()["unstable"]],
                flaky_baseline=len(report.flaky_baseline),
            )
    row["duration_s"] = round(time.monotonic() - started, 1)
    return row


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    default_cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    parser.add_argument("--cache", type=Path, default=default_cache / "rollyard" / "sdists")
    parser.add_argument("--only", nargs="*", default=None, help="package names to run")
    parser.add_argument("--max-tasks", type=int, default=5)
    parser.add_argument("--max-mutants", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", type=Path, default=None, help="append one JSON row per package")
    args = parser.parse_args()
    chosen = [p for p in PACKAGES if args.only is None or p.name in args.only]
    if not chosen:
        parser.error(f"--only names no package of {[p.name for p in PACKAGES]}")
    rows = []
    for package in chosen:
        row = measure(package, args.cache, args)
        rows.append(row)
        print(json.dumps(row), flush=True)
        if args.json is not None:
            with args.json.open("a", encoding="utf-8") as out:
                out.write(json.dumps(row) + "\n")
    print()
    print("| package | pytest / rollyard collected | equal | tried | kept | unstable "
          "| unverifiable | tasks check passed | time |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        if "mutants_tried" not in row:
            print(f"| {row['package']} | {row.get('pytest_collected', '-')} / "
                  f"{row.get('rollyard_collected', '-')} | - | - | - | - | - | - | "
                  f"{row['duration_s']} s |")  # fmt: skip
            continue
        print(
            f"| {row['package']} | {row['pytest_collected']} / {row['rollyard_collected']} | "
            f"{'yes' if row['collected_equal'] else 'no'} | {row['mutants_tried']} | "
            f"{row['kept']} | {row['unstable']} | {row['unverifiable']} | "
            f"{row['tasks_check_passed']}/{row['kept']} | {row['duration_s']} s |"
        )
    with_three = sum(row.get("kept", 0) >= 3 for row in rows)
    all_checked = all(row.get("tasks_check_passed", 0) == row.get("kept", 0) for row in rows)
    print(f"\n{with_three}/{len(rows)} packages with ≥ 3 kept tasks; "
          f"every kept task passes tasks check: {all_checked}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
