"""The files of a task directory: instruction.md and task.toml read within their bounds, the parts
Harbor requires present, and the workspace found (rollyard's workspace dir, or what a plain
Harbor task's Dockerfile copies to its WORKDIR) and checked against the sandbox's limits.
"""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path
from typing import Any

from sandboxes import Limits
from sandboxes.errors import SnapshotError
from sandboxes.snapshot import TreeBounds, check_tree
from tasks_lib.format.fields import string_field
from tasks_lib.format.harbor import HarborConfig
from tasks_lib.format.issues import MISSING, IssueCollector, relative_inside
from tasks_lib.format.model import DEFAULT_WORKSPACE_DIR, ContainerImage
from tasks_lib.format.repository import ENVIRONMENT_TABLE, parse_environment
from tasks_lib.format.runnable import (
    LocalImage,
    absolute_workdir_uses,
    container_reasons,
    image_workspace,
    read_dockerfile,
)

MAX_INSTRUCTION_BYTES = 256 << 10
"""Largest instruction.md: a prompt, not a data file (the agent reads data from the workspace)."""
MAX_TASK_TOML_BYTES = 1 << 20


def harbor_layout(check: IssueCollector, root: Path) -> tuple[str, dict[str, Any]]:
    """The instruction text and the parsed task.toml, with an issue for each part Harbor requires
    that is missing, too large or unreadable."""
    instruction = ""
    instruction_path = root / "instruction.md"
    if not instruction_path.is_file():
        check.add("instruction.md", "-", MISSING, "is missing", "write the task prompt there")
    elif small_enough(check, instruction_path, "instruction.md", MAX_INSTRUCTION_BYTES):
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
            "task.toml", "-", MISSING, "is missing", 'create it with at least version = "1.0"'
        )
    elif small_enough(check, toml_path, "task.toml", MAX_TASK_TOML_BYTES):
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
            MISSING,
            "is missing",
            "add environment/ with a Dockerfile and the workspace files it copies",
        )
    elif not (root / "environment" / "Dockerfile").is_file() and not pulls_image:
        check.add(
            "environment/Dockerfile",
            "-",
            MISSING,
            "is missing",
            "add a Dockerfile that copies the workspace (Harbor builds the image from it), "
            "or set [environment] docker_image",
        )
    if not (root / "tests" / "test.sh").is_file():
        check.add(
            "tests/test.sh",
            "-",
            MISSING,
            "is missing",
            "add a script that runs the tests and writes /logs/verifier/reward.txt",
        )
    return instruction, doc


def small_enough(check: IssueCollector, path: Path, name: str, max_bytes: int) -> bool:
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


def bounded_tree(check: IssueCollector, root: Path, workspace: Path, limits: Limits) -> None:
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


def rollyard_workspace(check: IssueCollector, root: Path, rollyard: dict[str, Any]) -> Path:
    """The workspace of a task with rollyard's fields, checked to hold no history or solution."""
    if "workspace_dir" in rollyard:
        relative = string_field(check, rollyard, "workspace_dir", DEFAULT_WORKSPACE_DIR)
    elif (root / DEFAULT_WORKSPACE_DIR).is_dir():
        relative = DEFAULT_WORKSPACE_DIR
    else:
        # A plain Harbor task copies environment/ into its image; that is what the agent sees.
        relative = "environment"
    workspace = root / relative
    if not relative_inside(relative) or not workspace.is_dir():
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


def harbor_workspace(
    check: IssueCollector, root: Path, harbor: HarborConfig
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
    reasons += absolute_workdir_uses(root / "tests", image.workdir)
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


def repository_image(check: IssueCollector, root: Path, table: Any) -> ContainerImage | None:
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
