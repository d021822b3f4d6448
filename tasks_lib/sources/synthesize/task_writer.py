"""A kept mutant written as a Harbor task through the one task writer: the instruction (the
failing tests, their messages and code; nothing of the fix), the hidden original tests, the
reward script that reads pytest's own node ids, and the reverse patch as the solution."""

from __future__ import annotations

import ast
import difflib
import json
import re
from pathlib import Path

from tasks_lib.format.model import DEFAULT_WORKSPACE_DIR
from tasks_lib.sources.authoring.writer import (
    FIX_PATCH,
    FileContent,
    TaskFiles,
    dockerfile,
    harbor_test_sh,
    patch_solve_sh,
    write_task,
)
from tasks_lib.sources.synthesize.mutants import MutantResult
from tasks_lib.sources.synthesize.project import ProjectLayout
from tasks_lib.verify.junit import NODEID_PLUGIN, NODEID_PROPERTY

FAMILY = "synth.mutation"
MAX_LISTED_FAILURES = 10

_DOCKERFILE = dockerfile('"pytest>=7"')

_TEST_SH = harbor_test_sh(
    "restores the original test files, runs the suite, and writes\n"
    "reward 1 only when every expected test passed.",
    "cp -r /tests/protected/. /workspace/\n"
    "cd /workspace\n"
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 PYTHONPATH=/tests "
    "python -m pytest -p rollyard_nodeids \\\n    -p no:cacheprovider -q -o junit_family=xunit1 "
    "--junitxml=/logs/verifier/junit.xml {test_paths}\n"
    "python /tests/reward.py /logs/verifier/junit.xml /tests/expected_tests.json \\\n"
    "    > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n",
)

_REWARD_PY = f'''\
"""Reward 1 when every expected test id appears in the JUnit report as passed, else 0."""
import json
import re
import sys
import xml.etree.ElementTree as ElementTree

report, expected_file = sys.argv[1], sys.argv[2]
passed = set()
for case in ElementTree.parse(report).getroot().iter("testcase"):
    # The node id the rollyard_nodeids plugin recorded; ids are only ever compared with pytest's.
    ids = [p.get("value") for p in case.iterfind("properties/property")
           if p.get("name") == {NODEID_PROPERTY!r}]
    if ids and not any(child.tag in ("failure", "error", "skipped") for child in case):
        passed.add(ids[0])
expected = json.load(open(expected_file))
print(1 if expected and all(test_id in passed for test_id in expected) else 0)
'''

_SOLVE_SH = patch_solve_sh("the reverse of the injected bug, applied in the workspace.")


def _test_source(workspace: Path, test_id: str) -> str:
    """Source of the test function a test id names (shown in the instruction), or ''."""
    file_rel, _, rest = test_id.partition("::")
    parts = re.sub(r"\[.*\]$", "", rest).split("::")
    try:
        source = (workspace / file_rel).read_text(encoding="utf-8")
        tree = ast.parse(source)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return ""
    nodes: list[ast.stmt] = tree.body
    found: ast.stmt | None = None
    for part in parts:
        found = next(
            (
                n
                for n in nodes
                if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                and n.name == part
            ),
            None,
        )
        if found is None:
            return ""
        nodes = getattr(found, "body", [])
    segment = ast.get_source_segment(source, found) if found is not None else None
    if not segment or segment.count("\n") > 40:
        return ""
    return segment


def _instruction(workspace: Path, layout: ProjectLayout, result: MutantResult) -> str:
    """What the agent is told: the failing tests, their messages and code; nothing of the fix."""
    messages = dict(result.messages)
    listed = result.fail_to_pass[:MAX_LISTED_FAILURES]
    lines = [
        f"# Fix the failing tests of `{layout.name}`\n",
        f"The workspace holds `{layout.name}`, a Python project, and its pytest suite. "
        "A change to the library code broke behaviour the suite checks; these tests now fail:\n",
    ]
    for test_id in listed:
        message = messages.get(test_id, "").strip()
        lines.append(f"- `{test_id}`" + (f": `{message}`" if message else ""))
    if len(result.fail_to_pass) > len(listed):
        lines.append(f"- and {len(result.fail_to_pass) - len(listed)} more")
    example = next((s for s in (_test_source(workspace, t) for t in listed) if s), "")
    if example:
        lines += ["", "One of them:", "", "```python", example, "```"]
    command = "python -m pytest " + " ".join(layout.test_paths)
    lines += [
        "",
        "Find the cause in the library code and fix it so the whole suite passes "
        f"({len(result.pass_to_pass)} other tests pass now and must keep passing). Run:",
        "",
        f"    {command}",
        "",
        "Change only the library source. Test files, conftest files and configuration are "
        "restored before grading.",
        "",
    ]
    return "\n".join(lines)


def write_synthesized_task(
    workspace: Path, layout: ProjectLayout, result: MutantResult, task_dir: Path, task_id: str
) -> Path:
    """Write one kept mutant as a Harbor task directory (replacing `task_dir`)."""
    mutation = result.mutation
    original = (workspace / mutation.path).read_bytes()
    mutated = mutation.apply(original)
    patch = "".join(
        difflib.unified_diff(
            mutated.decode("utf-8").splitlines(keepends=True),
            original.decode("utf-8").splitlines(keepends=True),
            fromfile=f"a/{mutation.path}",
            tofile=f"b/{mutation.path}",
        )
    )
    # The original test files, restored over the workspace by test.sh before grading.
    tests: dict[str, FileContent] = {
        f"protected/{test_path}": workspace / test_path
        for test_path in (*layout.test_paths, "conftest.py")
        if (workspace / test_path).exists()
    }
    tests["reward.py"] = _REWARD_PY
    tests["rollyard_nodeids.py"] = NODEID_PLUGIN
    expected = [*result.fail_to_pass, *result.pass_to_pass]
    tests["expected_tests.json"] = json.dumps(expected, indent=0)
    failing = len(result.fail_to_pass)
    difficulty = "easy" if failing > 5 else "medium" if failing > 1 else "hard"
    files = TaskFiles(
        task_id=task_id,
        instruction=_instruction(workspace, layout, result),
        workspace={mutation.path: mutated},
        workspace_base=workspace,
        rollyard={
            "id": task_id,
            "version": "1",
            "family": FAMILY,
            "source": f"{layout.name}: AST mutation ({mutation.operator})",
            "difficulty": difficulty,
            "workspace_dir": DEFAULT_WORKSPACE_DIR,
            "test_command": "python -m pytest " + " ".join(layout.test_paths),
            "fail_to_pass": list(result.fail_to_pass),
            "pass_to_pass": list(result.pass_to_pass),
            "protected": list(layout.protected),
            "limits": {
                "wall_time_s": 300.0,
                "cpu_time_s": 600.0,
                "memory_mb": 2048,
                "disk_mb": 1024,
                "verify_timeout_s": 300.0,
            },
        },
        solve_sh=_SOLVE_SH,
        tests=tests,
        solution={FIX_PATCH: patch},
        test_sh=_TEST_SH.format(test_paths=" ".join(layout.test_paths)),
        metadata={
            "author_name": "rollyard synthesis",
            "difficulty": difficulty,
            "category": "debugging",
            "tags": ["python", "bug-fix", "synthesized", mutation.operator],
            "bugs": [mutation.describe()],
        },
        dockerfile=_DOCKERFILE,
        verifier_timeout_s=300.0,
        agent_timeout_s=900.0,
        environment={
            "build_timeout_sec": 600.0,
            "cpus": 1,
            "memory_mb": 2048,
            "storage_mb": 1024,
        },
    )
    return write_task(files, task_dir)
