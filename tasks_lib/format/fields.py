"""Reading task.toml's fields: rollyard's `[metadata.rollyard]` table (strings, the test command)
and the sandbox limits and timeouts from Harbor's sections and `[rollyard.limits]`.
"""

from __future__ import annotations

import dataclasses
import math
import shlex
from typing import Any

from sandboxes import Limits
from sandboxes.base import LIMIT_MAXIMA
from sandboxes.errors import InvalidLimitsError
from tasks_lib.format.harbor import HarborConfig
from tasks_lib.format.issues import MISSING, IssueCollector, relative_inside
from tasks_lib.format.model import DEFAULT_TEST_COMMAND, TEST_RUNNERS, TestRunner
from tasks_lib.format.repository import ENVIRONMENT_TABLE

# The numeric limits a task may set in [rollyard.limits]; its network comes from Harbor's
# [environment] network_mode and allowed_hosts.
LIMIT_FIELDS = tuple(
    field.name for field in dataclasses.fields(Limits) if field.name != "allowed_hosts"
)
ROLLYARD_FIELDS = {
    "id": "task id (letters, digits, . _ -)",
    "version": "task version string",
    "workspace_dir": "task-relative dir of the agent's initial workspace",
    "test_command": "pytest command the agent runs, e.g. 'python -m pytest tests'",
    "fail_to_pass": "test ids that fail before the fix and pass after",
    "pass_to_pass": "test ids that pass before and after",
    "hidden_tests": "test ids installed only at verification",
    "hidden_dir": "task-relative dir overlaid onto the workspace at verification",
    "protected": "extra protected path globs",
    "family": "task family name",
    "source": "where the task comes from",
    "difficulty": "easy | medium | hard",
    "test_runner": "pytest | unittest (ids 'test_name (module.Class)', test_command runs them)",
    ENVIRONMENT_TABLE: "table of a repository task's image (repo, base_commit, python, install)",
    "limits": "table of sandbox limits and timeouts",
    "verifier": "tests | artifact | rules",
    "artifact": "table of the artifact verifier (outputs, variants, command)",
    "rules": "table of the rule verifier (checks, overlay_dir)",
}
EXTRA_LIMIT_FIELDS = ("agent_timeout_s", "verify_timeout_s")
TIMEOUT_MAXIMUM_S = LIMIT_MAXIMA["wall_time_s"]
"""The largest agent or verifier timeout: a day, like the longest single sandbox command."""


def rollyard_table(check: IssueCollector, doc: dict[str, Any]) -> object:
    """`[metadata.rollyard]`, else the older top-level `[rollyard]` (never both)."""
    metadata = doc.get("metadata")
    nested = metadata.get("rollyard", MISSING) if isinstance(metadata, dict) else MISSING
    legacy = doc.get("rollyard", MISSING)
    if nested is not MISSING and legacy is not MISSING:
        check.add("task.toml", "rollyard", "-", "is set next to [metadata.rollyard]",
                  "keep only [metadata.rollyard]")  # fmt: skip
    return nested if nested is not MISSING else legacy


def number_field(
    check: IssueCollector,
    table: dict[str, Any],
    key: str,
    field: str,
    *,
    maximum: float = math.inf,
) -> float | None:
    """A positive finite number at `table[key]`, at most `maximum` (None when absent or bad; an
    issue naming the allowed range if bad)."""
    if key not in table:
        return None
    value = table[key]
    top = f"{int(maximum):,}" if float(maximum).is_integer() else f"{maximum:,g}"
    allowed = "a positive number" if maximum == math.inf else f"a number in (0, {top}]"
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        check.add("task.toml", field, value, "must be a number", f"write {allowed}")
        return None
    if value <= 0:
        check.add("task.toml", field, value, "must be positive", f"write {allowed}")
        return None
    if value > maximum:
        check.add("task.toml", field, value, f"is over its maximum {top}",
                  f"write {allowed}")  # fmt: skip
        return None
    return float(value)


def string_field(
    check: IssueCollector,
    table: dict[str, Any],
    key: str,
    default: str,
    *,
    required: bool = False,
) -> str:
    """A non-empty string at `table[key]`, else `default` (an issue if bad, or if absent and
    `required`)."""
    if key not in table:
        if required:
            check.add(
                "task.toml",
                f"rollyard.{key}",
                MISSING,
                "is required",
                f'add {key} = "..." ({ROLLYARD_FIELDS[key]})',
            )
        return default
    value = table[key]
    if not isinstance(value, str) or not value.strip():
        check.add(
            "task.toml",
            f"rollyard.{key}",
            value,
            "must be a non-empty string",
            f'write {key} = "..." ({ROLLYARD_FIELDS[key]})',
        )
        return default
    return value


def command_test_paths(check: IssueCollector, command: str) -> tuple[str, ...]:
    """The workspace-relative test paths of a pytest `test_command` (an issue for anything else
    in it)."""
    try:
        argv = shlex.split(command)
    except ValueError as error:
        check.add(
            "task.toml",
            "rollyard.test_command",
            command,
            f"cannot be split ({error})",
            "fix the quoting",
        )
        return ("tests",)
    if argv[:3] == ["python", "-m", "pytest"]:
        rest = argv[3:]
    elif argv[:1] == ["pytest"]:
        rest = argv[1:]
    else:
        check.add(
            "task.toml",
            "rollyard.test_command",
            command,
            "must start with 'python -m pytest' or 'pytest'",
            f"write e.g. test_command = {DEFAULT_TEST_COMMAND!r}",
        )
        return ("tests",)
    options = [arg for arg in rest if arg.startswith("-")]
    if options:
        # The verifier runs pytest with its own hardened options; task options would be ignored
        # silently, which would surprise the task's author.
        check.add(
            "task.toml",
            "rollyard.test_command",
            command,
            f"holds pytest options {options}, which the verifier does not pass",
            "list only workspace-relative test paths after the pytest command",
        )
    paths = tuple(arg for arg in rest if not arg.startswith("-"))
    for path in paths:
        if not relative_inside(path):
            check.add(
                "task.toml",
                "rollyard.test_command",
                command,
                f"test path {path!r} leaves the workspace",
                "use workspace-relative paths",
            )
    return paths or (".",)


def test_runner_field(check: IssueCollector, rollyard: dict[str, Any]) -> TestRunner:
    """`rollyard.test_runner`: pytest unless it says unittest (an issue for anything else)."""
    runner = string_field(check, rollyard, "test_runner", "pytest")
    if runner == "unittest":
        return "unittest"
    if runner != "pytest":
        check.add("task.toml", "rollyard.test_runner", runner, "is not a known test runner",
                  f"use one of {', '.join(TEST_RUNNERS)}")  # fmt: skip
    return "pytest"


def runner_command_check(check: IssueCollector, command: str) -> tuple[str, ...]:
    """A unittest runner's command line (`python -m unittest`, `tests/runtests.py --parallel 1`),
    checked: the verifier runs it in-process with the expected tests as labels, so it names no
    test paths (the empty tuple)."""
    try:
        argv = shlex.split(command)
    except ValueError as error:
        argv = []
        check.add("task.toml", "rollyard.test_command", command, f"cannot be split ({error})",
                  "fix the quoting")  # fmt: skip
    if argv[:1] in (["python"], ["python3"]):
        argv = argv[1:]
    if argv[:2] != ["-m", "unittest"] and not (argv and argv[0].endswith(".py")):
        check.add("task.toml", "rollyard.test_command", command,
                  "must run 'python -m unittest' or a runner script ('tests/runtests.py ...')",
                  "write e.g. test_command = 'python -m unittest'")  # fmt: skip
    elif argv[0].endswith(".py") and not relative_inside(argv[0].removeprefix("./")):
        check.add("task.toml", "rollyard.test_command", command,
                  "names a runner script outside the workspace", "use a workspace-relative path")  # fmt: skip
    return ()


def task_limits(
    check: IssueCollector, doc: dict[str, Any], rollyard: dict[str, Any], harbor: HarborConfig
) -> tuple[Limits, float, float]:
    """The sandbox limits and the agent and verifier timeouts: Harbor's sections, then
    `[rollyard.limits]` over them."""
    defaults = Limits()
    values: dict[str, float] = {}
    agent_timeout_s = 600.0
    # Harbor's verifier default (600 s) for a task that says nothing; rollyard's own tasks always
    # write theirs.
    verify_timeout_s = harbor.verifier_timeout_s if not rollyard else 120.0
    # Harbor's own sections first, so a plain Harbor task keeps its resources; [rollyard.limits]
    # overrides them.
    environment = doc.get("environment", {})
    if isinstance(environment, dict):
        for key, name in (("cpus", "cpus"), ("memory_mb", "memory_mb"), ("storage_mb", "disk_mb")):
            number = number_field(
                check, environment, key, f"environment.{key}", maximum=LIMIT_MAXIMA[name]
            )
            if number is not None:
                values[name] = number
    for section, target in (("agent", "agent"), ("verifier", "verify")):
        table = doc.get(section, {})
        if isinstance(table, dict):
            number = number_field(
                check, table, "timeout_sec", f"{section}.timeout_sec", maximum=TIMEOUT_MAXIMUM_S
            )
            if number is not None:
                if target == "agent":
                    agent_timeout_s = number
                else:
                    verify_timeout_s = number
    table = rollyard.get("limits", {})
    if not isinstance(table, dict):
        check.add(
            "task.toml",
            "rollyard.limits",
            table,
            "must be a table",
            "write [rollyard.limits] with keys like memory_mb = 1024",
        )
        table = {}
    for key in table:
        if key not in LIMIT_FIELDS and key not in EXTRA_LIMIT_FIELDS:
            check.add(
                "task.toml",
                f"rollyard.limits.{key}",
                table[key],
                "is not a known limit",
                f"use one of {', '.join((*LIMIT_FIELDS, *EXTRA_LIMIT_FIELDS))}",
            )
            continue
        maximum = LIMIT_MAXIMA.get(key, TIMEOUT_MAXIMUM_S)
        number = number_field(check, table, key, f"rollyard.limits.{key}", maximum=maximum)
        if number is None:
            continue
        if key == "agent_timeout_s":
            agent_timeout_s = number
        elif key == "verify_timeout_s":
            verify_timeout_s = number
        else:
            values[key] = number
    typed: dict[str, Any] = {}
    for key, number in values.items():
        default = getattr(defaults, key)
        typed[key] = math.ceil(number) if isinstance(default, int) else number
    try:
        limits = defaults.replace(**typed)
    except InvalidLimitsError as error:
        # Each key was checked above; this keeps a rule Limits adds later a per-task issue.
        check.add("task.toml", "rollyard.limits", typed, str(error), "fix the limit it names")
        limits = defaults
    return limits, agent_timeout_s, verify_timeout_s
