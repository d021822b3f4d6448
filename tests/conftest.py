"""Test-session setup shared by every test package: private state directories, no telemetry."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# Prefect and friends read these at import time of their settings, so set them before any test
# module imports them.
os.environ.setdefault("DO_NOT_TRACK", "1")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("MPLBACKEND", "Agg")


@pytest.fixture(scope="session", autouse=True)
def private_sandbox_root() -> Iterator[Path]:
    """Sandboxes of this test session live in their own state dir, so tests never touch (or
    sweep) sandboxes of other processes on the host. Its ancestors must be traversable by the
    unprivileged sandbox uid, hence /var/tmp rather than pytest's 0700 tmp dirs."""
    root = Path(tempfile.mkdtemp(prefix="rollyard-test-", dir="/var/tmp"))
    root.chmod(0o711)
    previous = os.environ.get("ROLLYARD_SANDBOX_ROOT")
    os.environ["ROLLYARD_SANDBOX_ROOT"] = str(root)
    yield root
    if previous is None:
        os.environ.pop("ROLLYARD_SANDBOX_ROOT", None)
    else:
        os.environ["ROLLYARD_SANDBOX_ROOT"] = previous
    from sandboxes.host import release_runtime_dir

    # Anything still here was leaked by a test of this process: unmount it, then delete the
    # directory (release_runtime_dir never deletes through a mount).
    release_runtime_dir(root)
