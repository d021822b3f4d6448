"""The store against careless and hostile use: a second writer, a killed writer's lease, a crash's
leftovers, a truncated Parquet file under report/query/resume, and a tasks directory without
tasks. Every command runs as its own process under a wall timeout, and each test checks on disk
that nothing was written where the command was refused."""

from __future__ import annotations

import csv
import io
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from storage import TrajectoryStore
from storage.fsck import check_store
from storage.lease import LeaseHeldError, inspect, writer_lease

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(1200)]

REPO_ROOT = Path(__file__).resolve().parents[2]
# An outer bound, not an expectation: a `rollyard train` that only gets refused imports the
# training stack first, which took over two minutes on the shared host at load 18.
COMMAND_TIMEOUT_S = 300


def rollyard(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "flows.cli", *args],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )


def rows_of(result: subprocess.CompletedProcess[str]) -> list[dict[str, Any]]:
    """The result rows a `--format json` command printed (JSON lines)."""
    return [json.loads(line) for line in result.stdout.splitlines()]


def one_line_error(result: subprocess.CompletedProcess[str], exit_code: int, phrase: str) -> None:
    err = result.stderr.strip()
    assert result.returncode == exit_code, (result.returncode, err[-2000:])
    assert "Traceback" not in err and len(err.splitlines()) == 1 and phrase in err, err


def hold_lease(store: Path) -> subprocess.Popen[str]:
    """A process holding the store's writer lease until it is killed."""
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from storage.lease import writer_lease\n"
            "with writer_lease(sys.argv[1], run_id='run-holder'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(300)\n",
            str(store),
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    return holder


def snapshot_of(root: Path) -> dict[str, int]:
    """Every file under `root` (but the lease) and its size: what a refused command must leave."""
    return {
        path.relative_to(root).as_posix(): path.stat().st_size
        for path in root.rglob("*")
        if path.is_file() and path.name != "writer.lease"
    }


@pytest.fixture(scope="module")
def tasks_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    directory = tmp_path_factory.mktemp("tasks")
    generate_demo_tasks(directory, 2, seed=3)
    return directory


KILLED_BETWEEN_COMMITS = """
import os, signal, sys
import storage.commits
from storage import TrajectoryStore
from tests.storage.shard_data import make_shard

original = storage.commits.CommitEngine.commit_files

def commit_then_die(self, table, spec, actions, **kwargs):
    original(self, table, spec, actions, **kwargs)
    if spec.name == "steps":
        os.kill(os.getpid(), signal.SIGKILL)  # after the steps commit, before the episodes one

storage.commits.CommitEngine.commit_files = commit_then_die
episodes, steps = make_shard("run", 1, 0)
TrajectoryStore(sys.argv[1]).commit_iteration_shard("run", 1, 0, episodes=episodes, steps=steps)
"""


def kill_a_writer_between_its_commits(root: Path) -> None:
    writer = subprocess.run(
        [sys.executable, "-c", KILLED_BETWEEN_COMMITS, str(root)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        timeout=COMMAND_TIMEOUT_S,
    )
    assert writer.returncode == -signal.SIGKILL


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


# ---- one writer -----------------------------------------------------------------------------


def test_a_second_trainer_is_refused_naming_the_holder(
    store: TrajectoryStore, tasks_dir: Path
) -> None:
    root = Path(store.root)
    holder = hold_lease(root)
    try:
        before = snapshot_of(root)
        result = rollyard("train", "--tasks", str(tasks_dir), "--store", str(root))
        one_line_error(result, 3, f"pid {holder.pid}")
        assert "another writer holds this store" in result.stderr
        # Refused before the Prefect server and before any write.
        assert snapshot_of(root) == before and not (root / "prefect").exists()
    finally:
        holder.kill()
        holder.wait()


def test_a_second_writer_in_the_same_store_is_refused_and_the_lease_nests_in_one_process(
    tmp_path: Path,
) -> None:
    holder = hold_lease(tmp_path)
    try:
        with (
            pytest.raises(LeaseHeldError, match=f"pid {holder.pid}"),
            writer_lease(tmp_path, run_id="second"),
        ):
            pytest.fail("a second writer got the lease")
    finally:
        holder.kill()
        holder.wait()
    with writer_lease(tmp_path, run_id="mine"):
        # The flow takes the lease its launcher holds: that nests, it does not deadlock.
        with writer_lease(tmp_path, run_id="mine"):
            assert inspect(tmp_path).held
        assert inspect(tmp_path).held
    assert not inspect(tmp_path).exists  # released on exit: nothing left


def test_a_killed_writers_lease_is_taken_over(store: TrajectoryStore) -> None:
    root = Path(store.root)
    holder = hold_lease(root)
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    state = inspect(root)
    assert state.exists and not state.held and state.holder is not None
    assert state.holder.pid == holder.pid
    check = rollyard("store", "check", "--store", str(root), "--format", "json")
    assert check.returncode == 4, check.stdout + check.stderr
    [row] = rows_of(check)
    assert (row["kind"], row["table"], row["path"]) == ("stale_lease", "-", "writer.lease")
    assert (
        row["detail"].startswith(f"left by pid {holder.pid} ") and "'run-holder'" in row["detail"]
    )
    assert row["repair"] == "repair removes the lease file"
    with writer_lease(root, run_id="next") as stale:
        assert stale is not None and stale.pid == holder.pid and stale.run_id == "run-holder"
    assert rollyard("store", "check", "--store", str(root)).returncode == 0


def test_store_repair_is_refused_while_a_writer_runs(store: TrajectoryStore) -> None:
    root = Path(store.root)
    truncate(next((root / "steps").rglob("*.parquet")))
    holder = hold_lease(root)
    try:
        before = snapshot_of(root)
        result = rollyard("store", "repair", "--store", str(root), "--yes")
        assert result.returncode == 3 and f"pid {holder.pid}" in result.stderr
        assert snapshot_of(root) == before
    finally:
        holder.kill()
        holder.wait()


# ---- what a crash leaves ----------------------------------------------------------------------


def test_check_finds_and_repair_fixes_what_crashes_left_losing_nothing(
    store: TrajectoryStore,
) -> None:
    root = Path(store.root)
    committed = store.read_episodes().num_rows
    kill_a_writer_between_its_commits(root)
    orphan = root / "episodes" / "run_id=run" / "iteration=0" / "part-killed.zstd.parquet"
    orphan.write_bytes(b"PAR1 half a file")  # a writer killed while writing, before its commit
    damaged = next((root / "steps" / "run_id=run" / "iteration=0").glob("*.parquet"))
    truncate(damaged)
    damaged_bytes = damaged.read_bytes()

    # A writer that does not take the lease could still commit recent files: left alone.
    cautious = rollyard("store", "check", "--store", str(root))
    assert cautious.returncode == 4, cautious.stdout + cautious.stderr
    # the default table: a header, one row per problem, the row count; the summary on stderr
    header, _rule, *table, count = cautious.stdout.splitlines()
    assert header.split() == ["kind", "table", "path", "detail", "repair"]
    assert [line.split()[0] for line in table] == ["truncated"] and count == "(1 row)"
    assert "left alone" in cautious.stderr and "1 problem(s)" in cautious.stderr

    check = rollyard("store", "check", "--store", str(root), "--grace-s", "0", "--format", "csv")
    assert check.returncode == 4, check.stdout + check.stderr
    found = [(row["kind"], row["path"]) for row in csv.DictReader(io.StringIO(check.stdout))]
    # The killed writer had written its episodes file too (files go before the commits).
    assert sorted(kind for kind, _ in found) == ["orphan", "orphan", "truncated", "uncommitted"]
    assert ("orphan", orphan.relative_to(root).as_posix()) in found
    assert ("truncated", damaged.relative_to(root).as_posix()) in found
    assert "4 problem(s)" in check.stderr

    repair = rollyard(
        "store", "repair", "--store", str(root), "--grace-s", "0", "--yes", "--format", "json"
    )
    assert repair.returncode == 0, repair.stdout + repair.stderr
    repaired = rows_of(repair)
    assert {row["outcome"] for row in repaired} == {"fixed"}
    assert sorted((row["kind"], row["path"]) for row in repaired) == sorted(found)
    assert "repaired 4 problem(s)" in repair.stderr
    # Nothing lost: every file is in the quarantine, byte for byte, under its own path.
    (quarantine,) = (root / "quarantine").iterdir()
    moved = quarantine / damaged.relative_to(root)
    assert moved.read_bytes() == damaged_bytes and not damaged.exists()
    assert (quarantine / orphan.relative_to(root)).read_bytes() == b"PAR1 half a file"
    assert check_store(root, in_flight_grace_s=0).ok
    assert rollyard("store", "check", "--store", str(root), "--grace-s", "0").returncode == 0
    # Readers work again, and no committed episode went with the damaged steps file.
    assert TrajectoryStore(root).read_episodes().num_rows == committed
    assert rollyard("query", "--store", str(root), "SELECT count(*) FROM steps").returncode == 0


def test_repair_asks_before_it_changes_anything(store: TrajectoryStore) -> None:
    root = Path(store.root)
    truncate(next((root / "episodes").rglob("*.parquet")))
    before = snapshot_of(root)
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "store", "repair", "--store", str(root)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=COMMAND_TIMEOUT_S,
    )
    one_line_error(result, 2, "confirm with --yes")
    assert snapshot_of(root) == before


def test_a_truncated_parquet_file_refuses_report_query_and_resume_before_writing(
    store: TrajectoryStore, tasks_dir: Path
) -> None:
    root = Path(store.root)
    damaged = next((root / "episodes").rglob("*.parquet"))
    truncate(damaged)
    before = snapshot_of(root)
    for args in (
        ("report", "--store", str(root)),
        ("query", "--store", str(root), "SELECT count(*) FROM episodes"),
        ("query", "--store", str(root), "--named", "reward_curve"),
        ("train", "--tasks", str(tasks_dir), "--store", str(root), "--run-id", "run", "--resume"),
    ):
        result = rollyard(*args)
        one_line_error(result, 4, f"truncated: episodes/{damaged.relative_to(root / 'episodes')}")
        assert "rollyard store check" in result.stderr
        assert snapshot_of(root) == before, args  # no report, no commit, no Prefect database


def test_train_with_an_empty_tasks_directory_writes_nothing(tmp_path: Path) -> None:
    empty = tmp_path / "tasks"
    empty.mkdir()
    store = tmp_path / "store"
    result = rollyard("train", "--tasks", str(empty), "--store", str(store))
    one_line_error(result, 2, "no task directories")
    assert not store.exists()


@pytest.mark.slow
def test_two_trainers_started_together_one_runs_one_is_refused(
    tmp_path: Path, tasks_dir: Path
) -> None:
    store = tmp_path / "store"
    args = [
        sys.executable, "-m", "flows.cli", "train", "--tasks", str(tasks_dir), "--store",
        str(store), "--iterations", "1", "--tasks-per-iteration", "1", "--group-size", "2",
        "--shards", "1", "--max-steps", "2", "--workers", "1",
    ]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    trainers = [
        subprocess.Popen(
            args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    deadline = time.monotonic() + 600
    outcomes = []
    try:
        for trainer in trainers:
            _out, err = trainer.communicate(timeout=max(1.0, deadline - time.monotonic()))
            outcomes.append((trainer.returncode, err))
    finally:
        for trainer in trainers:
            trainer.kill()
    codes = sorted(code for code, _ in outcomes)
    assert codes == [0, 3], outcomes
    refused = next(err for code, err in outcomes if code == 3)
    assert "another writer holds this store" in refused and "Traceback" not in refused
    # The run's gate rows are written once: one writer ran the iteration.
    verdicts = TrajectoryStore(store).query(
        "SELECT count(*) AS n FROM gates WHERE kind = 'verdict' AND iteration = 0"
    )
    assert verdicts.column("n")[0].as_py() == 1
    assert not (store / "writer.lease").exists()


def test_two_processes_race_for_one_lease_and_exactly_one_wins(tmp_path: Path) -> None:
    racer = (
        "import os, sys, time\n"
        "from storage.lease import LeaseHeldError, writer_lease\n"
        "start = float(sys.argv[2])\n"
        "time.sleep(max(0.0, start - time.time()))\n"
        "try:\n"
        "    with writer_lease(sys.argv[1], run_id='race'):\n"
        "        print('won', flush=True)\n"
        "        give_up = time.monotonic() + 60\n"
        "        while not os.path.exists(sys.argv[3]) and time.monotonic() < give_up:\n"
        "            time.sleep(0.05)\n"
        "except LeaseHeldError:\n"
        "    print('refused', flush=True)\n"
    )
    start = str(time.time() + 2.0)
    # The winner holds the lease until every racer has answered, however late one starts.
    answered = tmp_path / "answered"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", racer, str(tmp_path), start, str(answered)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = []
    for r in racers:
        assert r.stdout is not None
        results.append(r.stdout.readline().strip())
    answered.touch()
    for r in racers:
        r.communicate(timeout=COMMAND_TIMEOUT_S)
    assert sorted(results) == ["refused", "refused", "refused", "won"]
    assert not inspect(tmp_path).exists


@pytest.mark.parametrize(
    "flag",
    [
        "--workers=100000",
        "--iterations=1000000000",
        "--group-size=100000",
        "--shards=1000000",
        "--max-steps=1000000",
        "--max-attempts=100000",
        "--episode-deadline=1e12",
        "--no-worker-timeout=inf",
    ],
)
def test_train_flags_beyond_their_maximum_are_refused(
    flag: str, tasks_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from flows.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--tasks", str(tasks_dir), "--store", str(tmp_path / "store"), flag])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1, err
    assert flag.split("=")[0] in err and not (tmp_path / "store").exists()
