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

import ast
import dataclasses
import math
import re
import shlex
import tomllib
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from sandboxes import Limits
from sandboxes.errors import SnapshotError
from sandboxes.snapshot import TreeBounds, check_tree
from tasks_lib.errors import (
    TaskNotFoundError,
    TaskRefusedError,
    TaskValidationError,
    ValidationIssue,
)
from tasks_lib.format.harbor import HarborConfig, parse_harbor_config
from tasks_lib.format.model import (
    DECLARED_KINDS,
    DEFAULT_HIDDEN_DIR,
    DEFAULT_TEST_COMMAND,
    DEFAULT_WORKSPACE_DIR,
    DIFFICULTIES,
    TEST_RUNNERS,
    ContainerImage,
    Task,
    TestRunner,
)
from tasks_lib.format.repository import ENVIRONMENT_TABLE, parse_environment
from tasks_lib.format.runnable import (
    DOCKER_FIX,
    LocalImage,
    Refusal,
    container_reasons,
    image_workspace,
    read_dockerfile,
    refusals,
)
from tasks_lib.format.spec import parse_artifact, parse_rules

ID_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
TEST_ID_PATTERN = re.compile(r"^(?P<file>[^:\s][^:]*\.py)(?P<rest>(?:::[^:]+)+)$")
UNITTEST_ID_PATTERN = re.compile(r"^(?P<name>[A-Za-z_]\w*) \((?P<owner>[A-Za-z_][\w.]*)\)$")
"""A unittest-runner test id as Django and SWE-bench write it: `test_name (module.Class)`."""

MAX_INSTRUCTION_BYTES = 256 << 10
"""Largest instruction.md: a prompt, not a data file (the agent reads data from the workspace)."""
MAX_TASK_TOML_BYTES = 1 << 20

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


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Checker:
    """Collects issues instead of stopping at the first, so one run lists every problem."""

    def __init__(self) -> None:
        self.issues: list[ValidationIssue] = []

    def add(self, file: str, field: str, value: Any, message: str, fix: str) -> None:
        shown = "-" if value is _MISSING else _show(value)
        self.issues.append(ValidationIssue(file, field, shown, message, fix))


_MISSING = object()


def _relative_inside(value: str) -> bool:
    parts = Path(value).parts
    return bool(value) and not Path(value).is_absolute() and ".." not in parts


def defined_names(test_file: Path) -> set[str] | None:
    """Top-level test functions and `Class::method` names of a test file (None if unparsable)."""
    try:
        tree = ast.parse(test_file.read_text(encoding="utf-8"))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.add(node.name)
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    names.add(f"{node.name}::{item.name}")
    return names


def checkable_test_ids(workspace: Path, test_ids: Iterable[str]) -> tuple[str, ...]:
    """The ids of `test_ids` that the loader can check against the test files under `workspace`
    (it refuses, for example, methods a test class inherits from a mixin in another module)."""
    names: dict[str, set[str] | None] = {}
    kept = []
    for test_id in test_ids:
        if UNITTEST_ID_PATTERN.match(test_id):
            # Where `module` lives depends on the runner's sys.path: the run checks these.
            kept.append(test_id)
            continue
        match = TEST_ID_PATTERN.match(test_id)
        if match is None:
            continue
        file_rel = match.group("file")
        if file_rel not in names:
            path = workspace / file_rel
            names[file_rel] = defined_names(path) if path.is_file() else set()
        defined = names[file_rel]
        if defined is not None and _node_name(match) in defined:
            kept.append(test_id)
    return tuple(kept)


def _node_name(match: re.Match[str]) -> str:
    """`name` or `Class::name` of a matched test id, its parametrization left out."""
    return re.sub(r"\[.*\]$", "", match.group("rest")[2:])


def _check_test_ids(
    check: _Checker,
    field: str,
    ids: Any,
    root: Path | None,
    root_label: str,
    runner: TestRunner = "pytest",
) -> tuple[str, ...]:
    if not isinstance(ids, list) or not all(isinstance(item, str) for item in ids):
        check.add(
            "task.toml",
            f"rollyard.{field}",
            ids,
            "must be a list of test id strings",
            'write it as ["tests/test_x.py::test_name", ...]',
        )
        return ()
    parsed_files: dict[str, set[str] | None] = {}
    for index, test_id in enumerate(ids):
        where = f"rollyard.{field}[{index}]"
        if runner == "unittest":
            if not UNITTEST_ID_PATTERN.match(test_id):
                check.add("task.toml", where, test_id, "is not a unittest test id",
                          "use the form 'test_name (module.Class)'")  # fmt: skip
            continue
        match = TEST_ID_PATTERN.match(test_id)
        if match is None or not _relative_inside(match.group("file")):
            check.add(
                "task.toml",
                where,
                test_id,
                "is not a pytest node id with a workspace-relative file",
                "use the form 'tests/test_x.py::test_name' (or '::Class::test_name')",
            )
            continue
        if root is None:
            continue
        file_rel = match.group("file")
        test_file = root / file_rel
        if not test_file.is_file():
            check.add(
                "task.toml",
                where,
                test_id,
                f"test file {file_rel} does not exist in {root_label}",
                f"add the file under {root_label} or correct the id",
            )
            continue
        if file_rel not in parsed_files:
            parsed_files[file_rel] = defined_names(test_file)
        names = parsed_files[file_rel]
        name = _node_name(match)
        if names is not None and name not in names:
            check.add(
                "task.toml",
                where,
                test_id,
                f"{root_label}/{file_rel} defines no test named {name!r}",
                "correct the id or add the test",
            )
    if len(set(ids)) != len(ids):
        check.add(
            "task.toml", f"rollyard.{field}", ids, "lists a test id twice", "remove duplicates"
        )
    return tuple(ids)


def _number(check: _Checker, table: dict[str, Any], key: str, field: str) -> float | None:
    if key not in table:
        return None
    value = table[key]
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        check.add("task.toml", field, value, "must be a number", "write a positive number")
        return None
    if value <= 0:
        check.add("task.toml", field, value, "must be positive", "write a positive number")
        return None
    return float(value)


def _string(
    check: _Checker,
    table: dict[str, Any],
    key: str,
    default: str,
    *,
    required: bool = False,
) -> str:
    if key not in table:
        if required:
            check.add(
                "task.toml",
                f"rollyard.{key}",
                _MISSING,
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


def _test_paths(check: _Checker, command: str) -> tuple[str, ...]:
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
        if not _relative_inside(path):
            check.add(
                "task.toml",
                "rollyard.test_command",
                command,
                f"test path {path!r} leaves the workspace",
                "use workspace-relative paths",
            )
    return paths or (".",)


def _limits(
    check: _Checker, doc: dict[str, Any], rollyard: dict[str, Any], harbor: HarborConfig
) -> tuple[Limits, float, float]:
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
            number = _number(check, environment, key, f"environment.{key}")
            if number is not None:
                values[name] = number
    for section, target in (("agent", "agent"), ("verifier", "verify")):
        table = doc.get(section, {})
        if isinstance(table, dict):
            number = _number(check, table, "timeout_sec", f"{section}.timeout_sec")
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
        number = _number(check, table, key, f"rollyard.limits.{key}")
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
    return defaults.replace(**typed), agent_timeout_s, verify_timeout_s


def _harbor_layout(check: _Checker, root: Path) -> tuple[str, dict[str, Any]]:
    instruction = ""
    instruction_path = root / "instruction.md"
    if not instruction_path.is_file():
        check.add("instruction.md", "-", _MISSING, "is missing", "write the task prompt there")
    elif _small_enough(check, instruction_path, "instruction.md", MAX_INSTRUCTION_BYTES):
        data = instruction_path.read_bytes()
        try:
            instruction = data.decode("utf-8")
        except UnicodeDecodeError as error:
            check.add(
                "instruction.md",
                "-",
                "-",
                f"is not UTF-8 (byte {error.start} cannot be decoded)",
                "save the prompt as UTF-8",
            )
        else:
            if not instruction.strip():
                check.add("instruction.md", "-", "", "is empty", "write the task prompt there")
    doc: dict[str, Any] = {}
    toml_path = root / "task.toml"
    if not toml_path.is_file():
        check.add(
            "task.toml", "-", _MISSING, "is missing", 'create it with at least version = "1.0"'
        )
    elif _small_enough(check, toml_path, "task.toml", MAX_TASK_TOML_BYTES):
        try:
            doc = tomllib.loads(toml_path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
            check.add("task.toml", "-", "-", f"is not valid TOML ({error})", "fix the syntax")
    pulls_image = isinstance(doc.get("environment"), dict) and doc["environment"].get(
        "docker_image"
    )
    if not (root / "environment").is_dir() and not pulls_image:
        check.add(
            "environment/",
            "-",
            _MISSING,
            "is missing",
            "add environment/ with a Dockerfile and the workspace files it copies",
        )
    elif not (root / "environment" / "Dockerfile").is_file() and not pulls_image:
        check.add(
            "environment/Dockerfile",
            "-",
            _MISSING,
            "is missing",
            "add a Dockerfile that copies the workspace (Harbor builds the image from it), "
            "or set [environment] docker_image",
        )
    if not (root / "tests" / "test.sh").is_file():
        check.add(
            "tests/test.sh",
            "-",
            _MISSING,
            "is missing",
            "add a script that runs the tests and writes /logs/verifier/reward.txt",
        )
    return instruction, doc


def _small_enough(check: _Checker, path: Path, name: str, max_bytes: int) -> bool:
    """Whether `path` is within `max_bytes` (by `stat`, before it is read); an issue if not."""
    size = path.stat().st_size
    if size > max_bytes:
        check.add(
            name,
            "-",
            f"{size} bytes",
            f"is larger than {max_bytes} bytes",
            "keep it short: data the agent needs belongs in the workspace",
        )
        return False
    return True


def _bounded_tree(check: _Checker, root: Path, workspace: Path, limits: Limits) -> None:
    """What the sandbox would refuse later, found now by `stat` alone: the workspace within its
    limits, with links only inside it; the whole task directory (twice the workspace's bounds:
    environment/ often holds a copy of it) with links only inside the task, and no device files,
    FIFOs or sockets anywhere."""
    workspace_bounds = TreeBounds.of(limits)
    task_bounds = dataclasses.replace(
        workspace_bounds,
        max_bytes=2 * workspace_bounds.max_bytes,
        max_entries=2 * workspace_bounds.max_entries,
    )
    for tree, bounds in ((root, task_bounds), (workspace, workspace_bounds)):
        try:
            check_tree(tree, bounds)
        except SnapshotError as error:
            message, _, fix = str(error).partition("; ")
            shown = tree.relative_to(root).as_posix() + "/" if tree != root else "./"
            check.add(shown, "-", "-", message.split(": ", 1)[-1], fix or "fix the file named")
            return  # one finding per task is enough to act on; the rest follows the fix


def _workspace(check: _Checker, root: Path, rollyard: dict[str, Any]) -> Path:
    if "workspace_dir" in rollyard:
        relative = _string(check, rollyard, "workspace_dir", DEFAULT_WORKSPACE_DIR)
    elif (root / DEFAULT_WORKSPACE_DIR).is_dir():
        relative = DEFAULT_WORKSPACE_DIR
    else:
        # A plain Harbor task copies environment/ into its image; that is what the agent sees.
        relative = "environment"
    workspace = root / relative
    if not _relative_inside(relative) or not workspace.is_dir():
        check.add(
            "task.toml",
            "rollyard.workspace_dir",
            relative,
            "is not a directory inside the task",
            f"create {relative}/ with the agent's starting files, or point workspace_dir at them",
        )
        return workspace
    for forbidden, why in (
        (".git", "a snapshot must not carry history that may hold the fix"),
        ("solution", "the solution must never be visible to the agent"),
    ):
        if (workspace / forbidden).exists():
            check.add(
                f"{relative}/{forbidden}",
                "-",
                "-",
                f"is in the workspace: {why}",
                f"delete {relative}/{forbidden}",
            )
    return workspace


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
    check = _Checker()
    instruction, doc = _harbor_layout(check, root)
    rollyard_raw = _rollyard_table(check, doc)
    has_table = rollyard_raw is not _MISSING
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

    task_id = _string(check, rollyard, "id", root.name, required=has_table)
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
    version = _string(check, rollyard, "version", default_version, required=has_table)
    workdir = "/workspace"
    container = None
    if has_table:
        workspace = _workspace(check, root, rollyard)
        if ENVIRONMENT_TABLE in rollyard:
            container = _repository_image(check, root, rollyard[ENVIRONMENT_TABLE])
    else:
        workspace, workdir, container = _image_workspace(check, root, harbor)
    workdir = harbor.environment.workdir or workdir
    test_command = _string(check, rollyard, "test_command", DEFAULT_TEST_COMMAND)
    runner = _string(check, rollyard, "test_runner", "pytest")
    test_runner: TestRunner = "pytest"
    if runner == "unittest":
        test_runner = "unittest"
    elif runner != "pytest":
        check.add("task.toml", "rollyard.test_runner", runner, "is not a known test runner",
                  f"use one of {', '.join(TEST_RUNNERS)}")  # fmt: skip
    if test_runner == "pytest":
        test_paths = _test_paths(check, test_command)
    else:
        test_paths = _runner_command(check, test_command)

    hidden_dir: Path | None = None
    hidden_relative = _string(check, rollyard, "hidden_dir", DEFAULT_HIDDEN_DIR)
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
    fail_to_pass = _check_test_ids(
        check,
        "fail_to_pass",
        rollyard.get("fail_to_pass", []),
        workspace if workspace_ok else None,
        "the workspace",
        test_runner,
    )
    pass_to_pass = _check_test_ids(
        check,
        "pass_to_pass",
        rollyard.get("pass_to_pass", []),
        workspace if workspace_ok else None,
        "the workspace",
        test_runner,
    )
    hidden_tests = _check_test_ids(
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
    verifier = _string(check, rollyard, "verifier", "tests")
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
    difficulty = _string(check, rollyard, "difficulty", "medium")
    if difficulty not in DIFFICULTIES:
        check.add(
            "task.toml",
            "rollyard.difficulty",
            difficulty,
            "is not a known difficulty",
            f"use one of {', '.join(DIFFICULTIES)}",
        )
    limits, agent_timeout_s, verify_timeout_s = _limits(check, doc, rollyard, harbor)
    limits = limits.replace(allowed_hosts=harbor.agent_network_policy.egress_hosts)
    if workspace_ok and not check.issues:
        _bounded_tree(check, root, workspace, limits)
    family = _string(check, rollyard, "family", "harbor")
    source = _string(check, rollyard, "source", str(root.name))

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


def _rollyard_table(check: _Checker, doc: dict[str, Any]) -> object:
    """`[metadata.rollyard]`, else the older top-level `[rollyard]` (never both)."""
    metadata = doc.get("metadata")
    nested = metadata.get("rollyard", _MISSING) if isinstance(metadata, dict) else _MISSING
    legacy = doc.get("rollyard", _MISSING)
    if nested is not _MISSING and legacy is not _MISSING:
        check.add("task.toml", "rollyard", "-", "is set next to [metadata.rollyard]",
                  "keep only [metadata.rollyard]")  # fmt: skip
    return nested if nested is not _MISSING else legacy


def _absolute_workdir_uses(tests_dir: Path, workdir: str) -> list[Refusal]:
    """Test files (other than test.sh, whose paths are rewritten) that name the image's WORKDIR
    by its absolute path: bwrap mounts the workspace at /workspace only, so they need the task's
    image, where WORKDIR leads to the workspace."""
    if workdir in ("/", "/workspace") or not tests_dir.is_dir():
        return []
    pattern = re.compile(rf"(?<![\w./-]){re.escape(workdir.rstrip('/'))}\b")
    found = []
    for path in sorted(tests_dir.rglob("*")):
        if not path.is_file() or path.name in ("test.sh", "Dockerfile"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if pattern.search(text):
            rel = path.relative_to(tests_dir.parent).as_posix()
            found.append(Refusal(rel, f"names the image's WORKDIR {workdir} by its absolute path, "
                                 "where the local backend does not mount the workspace",
                                 "use paths relative to the working directory, or " + DOCKER_FIX))  # fmt: skip
    return found


def _repository_image(check: _Checker, root: Path, table: Any) -> ContainerImage | None:
    """The image of a repository task (`[metadata.rollyard.environment]`), built in layers."""
    parsed = parse_environment(table, root / "environment")
    if isinstance(parsed, list):
        for problem in parsed:
            field, _, message = problem.partition(": ")
            check.add("task.toml", f"rollyard.{ENVIRONMENT_TABLE}.{field}", "-", message,
                      "see docs/swebench.md for the table's fields")  # fmt: skip
        return None
    return ContainerImage(
        context_dir=root / "environment",
        verifier_context_dir=None,
        reason=f"rollyard.{ENVIRONMENT_TABLE}: runs in the environment image of {parsed.repo}",
        repository=parsed,
    )


def _runner_command(check: _Checker, command: str) -> tuple[str, ...]:
    """A unittest runner's command line (`python -m unittest`, `tests/runtests.py --parallel 1`):
    the verifier runs it in-process with the expected tests as labels."""
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
    elif argv[0].endswith(".py") and not _relative_inside(argv[0].removeprefix("./")):
        check.add("task.toml", "rollyard.test_command", command,
                  "names a runner script outside the workspace", "use a workspace-relative path")  # fmt: skip
    return ()


def _image_workspace(
    check: _Checker, root: Path, harbor: HarborConfig
) -> tuple[Path, str, ContainerImage | None]:
    """A plain Harbor task's workspace (what its Dockerfile copies to WORKDIR), its WORKDIR, and
    its own image when the local environment does not reproduce that Dockerfile."""
    dockerfile = root / "environment" / "Dockerfile"
    pulled = harbor.environment.docker_image
    if not dockerfile.is_file() and pulled:
        # Harbor's pre-built image: the docker backend pulls it (or says why it cannot). The
        # workspace is the image's WORKDIR; environment/ holds nothing the image needs.
        separate = harbor.verifier_mode == "separate" and (root / "tests" / "Dockerfile").is_file()
        prebuilt = ContainerImage(
            context_dir=root / "environment",
            verifier_context_dir=root / "tests" if separate else None,
            reason=f"environment.docker_image: runs in the pre-built image {pulled}",
            pulled_image=pulled,
        )
        workspace = root / "environment"
        if not workspace.is_dir():
            workspace = image_workspace(workspace, LocalImage("/", ()))  # an empty one
        return workspace, harbor.environment.workdir or "/", prebuilt
    if not dockerfile.is_file():
        return root / "environment", "/", None  # reported missing
    reading = read_dockerfile(dockerfile)
    if reading.broken is not None:
        # Refused: the directory only names the task in the report.
        return root / "environment", "/", None
    image = reading.image
    reasons = container_reasons(harbor, root)
    reasons += _absolute_workdir_uses(root / "tests", image.workdir)
    container = None
    if reasons:
        separate = harbor.verifier_mode == "separate" and (root / "tests" / "Dockerfile").is_file()
        container = ContainerImage(
            context_dir=root / "environment",
            verifier_context_dir=root / "tests" if separate else None,
            reason=f"{reasons[0].field}: {reasons[0].reason}",
        )
    try:
        return image_workspace(root / "environment", image), image.workdir, container
    except OSError as error:
        check.add("environment/Dockerfile", "-", "-", f"cannot assemble its workspace ({error})",
                  "check the COPY sources and the cache directory")  # fmt: skip
        return root / "environment", image.workdir, container
