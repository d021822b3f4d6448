"""Isolated, resource-limited, copy-on-write sandboxes: the ground every episode runs on.

from sandboxes import Limits, open_sandbox
with open_sandbox("path/to/snapshot", limits=Limits(memory_mb=512)) as sb:
    result = sb.execute("python -m pytest -q", timeout_s=30)
    changes = sb.diff()
    sb.reset()
"""

from __future__ import annotations

from pathlib import Path

from sandboxes.base import (
    REFUSED_COMMAND_EXIT_CODE,
    WORKSPACE_MOUNT,
    ExecResult,
    FileEnds,
    Limits,
    Sandbox,
    WorkspaceDiff,
)
from sandboxes.errors import (
    InvalidLimitsError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxSetupError,
    SandboxUnavailableError,
    SnapshotError,
    UnknownBackendError,
    WorkspacePathError,
)
from sandboxes.pool import SandboxPool

BACKENDS = ("bwrap", "docker")


def open_sandbox(
    snapshot: str | Path,
    *,
    backend: str = "bwrap",
    limits: Limits | None = None,
    image: str | None = None,
) -> Sandbox:
    """Open a sandbox over `snapshot` (a directory: the task's initial workspace); `image` (docker
    only) is the image the workspace is layered on, the base image by default."""
    limits = limits or Limits()
    if backend == "bwrap":
        from sandboxes.bwrap import BwrapSandbox

        if image is not None:
            raise UnknownBackendError(
                f"the bwrap backend runs on this machine's own environment, not image {image!r}; "
                "open it with backend='docker'"
            )
        return BwrapSandbox(Path(snapshot), limits=limits)
    if backend == "docker":
        from sandboxes.docker import DockerSandbox

        return DockerSandbox(Path(snapshot), limits=limits, image=image)
    raise UnknownBackendError(
        f"unknown sandbox backend {backend!r}; choose one of {', '.join(BACKENDS)}"
    )


__all__ = [
    "BACKENDS",
    "REFUSED_COMMAND_EXIT_CODE",
    "WORKSPACE_MOUNT",
    "ExecResult",
    "FileEnds",
    "InvalidLimitsError",
    "Limits",
    "Sandbox",
    "SandboxClosedError",
    "SandboxCrashedError",
    "SandboxError",
    "SandboxPool",
    "SandboxSetupError",
    "SandboxUnavailableError",
    "SnapshotError",
    "UnknownBackendError",
    "WorkspaceDiff",
    "WorkspacePathError",
    "open_sandbox",
]
