"""Fixtures of the adversarial suite: a private sandbox state directory per test, a small
workspace, and a populated store. Each test attacks one surface and asserts the attack failed."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes import host
from sandboxes.errors import SandboxUnavailableError
from storage import TrajectoryStore
from tests.storage.shard_data import make_shard


@pytest.fixture
def needs_sandbox_host() -> None:
    try:
        host.check_host()
    except SandboxUnavailableError as error:
        pytest.skip(f"bwrap sandbox unavailable: {error}")


@pytest.fixture
def sandbox_root(monkeypatch: pytest.MonkeyPatch, needs_sandbox_host: None) -> Iterator[Path]:
    """A sandbox state dir of this test alone, so its leftover checks never see the sandboxes of
    other processes. /var/tmp, mode 0711: the sandbox uid must traverse it."""
    root = Path(tempfile.mkdtemp(prefix="rollyard-adv-", dir="/var/tmp"))
    root.chmod(0o711)
    monkeypatch.setenv(host.ROOT_ENV, str(root))
    yield root
    host.release_runtime_dir(root)


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    root = tmp_path / "workspace"
    root.mkdir()
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    return root


@pytest.fixture
def store(tmp_path: Path) -> TrajectoryStore:
    store = TrajectoryStore(tmp_path / "store")
    for shard in range(2):
        episodes, steps = make_shard("run", 0, shard)
        store.commit_iteration_shard("run", 0, shard, episodes=episodes, steps=steps)
    return store
