"""The one Harbor task writer: every source (families, synthesis, SWE-bench import) ends with it.

    write_task(TaskFiles(task_id=..., instruction=..., workspace={...}, rollyard={...},
                         solve_sh=..., tests={...}), out / task_id)

It owns the layout (`instruction.md`, `task.toml`, `environment/Dockerfile`, `tests/test.sh`,
`solution/solve.sh`) and Harbor's conventions (the image, /tests, /logs/verifier, /workspace);
a source says only what is its own. The directory is assembled under `<name>.partial` and renamed
into place, so a crash never leaves half a task behind.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import tomli_w
from packaging.requirements import Requirement

from tasks_lib.errors import GenerationError
from tasks_lib.format.harbor import SCHEMA_VERSION
from tasks_lib.format.model import DEFAULT_WORKSPACE_DIR

HARBOR_IMAGE = "python:3.11-slim"
HARBOR_ORG = "rollyard"
"""The org of `[task].name` (`rollyard/<task id>`): Harbor names a task package `org/name`."""
WORKSPACE_IN_IMAGE = "/workspace"
DEFAULT_ENVIRONMENT: Mapping[str, float | int] = {
    "build_timeout_sec": 600.0,
    "cpus": 1,
    "memory_mb": 1024,
    "storage_mb": 512,
}
"""The `[environment]` table of task.toml: what Harbor gives the task's container."""
REWARD_FROM_EXIT = (
    "if [ $? -eq 0 ]; then echo 1 > /logs/verifier/reward.txt; "
    "else echo 0 > /logs/verifier/reward.txt; fi\n"
)
"""The last line of a test.sh whose reward is the previous command's success."""
FIX_PATCH = "fix.patch"
"""Name under `solution/` of the patch `patch_solve_sh` applies."""

FileContent = str | bytes | Path
"""What a task file holds: text, bytes, or a host path whose file (or directory tree, links
followed) is copied."""


def pinned(requirement: str) -> str:
    """`requirement` pinned to the version installed here: the environment rollyard verifies in
    is the one Harbor builds (and `harbor lint` wants exact pins)."""
    name = Requirement(requirement.strip("\"'")).name
    return f"{name}=={importlib.metadata.version(name)}"


def dockerfile(*packages: str, after: tuple[str, ...] = ()) -> str:
    """`environment/Dockerfile`: the Python image, `packages` pip-installed at the versions
    installed here, the workspace copied to /workspace, then the `after` lines."""
    lines = [f"FROM {HARBOR_IMAGE}"]
    if packages:
        lines.append(f"RUN pip install --no-cache-dir {' '.join(map(pinned, packages))}")
    lines += ["WORKDIR /workspace", "COPY workspace/ /workspace/", *after]
    return "\n".join(lines) + "\n"


def harbor_test_sh(purpose: str, body: str) -> str:
    """`tests/test.sh`: Harbor's verifier entry point. `purpose` (one or more lines) says what it
    does; `body` runs the checks and writes /logs/verifier/reward.txt."""
    comment = f"Harbor verifier entry point: {purpose}".split("\n")
    head = "\n".join(["#!/bin/bash", *(f"# {line}" for line in comment)])
    return f"{head}\nset -u\nmkdir -p /logs/verifier\n{body}"


def patch_solve_sh(what: str) -> str:
    """`solution/solve.sh` applying `solution/fix.patch` in the workspace; `what` says which fix."""
    return (
        f"#!/bin/bash\n# Reference solution: {what}\nset -euo pipefail\n"
        f'patch -p1 --forward --no-backup-if-mismatch < "$(dirname "$0")/{FIX_PATCH}"\n'
    )


DEFAULT_DOCKERFILE = dockerfile("duckdb", "pandas", "pyarrow")

HARBOR_TEST_SH = harbor_test_sh(
    "runs the task's declared checks (tests/harbor_spec.json) with the\n"
    "stdlib-only checker next to it and writes the reward. rollyard's own verifier reads the same\n"
    "declarations from task.toml and runs them in a fresh sandbox.",
    "python3 /tests/harbor_check.py /tests/harbor_spec.json /workspace > /logs/verifier/reward.txt"
    " \\\n    || echo 0 > /logs/verifier/reward.txt\n",
)
"""The test.sh of artifact and rule tasks: the stdlib checker over the declared checks."""


@dataclasses.dataclass(frozen=True, slots=True)
class TaskFiles:
    """Everything one task directory holds."""

    task_id: str
    instruction: str
    workspace: Mapping[str, str | bytes]
    """Workspace-relative path -> content: the agent's starting files (written over
    `workspace_base` when that is given)."""
    rollyard: Mapping[str, Any]
    """The `[rollyard]` table, written in the order given; `id`, `version` and `workspace_dir`
    are filled in (first) when absent."""
    solve_sh: str
    """`solution/solve.sh`: applies the reference solution inside the workspace."""
    tests: Mapping[str, FileContent] = dataclasses.field(default_factory=dict)
    """Task-relative paths under `tests/` (references, overlays, hidden tests) -> content."""
    solution: Mapping[str, FileContent] = dataclasses.field(default_factory=dict)
    """Further files under `solution/` that solve.sh reads."""
    test_sh: str = HARBOR_TEST_SH
    metadata: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dockerfile: str = DEFAULT_DOCKERFILE
    verifier_timeout_s: float = 120.0
    agent_timeout_s: float = 600.0
    environment: Mapping[str, float | int] = dataclasses.field(
        default_factory=lambda: dict(DEFAULT_ENVIRONMENT)
    )
    workspace_base: Path | None = None
    """A host directory copied (links kept as links) as the starting workspace before
    `workspace` is written: a whole project, for synthesis and imports."""
    environment_files: Mapping[str, FileContent] = dataclasses.field(default_factory=dict)
    """Further files of the build context `environment/` next to the Dockerfile (a repository
    environment's requirements)."""


def _write(path: Path, content: FileContent) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, Path):
        if content.is_dir():
            shutil.copytree(content, path, dirs_exist_ok=True)
        else:
            shutil.copyfile(content, path)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        path.write_bytes(content)


def write_task(files: TaskFiles, task_dir: str | Path) -> Path:
    """Write `files` as a Harbor task directory at `task_dir` (replacing it if it exists)."""
    target = Path(task_dir)
    tmp = target.with_name(target.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        _assemble(files, tmp)
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def _assemble(files: TaskFiles, tmp: Path) -> None:
    workspace = tmp / DEFAULT_WORKSPACE_DIR
    workspace.mkdir(parents=True)
    if files.workspace_base is not None:
        shutil.copytree(files.workspace_base, workspace, symlinks=True, dirs_exist_ok=True)
    for root, entries in (
        (workspace, files.workspace),
        (tmp / "tests", files.tests),
        (tmp / "solution", files.solution),
        (tmp / "environment", files.environment_files),
    ):
        for rel, content in entries.items():
            _write(root / rel, content)
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
    defaults = {"id": files.task_id, "version": "1", "workspace_dir": DEFAULT_WORKSPACE_DIR}
    rollyard = {key: value for key, value in defaults.items() if key not in files.rollyard}
    rollyard.update(files.rollyard)
    # Harbor's task model (schema 1.4): rollyard's fields under [metadata.rollyard]; the verifier
    # in its own environment with the agent's workspace carried over as an artifact, as
    # rollyard's verifier does (a fresh sandbox with the agent's changes); no network.
    document = {
        "schema_version": SCHEMA_VERSION,
        "artifacts": [WORKSPACE_IN_IMAGE],
        "task": {"name": f"{HARBOR_ORG}/{files.task_id}"},
        "metadata": {**files.metadata, "rollyard": rollyard},
        "verifier": {"timeout_sec": files.verifier_timeout_s, "environment_mode": "separate"},
        "agent": {"timeout_sec": files.agent_timeout_s},
        "environment": {**files.environment, "network_mode": "no-network"},
    }
    (tmp / "task.toml").write_bytes(tomli_w.dumps(document).encode())


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
