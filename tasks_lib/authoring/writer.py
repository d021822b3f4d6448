"""Write one Harbor task directory from its parts: what every family generator ends with.

    write_task(TaskFiles(task_id=..., instruction=..., workspace={...}, rollyard={...},
                         solve_sh=..., tests={...}), out / task_id)

The directory is assembled under `<name>.partial` and renamed into place, so a crash never
leaves half a task behind.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomli_w

from tasks_lib.errors import GenerationError
from tasks_lib.model import DEFAULT_WORKSPACE_DIR, HARBOR_FORMAT_VERSION

DEFAULT_DOCKERFILE = """\
FROM python:3.11-slim
RUN pip install --no-cache-dir duckdb pandas pyarrow
WORKDIR /workspace
COPY workspace/ /workspace/
"""

HARBOR_TEST_SH = """\
#!/bin/bash
# Harbor verifier entry point: runs the task's declared checks (tests/harbor_spec.json) with the
# stdlib-only checker next to it and writes the reward. rollyard's own verifier reads the same
# declarations from task.toml and runs them in a fresh sandbox.
set -u
mkdir -p /logs/verifier
python3 /tests/harbor_check.py /tests/harbor_spec.json /workspace > /logs/verifier/reward.txt \\
    || echo 0 > /logs/verifier/reward.txt
"""


@dataclasses.dataclass(frozen=True, slots=True)
class TaskFiles:
    """Everything one task directory holds."""

    task_id: str
    instruction: str
    workspace: Mapping[str, str | bytes]
    """Workspace-relative path -> content: the agent's starting files."""
    rollyard: Mapping[str, Any]
    """The `[rollyard]` table; `id`, `version` and `workspace_dir` are filled in when absent."""
    solve_sh: str
    """`solution/solve.sh`: applies the reference solution inside the workspace."""
    tests: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)
    """Task-relative paths under `tests/` (references, overlays, hidden tests) -> content."""
    solution: Mapping[str, str | bytes] = dataclasses.field(default_factory=dict)
    """Further files under `solution/` that solve.sh reads."""
    test_sh: str = HARBOR_TEST_SH
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dockerfile: str = DEFAULT_DOCKERFILE
    verifier_timeout_s: float = 120.0
    agent_timeout_s: float = 600.0


def _write(path: Path, content: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)


def write_task(files: TaskFiles, task_dir: str | Path) -> Path:
    """Write `files` as a Harbor task directory at `task_dir` (replacing it if it exists)."""
    target = Path(task_dir)
    tmp = target.with_name(target.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    workspace = tmp / DEFAULT_WORKSPACE_DIR
    workspace.mkdir(parents=True)
    for rel, content in files.workspace.items():
        _write(workspace / rel, content)
    for rel, content in files.tests.items():
        _write(tmp / "tests" / rel, content)
    for rel, content in files.solution.items():
        _write(tmp / "solution" / rel, content)
    _write(tmp / "solution" / "solve.sh", files.solve_sh)
    (tmp / "solution" / "solve.sh").chmod(0o755)
    _write(tmp / "tests" / "test.sh", files.test_sh)
    (tmp / "tests" / "test.sh").chmod(0o755)
    kind = files.rollyard.get("verifier", "tests")
    if kind in ("artifact", "rules"):
        # Harbor runs tests/test.sh in the task image, where only tests/ is mounted (at /tests):
        # the declarations travel with the stdlib checker that test.sh runs.
        spec = {"kind": kind, kind: files.rollyard[kind]}
        _write(tmp / "tests" / "harbor_spec.json", json.dumps(spec, indent=1, sort_keys=True))
        checker = Path(__file__).with_name("harbor_check.py")
        shutil.copyfile(checker, tmp / "tests" / "harbor_check.py")
    _write(tmp / "environment" / "Dockerfile", files.dockerfile)
    _write(tmp / "instruction.md", files.instruction)
    rollyard = {"id": files.task_id, "version": "1", "workspace_dir": DEFAULT_WORKSPACE_DIR}
    rollyard.update(files.rollyard)
    document = {
        "version": HARBOR_FORMAT_VERSION,
        "metadata": dict(files.metadata),
        "verifier": {"timeout_sec": files.verifier_timeout_s},
        "agent": {"timeout_sec": files.agent_timeout_s},
        "environment": {
            "build_timeout_sec": 600.0,
            "cpus": 1,
            "memory_mb": 1024,
            "storage_mb": 512,
        },
        "rollyard": rollyard,
    }
    (tmp / "task.toml").write_bytes(tomli_w.dumps(document).encode())
    if target.exists():
        shutil.rmtree(target)
    tmp.rename(target)
    return target


def write_numbered_tasks(
    out_dir: str | Path,
    count: int,
    *,
    write_one: Callable[[int, Path], Path],
    name: Callable[[int], str],
    progress: Callable[[int, Path], None] | None = None,
) -> list[Path]:
    """Write tasks 0..count-1 of a family under `out_dir`: `write_one(index, task_dir)` writes
    one, `name(index)` names its directory. Task N is the same whatever the count."""
    if count < 1:
        raise GenerationError(f"count must be at least 1, got {count}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for index in range(count):
        path = write_one(index, out / name(index))
        written.append(path)
        if progress is not None:
            progress(index, path)
    return written
