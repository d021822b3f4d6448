"""Fixtures of the adversarial sandbox tests (test_adversarial_*.py), which take `capable_host`
and `host_unchanged` through their `pytestmark`: after every attack, the host is unchanged.

Every test is named after the attack it blocks and asserts the attack failed. Resource bombs run
from a bounded driver process (see adversarial_support.py) and only after the capability check
passed; every test has a hard timeout.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes import Sandbox, SandboxUnavailableError, host, open_sandbox
from tests.sandboxes.adversarial_support import SMALL, leftovers, wait_until


def _host_is_capable() -> str | None:
    try:
        host.check_host()
    except SandboxUnavailableError as error:
        return str(error)
    return None


@pytest.fixture(scope="module")
def capable_host() -> None:
    reason = _host_is_capable()
    if reason:
        pytest.skip(f"bwrap sandbox unavailable, adversarial tests skipped: {reason}")


@pytest.fixture
def sandbox_root(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A state dir of this test alone, so its sweep and leftovers checks never touch the
    sandboxes of other processes. /var/tmp, mode 0711: the sandbox uid must traverse it."""
    root = Path(tempfile.mkdtemp(prefix="rollyard-adv-", dir="/var/tmp"))
    root.chmod(0o711)
    monkeypatch.setenv(host.ROOT_ENV, str(root))
    yield root
    host.release_runtime_dir(root)


@pytest.fixture
def canaries(tmp_path: Path) -> Iterator[dict[str, Path]]:
    """Secrets on the host the sandbox must never read: in /root, in the host's /tmp."""
    token = os.urandom(8).hex()
    files = {
        "root": Path(f"/root/rollyard-canary-{token}"),
        "tmp": Path(f"/tmp/rollyard-canary-{token}"),
    }
    for path in files.values():
        path.write_text(f"CANARY-{token}\n")
    yield files
    for path in files.values():
        assert path.read_text() == f"CANARY-{token}\n", f"{path} was changed"
        path.unlink()


@pytest.fixture
def host_unchanged(sandbox_root: Path) -> Iterator[None]:
    """After every attack: no mounts, runtime dirs or cgroups of this process are left."""
    yield
    owner = host.owner_token()
    assert wait_until(lambda: not any(leftovers(sandbox_root, owner).values()), 3.0), leftovers(
        sandbox_root, owner
    )


@pytest.fixture
def snapshot(tmp_path: Path) -> Path:
    root = tmp_path / "snapshot"
    (root / "pkg").mkdir(parents=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "pkg" / "data.txt").write_text("one\ntwo\n")
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    return root


@pytest.fixture
def sandbox(sandbox_root: Path, snapshot: Path) -> Iterator[Sandbox]:
    with open_sandbox(snapshot, limits=SMALL) as sb:
        yield sb
