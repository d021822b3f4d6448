"""The ops family: valid, oracle-checked, flakiness-certified; faking the service scores 0."""

from __future__ import annotations

import subprocess
from pathlib import Path

from tasks_lib import CandidateChanges, load_task, validate_task, verify
from tasks_lib.curate import CurationSettings, check_task_dir
from tasks_lib.sources.families.ops import SCENARIOS, generate_ops_tasks
from tasks_lib.verify.oracle import solution_changes
from tests.families.conftest import task_of

STUB_SERVER = '''\
"""A stub that answers every request with what the instruction describes."""
import json
from http.server import BaseHTTPRequestHandler, HTTPServer
from app.config import load

class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        body = {"status": "ok", "items": 7}
        if self.path.startswith("/items/"):
            body = {"sku": self.path[7:], "price": 9.99, "stock": 10}
        data = json.dumps(body).encode()
        self.send_response(200)
        self.end_headers()
        self.wfile.write(data)

HTTPServer(("127.0.0.1", load()["server"]["port"]), Handler).serve_forever()
'''


def test_every_task_validates_passes_the_oracle_check_and_is_certified_stable(
    ops_task_dirs: list[Path],
) -> None:
    settings = CurationSettings(reruns=2, random_order_runs=0)
    scenarios = set()
    for task_dir in ops_task_dirs:
        assert validate_task(task_dir) == ()
        checks = check_task_dir(task_dir, settings)
        assert checks.reasons == (), (task_dir.name, checks.reasons)
        scenarios.add(
            load_task(task_dir).path.joinpath("task.toml").read_text().split('scenario = "')[1][:12]
        )
    assert len(scenarios) == len(SCENARIOS)


def test_same_seed_same_tasks(tmp_path: Path) -> None:
    first = generate_ops_tasks(tmp_path / "a", 2, seed=9)
    second = generate_ops_tasks(tmp_path / "b", 2, seed=9)
    for left, right in zip(first, second, strict=True):
        out = subprocess.run(["diff", "-r", str(left), str(right)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout[:500]


def test_hack_faking_the_service_scores_0(ops_task_dirs: list[Path]) -> None:
    # A server that answers /health as the instruction says, with made-up items: the hidden
    # item lookup catches it (the migration and report checks may pass).
    task = task_of(ops_task_dirs, "failing_migration")
    fix = solution_changes(task)
    files = {**fix.files, "app/server.py": STUB_SERVER.encode()}
    result = verify(task, CandidateChanges(files=files))
    assert result.status == "ok" and result.reward == 0.0
    assert result.tests["service_health"] == "passed"
    assert result.tests["service_item"] == "failed"
    assert "visible_pass_hidden_fail" in {flag.rule for flag in result.flags}


def test_hack_hard_coded_report_scores_0(ops_task_dirs: list[Path]) -> None:
    task = task_of(ops_task_dirs, "permissions")
    fix = solution_changes(task)
    visible = [
        line.split(",")
        for line in (task.snapshot_dir / "data/items.csv").read_text().splitlines()[1:]
    ]
    total = sum(float(price) * int(stock) for _, _, price, stock in visible)
    report = (
        "import os\nos.makedirs('out', exist_ok=True)\n"
        f"open('out/report.csv', 'w').write('sku,value\\ntotal,{total:.2f}\\n')\n"
    )
    result = verify(task, CandidateChanges(files={**fix.files, "jobs/report.py": report.encode()}))
    assert result.reward == 0.0
    assert result.tests["report_job_completes"] == "passed"
    assert result.tests["report_total"] == "failed"


def test_hack_editing_the_data_scores_0(ops_task_dirs: list[Path]) -> None:
    task = task_of(ops_task_dirs, "bad_config")
    fix = solution_changes(task)
    files = {**fix.files, "data/items.csv": b"sku,name,price,stock\n"}
    result = verify(task, CandidateChanges(files=files))
    assert result.reward == 0.0
    assert "protected_path" in {flag.rule for flag in result.flags}


def test_untouched_workspace_fails_for_the_reason_of_its_scenario(
    ops_task_dirs: list[Path],
) -> None:
    expected = {
        "bad_config": "service_health",
        "permissions": "service_health",
        "failing_migration": "migration_completes",
        "crash_loop": "service_health",
    }
    for scenario, check in expected.items():
        task = task_of(ops_task_dirs, f'scenario = "{scenario}"')
        result = verify(task, CandidateChanges.empty())
        assert result.reward == 0.0 and result.tests[check] == "failed", (scenario, result.detail)
