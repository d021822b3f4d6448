"""Load and validate Harbor task directories; every problem names the file, field, value and fix.

A Harbor task directory holds `instruction.md`, `task.toml`, `environment/` (a Dockerfile and the
files it copies), `tests/test.sh` (+ test files; writes `/logs/verifier/reward.txt` or
`reward.json`) and `solution/solve.sh`. task.toml is read by Harbor's task model
(`format/harbor.py`); rollyard's fields live in its `[metadata.rollyard]` table (the older
top-level `[rollyard]` table is still read). A task without them is a plain Harbor task: its
workspace is what its Dockerfile copies to WORKDIR, and it is scored from its reward file. A task
the local backend cannot run faithfully is refused with the reason (`format/runnable.py`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from tasks_lib.errors import (
    TaskNotFoundError,
    TaskRefusedError,
    TaskValidationError,
    ValidationIssue,
)
from tasks_lib.format.fields import (
    ROLLYARD_FIELDS,
    command_test_paths,
    rollyard_table,
    runner_command_check,
    string_field,
    task_limits,
    test_runner_field,
)
from tasks_lib.format.harbor import parse_harbor_config
from tasks_lib.format.issues import MISSING, IssueCollector
from tasks_lib.format.layout import (
    bounded_tree,
    harbor_layout,
    harbor_workspace,
    repository_image,
    rollyard_workspace,
)
from tasks_lib.format.model import (
    DECLARED_KINDS,
    DEFAULT_HIDDEN_DIR,
    DEFAULT_TEST_COMMAND,
    DIFFICULTIES,
    Task,
)
from tasks_lib.format.node_ids import check_test_ids
from tasks_lib.format.repository import ENVIRONMENT_TABLE
from tasks_lib.format.runnable import refusals
from tasks_lib.format.spec import parse_artifact, parse_rules

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


def validate_task(path: str | Path) -> tuple[ValidationIssue, ...]:
    """Every problem of the task directory at `path` (empty when it is valid)."""
    try:
        _load(Path(path))
    except TaskValidationError as error:
        return error.issues
    return ()


def load_task(path: str | Path) -> Task:
    """Load the task directory at `path`; raises `TaskValidationError` listing every problem."""
    return _load(Path(path))


def _load(root: Path) -> Task:
    if not root.is_dir():
        raise TaskNotFoundError(
            f"task directory {root} does not exist (or is not a directory); "
            "pass the path of a Harbor task directory"
        )
    root = root.resolve()
    check = IssueCollector()
    instruction, doc = harbor_layout(check, root)
    rollyard_raw = rollyard_table(check, doc)
    has_table = rollyard_raw is not MISSING
    rollyard: dict[str, Any] = {}
    if has_table and not isinstance(rollyard_raw, dict):
        check.add(
            "task.toml",
            "metadata.rollyard",
            rollyard_raw,
            "must be a table",
            "write the fields under a [metadata.rollyard] header",
        )
    elif has_table:
        assert isinstance(rollyard_raw, dict)
        rollyard = rollyard_raw
    for key in rollyard:
        if key not in ROLLYARD_FIELDS:
            check.add(
                "task.toml",
                f"rollyard.{key}",
                rollyard[key],
                "is not a known field",
                f"remove it or use one of {', '.join(ROLLYARD_FIELDS)}",
            )
    # A task written for rollyard means no network when it names none; Harbor's default is public.
    harbor = parse_harbor_config(
        check, doc, default_network="no-network" if has_table else "public"
    )
    refused = refusals(harbor, root, runs_test_sh=not has_table)

    task_id = string_field(check, rollyard, "id", root.name, required=has_table)
    if not ID_PATTERN.match(task_id):
        check.add(
            "task.toml",
            "rollyard.id",
            task_id,
            "is not a valid task id",
            "use letters, digits, '.', '_' and '-' (at most 128 characters)",
        )
    default_version = "1"
    package = doc.get("task")
    if not has_table and isinstance(package, dict) and isinstance(package.get("version"), str):
        default_version = package["version"]
    version = string_field(check, rollyard, "version", default_version, required=has_table)
    workdir = "/workspace"
    container = None
    if has_table:
        workspace = rollyard_workspace(check, root, rollyard)
        if ENVIRONMENT_TABLE in rollyard:
            container = repository_image(check, root, rollyard[ENVIRONMENT_TABLE])
    else:
        workspace, workdir, container = harbor_workspace(check, root, harbor)
    workdir = harbor.environment.workdir or workdir
    test_command = string_field(check, rollyard, "test_command", DEFAULT_TEST_COMMAND)
    test_runner = test_runner_field(check, rollyard)
    if test_runner == "pytest":
        test_paths = command_test_paths(check, test_command)
    else:
        test_paths = runner_command_check(check, test_command)

    hidden_dir: Path | None = None
    hidden_relative = string_field(check, rollyard, "hidden_dir", DEFAULT_HIDDEN_DIR)
    if (root / hidden_relative).is_dir():
        hidden_dir = root / hidden_relative
    elif "hidden_dir" in rollyard:
        check.add(
            "task.toml",
            "rollyard.hidden_dir",
            hidden_relative,
            "is not a directory of the task",
            "create it with the hidden test files, or remove the field",
        )
    workspace_ok = workspace.is_dir()
    fail_to_pass = check_test_ids(
        check,
        "fail_to_pass",
        rollyard.get("fail_to_pass", []),
        workspace if workspace_ok else None,
        "the workspace",
        test_runner,
    )
    pass_to_pass = check_test_ids(
        check,
        "pass_to_pass",
        rollyard.get("pass_to_pass", []),
        workspace if workspace_ok else None,
        "the workspace",
        test_runner,
    )
    hidden_tests = check_test_ids(
        check,
        "hidden_tests",
        rollyard.get("hidden_tests", []),
        hidden_dir,
        hidden_relative,
    )
    if hidden_tests and hidden_dir is None:
        check.add(
            "task.toml",
            "rollyard.hidden_tests",
            list(hidden_tests),
            f"lists hidden tests but {hidden_relative}/ does not exist",
            "add the hidden test files there or set hidden_dir",
        )
    verifier = string_field(check, rollyard, "verifier", "tests")
    if verifier not in DECLARED_KINDS:
        check.add(
            "task.toml",
            "rollyard.verifier",
            verifier,
            "is not a known verifier kind",
            f"use one of {', '.join(DECLARED_KINDS)}",
        )
        verifier = "tests"
    artifact = parse_artifact(check, root, rollyard) if verifier == "artifact" else None
    rules = parse_rules(check, root, rollyard) if verifier == "rules" else None
    for key, kind in (("artifact", "artifact"), ("rules", "rules")):
        if key in rollyard and verifier != kind:
            check.add(
                "task.toml",
                f"rollyard.{key}",
                "-",
                f"is set but verifier = {verifier!r}",
                f'set verifier = "{kind}" or remove [rollyard.{key}]',
            )
    if verifier != "tests" and (fail_to_pass or pass_to_pass or hidden_tests):
        check.add(
            "task.toml",
            "rollyard.fail_to_pass",
            [*fail_to_pass, *pass_to_pass, *hidden_tests],
            f"test ids are listed but verifier = {verifier!r} runs no test suite",
            'remove the test ids or set verifier = "tests"',
        )
    if has_table and verifier == "tests" and not (fail_to_pass or pass_to_pass or hidden_tests):
        check.add(
            "task.toml",
            "rollyard.fail_to_pass",
            [],
            "no expected tests are listed",
            "list the tests that decide the reward in fail_to_pass / pass_to_pass / hidden_tests",
        )
    overlap = set(fail_to_pass) & set(pass_to_pass)
    if overlap:
        check.add(
            "task.toml",
            "rollyard.pass_to_pass",
            sorted(overlap),
            "test ids are also in fail_to_pass",
            "list each test in one of the two only",
        )
    protected_raw = rollyard.get("protected", [])
    if not isinstance(protected_raw, list) or not all(
        isinstance(item, str) and item.strip() for item in protected_raw
    ):
        check.add(
            "task.toml",
            "rollyard.protected",
            protected_raw,
            "must be a list of glob strings",
            'write e.g. protected = ["data/**", "*.lock"]',
        )
        protected_raw = []
    difficulty = string_field(check, rollyard, "difficulty", "medium")
    if difficulty not in DIFFICULTIES:
        check.add(
            "task.toml",
            "rollyard.difficulty",
            difficulty,
            "is not a known difficulty",
            f"use one of {', '.join(DIFFICULTIES)}",
        )
    limits, agent_timeout_s, verify_timeout_s = task_limits(check, doc, rollyard, harbor)
    limits = limits.replace(allowed_hosts=harbor.agent_network_policy.egress_hosts)
    if workspace_ok and not check.issues:
        bounded_tree(check, root, workspace, limits)
    family = string_field(check, rollyard, "family", "harbor")
    source = string_field(check, rollyard, "source", str(root.name))

    for refusal in refused:
        check.add(refusal.field.split(":")[0] if "/" in refusal.field else "task.toml",
                  refusal.field, "-", f"cannot run faithfully here: {refusal.reason}",
                  refusal.fix)  # fmt: skip
    if check.issues:
        error = TaskRefusedError if refused else TaskValidationError
        raise error(str(root), tuple(check.issues))
    return Task(
        id=task_id,
        version=version,
        path=root,
        instruction=instruction,
        snapshot_dir=workspace,
        limits=limits,
        agent_timeout_s=agent_timeout_s,
        verify_timeout_s=verify_timeout_s,
        test_command=test_command,
        test_paths=test_paths,
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        hidden_tests=hidden_tests,
        hidden_dir=hidden_dir,
        protected=tuple(protected_raw),
        family=family,
        source=source,
        difficulty=difficulty,
        has_rollyard_table=has_table,
        verifier=verifier,
        artifact=artifact,
        rules=rules,
        harbor=harbor,
        workdir=workdir,
        container=container,
        test_runner=test_runner,
    )
