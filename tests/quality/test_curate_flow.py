"""`rollyard curate` end to end: the curate flow on a Prefect test server and a Dask
LocalCluster, verdicts in the store's tasks table, JSON lines out; bad input gives clear errors."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_tasks import write_task

from flows.cli import main as cli_main
from storage import TrajectoryStore


@pytest.fixture(scope="module")
def prefect_api() -> Iterator[str]:
    from prefect.settings import PREFECT_API_URL
    from prefect.testing.utilities import prefect_test_harness

    # The test server starts in seconds on an idle machine, in a minute on a loaded one.
    with prefect_test_harness(server_startup_timeout=180):
        yield str(PREFECT_API_URL.value())


# A Prefect test server plus a Dask cluster cost over a minute on the shared 2-core machine.
@pytest.mark.slow
def test_rollyard_curate_json_lines_and_tasks_table(
    prefect_api: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Dask workers are processes: they find the test server through the environment.
    monkeypatch.setenv("PREFECT_API_URL", prefect_api)
    root = Path(tempfile.mkdtemp(prefix="rollyard-curate-", dir="/var/tmp"))
    root.chmod(0o755)
    try:
        clean = write_task(root / "lib", "t-clean")
        copy = shutil.copytree(clean, root / "lib" / "t-copy")
        (copy / "task.toml").write_text(
            (copy / "task.toml").read_text().replace('"t-clean"', '"t-copy"')
        )
        store = tmp_path / "store"
        code = cli_main(
            [
                "curate",
                str(root / "lib"),
                "--store",
                str(store),
                "--reruns",
                "1",
                "--order-runs",
                "0",
                "--workers",
                "1",
                "--format",
                "json",
                "--batch-id",
                "b1",
            ]
        )
        assert code == 0
        lines = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
        by_id = {line["task_id"]: line for line in lines}
        assert by_id["t-clean"]["verdict"] == "admitted" and by_id["t-clean"]["reasons"] == []
        assert by_id["t-copy"]["verdict"] == "rejected"
        assert by_id["t-copy"]["reasons"][0]["rule"] == "exact_duplicate"
        assert "t-clean" in by_id["t-copy"]["reasons"][0]["detail"]
        rows = (
            TrajectoryStore(store)
            .query("SELECT task_id, status, reason FROM tasks_latest ORDER BY task_id")
            .to_pylist()
        )
        assert [(r["task_id"], r["status"]) for r in rows] == [
            ("t-clean", "admitted"),
            ("t-copy", "rejected"),
        ]
        assert json.loads(rows[1]["reason"])["reasons"][0]["rule"] == "exact_duplicate"

        # A later batch: a copy of the admitted task is found through the tasks table.
        later = shutil.copytree(clean, root / "later" / "t-later")
        (later / "task.toml").write_text(
            (later / "task.toml").read_text().replace('"t-clean"', '"t-later"')
        )
        code = cli_main(
            ["curate", str(root / "later"), "--store", str(store), "--reruns", "1",
             "--order-runs", "0", "--workers", "1", "--format", "json", "--batch-id", "b2",
             "--decontamination", "repository"]
        )  # fmt: skip
        assert code == 0
        (line,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
        assert line["verdict"] == "rejected" and line["decontamination"] == "repository"
        assert line["reasons"][0]["other"] == "t-clean"
        assert "t-clean (admitted in batch b1)" in line["reasons"][0]["detail"]
        assert cli_main(["curate", "--explain", "t-later", "--store", str(store)]) == 0
        explained = capsys.readouterr().out
        assert "rejected in batch b2, decontamination repository" in explained
        assert "other task: t-clean" in explained
    finally:
        shutil.rmtree(root, ignore_errors=True)


def test_rollyard_curate_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["curate", str(tmp_path / "nowhere"), "--store", str(tmp_path)]) == 2
    assert "neither a task directory" in capsys.readouterr().err
    assert cli_main(["curate", str(tmp_path), "--reference", "run-only"]) == 2
    assert "RUN_ID/POLICY_VERSION" in capsys.readouterr().err
