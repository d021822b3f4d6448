"""Test ids a task lists (`fail_to_pass`, `pass_to_pass`, `hidden_tests`): pytest node ids, their
form and whether the test files define the tests they name; unittest ids (`test_name
(module.Class)`), their form.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tasks_lib.format.issues import IssueCollector, relative_inside
from tasks_lib.format.model import TestRunner

# A parametrization (`[...]`) may hold any character pytest puts in an id, `:` and `[` included.
TEST_ID_PATTERN = re.compile(
    r"^(?P<file>[^:\s][^:]*\.py)(?P<rest>(?:::[^:\[\]]+)+(?:\[.*\])?)$", re.DOTALL
)
UNITTEST_ID_PATTERN = re.compile(r"^(?P<name>[A-Za-z_]\w*) \((?P<owner>[A-Za-z_][\w.]*)\)$")
"""A unittest-runner test id as Django and SWE-bench write it: `test_name (module.Class)`."""


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
    return re.sub(r"\[.*\]$", "", match.group("rest")[2:], flags=re.DOTALL)


def check_test_ids(
    check: IssueCollector,
    field: str,
    ids: Any,
    root: Path | None,
    root_label: str,
    runner: TestRunner = "pytest",
) -> tuple[str, ...]:
    """The test ids of `field`, each checked for its form and, under `root`, for the test it
    names."""
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
        if match is None or not relative_inside(match.group("file")):
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
