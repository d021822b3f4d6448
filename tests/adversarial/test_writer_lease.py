"""Every command that writes a store takes its writer lease, as `train` does: while another
process holds it each is refused in one line (exit 3) naming the holder, before it writes or
starts anything; `evaluate` holds it while it runs and lets it go when done."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.cli import main
from rollyard.errors import EXIT_UNAVAILABLE
from storage import TrajectoryStore
from storage.lease import LEASE_FILE, inspect
from tests.storage.shard_data import make_shard

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(900)]

REPO_ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}

# Each writer command; STORE, TASKS and OUT stand for the paths.
WRITERS: dict[str, list[str]] = {
    "evaluate": ["evaluate", "--store", "STORE", "--tasks", "TASKS", "--samples", "1"],
    "store compact": ["store", "compact", "--store", "STORE"],
    "store vacuum": ["store", "vacuum", "--store", "STORE"],
    "review record": ["review", "record", "--store", "STORE", "some-episode", "agree"],
    "curate": ["curate", "TASKS", "--store", "STORE", "--workers", "0"],
    "audit": ["audit", "--store", "STORE", "--tasks", "TASKS", "--run-id", "run"],
    "sft": ["sft", "--tasks", "TASKS", "--policy", "hf:TASKS", "--out", "OUT", "--store", "STORE"],
}


@pytest.fixture
def store_root(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    store = TrajectoryStore(root)
    episodes, steps = make_shard("run", 0, 0)
    store.commit_iteration_shard("run", 0, 0, episodes=episodes, steps=steps)
    return root


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    directory = tmp_path_factory.mktemp("tasks")
    generate_demo_tasks(directory, 2, seed=3)
    return directory


@pytest.fixture
def held(store_root: Path) -> Iterator[Path]:
    """Another process holding the store's lease for the test."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from storage.lease import writer_lease\n"
            "with writer_lease(sys.argv[1], run_id='run-holder', purpose='train'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(300)\n",
            str(store_root),
        ],
        cwd=REPO_ROOT,
        env=ENV,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield store_root
    finally:
        holder.kill()
        holder.wait(timeout=30)


def files_of(root: Path) -> dict[str, int]:
    return {
        p.relative_to(root).as_posix(): p.stat().st_size
        for p in root.rglob("*")
        if p.is_file() and p.name != LEASE_FILE
    }


@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_writer_is_refused_while_another_holds_the_store(
    command: str, held: Path, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = files_of(held)
    paths = {"STORE": str(held), "TASKS": str(tasks_dir), "OUT": str(tmp_path / "out")}
    argv = [paths.get(a, a.replace("TASKS", str(tasks_dir))) for a in WRITERS[command]]
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == EXIT_UNAVAILABLE, (code, err)
    assert len(err.splitlines()) == 1 and "another writer holds this store" in err, err
    assert "run-holder" in err  # the refusal names the holder
    assert files_of(held) == before  # no commit, no Prefect database
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_evaluate_holds_the_lease_while_it_runs_and_releases_it(
    store_root: Path, tasks_dir: Path
) -> None:
    evaluation = subprocess.Popen(
        [sys.executable, "-m", "flows.cli", "evaluate", "--store", str(store_root), "--tasks",
         str(tasks_dir), "--samples", "2", "--workers", "1", "--shards", "1"],
        cwd=REPO_ROOT, env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 300
        state = inspect(store_root)
        while not (state.held and state.holder and state.holder.purpose == "evaluate"):
            assert evaluation.poll() is None, evaluation.communicate()
            assert time.monotonic() < deadline, "evaluate never took the lease"
            time.sleep(0.05)
            state = inspect(store_root)
        second = subprocess.run(
            [sys.executable, "-m", "flows.cli", "store", "compact", "--store", str(store_root)],
            cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        err = second.stderr.strip()
        assert second.returncode == EXIT_UNAVAILABLE, (second.returncode, err)
        assert len(err.splitlines()) == 1 and "evaluate" in err, err
        assert evaluation.poll() is None, "evaluate finished before the second writer was refused"
        _out, err = evaluation.communicate(timeout=600)
    finally:
        if evaluation.poll() is None:
            evaluation.kill()
            evaluation.wait(timeout=30)
    assert evaluation.returncode == 0, err[-3000:]
    assert not inspect(store_root).exists  # released: the lease file is gone
    again = subprocess.run(
        [sys.executable, "-m", "flows.cli", "store", "compact", "--store", str(store_root)],
        cwd=REPO_ROOT, env=ENV, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert again.returncode == 0, again.stderr
