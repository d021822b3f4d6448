"""Real Harbor task directories as users bring them (fixtures/): the ones the local backend can
run faithfully pass `rollyard tasks check` (oracle 1, untouched 0); the others are refused at load
and validation with their reason; a test.sh that cannot install its tools is never a 0."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from batches import commit_batch, make_batch

from flows.cli import main
from storage import TrajectoryStore
from storage.gates import gate_iteration
from tasks_lib import TaskRefusedError, load_task, solution_changes, validate_task, verify

FIXTURES = Path(__file__).parent / "fixtures"
RUNNABLE = ("shell-greeting", "python-median", "service-health", "separate-sorter",
            "reward-json-csv")  # fmt: skip
REFUSED = {
    "network-uv-install": "needs public network",
    "needs-gpu": "needs GPUs",
    "apt-jq": "runs 'apt-get update'",
    "compose-redis": "starts compose services",
}


@pytest.fixture(autouse=True)
def _cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLYARD_CACHE_DIR", str(tmp_path / "cache"))


def _check(path: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, object]]:
    code = main(["tasks", "check", str(path)])
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.mark.parametrize("name", RUNNABLE)
def test_runnable_harbor_task_passes_the_oracle_check(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, summary = _check(FIXTURES / name, capsys)
    assert code == 0 and summary["ok"], summary
    assert summary["solution"] == {"reward": 1.0, "status": "ok", "flags": []}
    assert summary["untouched"] == {"reward": 0.0, "status": "ok", "flags": []}


@pytest.mark.parametrize(("name", "reason"), sorted(REFUSED.items()))
def test_task_needing_what_the_backend_lacks_is_refused_with_its_reason(
    name: str, reason: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(TaskRefusedError, match=reason):
        load_task(FIXTURES / name)
    issues = validate_task(FIXTURES / name)
    assert any(reason in issue.message and issue.fix for issue in issues), issues
    code, summary = _check(FIXTURES / name, capsys)
    assert code != 0 and not summary["ok"] and "refused task" in str(summary["problems"])
    assert "solution" not in summary  # never run, never scored


def test_workspace_is_what_the_dockerfile_copies_to_workdir() -> None:
    task = load_task(FIXTURES / "reward-json-csv")
    assert task.workdir == "/app" and not task.has_rollyard_table
    assert sorted(p.name for p in task.snapshot_dir.iterdir()) == ["sales.csv"]
    assert task.harbor.environment.network.mode == "no-network"
    separate = load_task(FIXTURES / "separate-sorter")
    assert separate.harbor.verifier_mode == "separate" and separate.harbor.artifacts == ("/app",)


def test_reward_json_metrics_are_named_and_reward_is_primary() -> None:
    task = load_task(FIXTURES / "reward-json-csv")
    solved = verify(task, solution_changes(task))
    assert solved.reward == 1.0
    assert solved.metrics == {"reward": 1.0, "header": 1.0, "rows_matched": 1.0}
    untouched = verify(task)
    assert (untouched.status, untouched.reward) == ("ok", 0.0)
    assert untouched.metrics == {"reward": 0.0, "header": 0.0, "rows_matched": 0.0}


def test_reward_json_without_a_primary_metric_is_a_verifier_error(tmp_path: Path) -> None:
    task_dir = Path(shutil.copytree(FIXTURES / "shell-greeting", tmp_path / "task"))
    (task_dir / "tests/test.sh").write_text(
        '#!/bin/bash\nmkdir -p /logs/verifier\necho \'{"a": 1, "b": 0}\' > /logs/verifier/reward.json\n'
    )
    result = verify(load_task(task_dir))
    assert (result.status, result.reward) == ("verifier_error", None)
    assert "none is named 'reward'" in result.detail


def test_fake_zero_test_sh_that_cannot_install_its_tools_is_a_verifier_error(
    tmp_path: Path,
) -> None:
    """The fake zero: test.sh downloads uv, fails, and writes 0 anyway. That 0 judges the
    environment, not the candidate: verifier_error, no reward, and the gate counts it."""
    task = load_task(FIXTURES / "fake-zero-tools")
    verdicts = [verify(task), verify(task, solution_changes(task))]
    for verdict in verdicts:
        assert (verdict.status, verdict.reward) == ("verifier_error", None), verdict.detail
        assert "environment failed before a test could run" in verdict.detail
    store = TrajectoryStore(tmp_path / "store")
    rows = make_batch("run", 0, groups=10)
    for row in rows[:8]:  # two groups of this task's episodes
        row.update(status=str(verdicts[0].status), reward=verdicts[0].reward, passed=None)
    commit_batch(store, "run", 0, rows)
    report = gate_iteration(store, "run", 0)
    failed = {result.expectation: result for result in report.failed}
    assert "infra_error_rate" in failed and report.quarantined
    assert float(failed["infra_error_rate"].observed or "nan") == pytest.approx(8 / len(rows))
