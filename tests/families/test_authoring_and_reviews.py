"""The authoring kit (tasks new, tasks lint), human reviews, and episodes on the new families."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import tomli_w

from flows.cli import main
from sandboxes import open_sandbox
from storage import TrajectoryStore
from storage.reviews import blocked_families, review_gate, review_queue
from tasks_lib import load_task
from tasks_lib.curate import CurationSettings, decide
from tasks_lib.curate.pipeline import TaskChecks
from tasks_lib.curate.review_gate import apply_review_gate
from tasks_lib.sources.authoring import lint_task
from tasks_lib.sources.families.data_analysis import generate_data_analysis_tasks
from tests.families.conftest import task_of
from training import EpisodeConfig, EpisodeKey, run_episode
from training.actions import EditFile
from training.policy import ScriptedPolicy


def test_tasks_new_scaffolds_a_family_whose_own_test_passes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["tasks", "new", "word_stats", "--dir", str(tmp_path)]) == 0
    written = json.loads(capsys.readouterr().out)
    assert {Path(f).name for f in written["files"]} == {
        "__init__.py", "generate.py", "README.md", "test_word_stats_family.py",
    }  # fmt: skip
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-k", "oracle or seed",
         str(tmp_path / "word_stats")],
        capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-2000:]
    assert main(["tasks", "new", "word_stats", "--dir", str(tmp_path)]) == 1  # exists
    assert main(["tasks", "new", "Bad-Name", "--dir", str(tmp_path)]) == 1


def _edit_toml(task_dir: Path, change: dict[str, object]) -> None:
    document = tomllib.loads((task_dir / "task.toml").read_text())
    document["metadata"]["rollyard"]["artifact"].update(change)
    (task_dir / "task.toml").write_text(tomli_w.dumps(document))


def test_lint_reports_weak_tasks(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good, no_hidden, leaky, solved = generate_data_analysis_tasks(tmp_path, 4, seed=2)
    _edit_toml(no_hidden, {"variants": ["visible"]})
    task = load_task(leaky)
    answer = (task.artifact.variants[0].expected_dir / task.artifact.outputs[0].path).read_text()  # type: ignore[union-attr]
    (leaky / "instruction.md").write_text(task.instruction + f"\nThe answer is:\n{answer}\n")
    solved_task = load_task(solved)
    (solved_task.snapshot_dir / "analysis.py").write_bytes(
        (solved / "solution/analysis.py").read_bytes()
    )

    assert lint_task(good).findings == ()
    assert [f.rule for f in lint_task(no_hidden, run_verifier=False).findings] == [
        "no_hidden_checks"
    ]
    assert "answer_in_instruction" in [
        f.rule for f in lint_task(leaky, run_verifier=False).findings
    ]
    assert "empty_action_solves" in [f.rule for f in lint_task(solved).findings]

    document = tomllib.loads((good / "task.toml").read_text())
    document["metadata"]["rollyard"]["limits"]["verify_timeout_s"] = 0.05
    (good / "task.toml").write_text(tomli_w.dumps(document))
    assert "slow_verifier" in [f.rule for f in lint_task(good).findings]

    assert main(["tasks", "lint", "--static", str(no_hidden)]) == 1
    report = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert report["weak"] and report["findings"][0]["rule"] == "no_hidden_checks"


def test_episodes_on_the_new_families_run_through_the_episode_runner(
    data_task_dirs: list[Path], ops_task_dirs: list[Path]
) -> None:
    data = task_of(data_task_dirs, "median_order_value")
    stub = 'raise NotImplementedError("write the analysis")\n'
    solution = (data.path / "solution/analysis.py").read_text()
    ops = task_of(ops_task_dirs, 'scenario = "bad_config"')
    port = ops.rules.checks[2].port  # type: ignore[union-attr]
    cases = [
        (data, [EditFile("analysis.py", stub, solution)], 1.0),
        (data, [], 0.0),
        (
            ops,
            [EditFile("config/app.toml", f'host = "127.0.0.1:{port}"', 'host = "127.0.0.1"')],
            1.0,
        ),
    ]
    for index, (task, actions, reward) in enumerate(cases):
        with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
            trajectory = run_episode(task, ScriptedPolicy(actions), sandbox,
                                     key=EpisodeKey("domains", 0, sample_index=index),
                                     config=EpisodeConfig(max_steps=3))  # fmt: skip
        assert (trajectory.status.value, trajectory.reward) == ("ok", reward), trajectory.error


def _store_with_episodes(root: Path) -> TrajectoryStore:
    store = TrajectoryStore(str(root))
    episodes = []
    for index in range(12):
        family = ("data_analysis", "ops")[index % 2]
        episodes.append({
            "episode_id": f"ep-{index:02d}", "run_id": "r", "iteration": 0,
            "task_id": f"{family}-task", "task_version": "1", "group_index": 0,
            "sample_index": index, "policy_version": "p0", "snapshot_digest": "sha256:x",
            "sandbox_backend": "bwrap", "reward": float(index % 3 == 0), "passed": index % 3 == 0,
            "status": "ok", "flags": [], "terminated": True, "n_steps": 2,
        })  # fmt: skip
    store.commit_iteration_shard("r", 0, 0, episodes=episodes)
    store.tasks.record(
        [{"task_id": f"{f}-task", "task_version": "1", "family": f, "status": "admitted"}
         for f in ("data_analysis", "ops")],
        batch_id="catalog",
    )  # fmt: skip
    return store


def test_review_queue_verdicts_agreement_and_gate(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = _store_with_episodes(tmp_path / "store")
    queue = review_queue(store, per_stratum=2, seed=1)
    strata = {(item.family, item.bucket) for item in queue}
    assert strata == {
        ("data_analysis", "pass"),
        ("data_analysis", "fail"),
        ("ops", "pass"),
        ("ops", "fail"),
    }
    assert len(queue) == 8
    assert [i.episode_id for i in queue] == [
        i.episode_id for i in review_queue(store, per_stratum=2, seed=1)
    ]

    for item in queue:
        verdict = "disagree" if item.family == "ops" else "agree"
        store.reviews.record(item.episode_id, verdict, reviewer="ana", note="checked",
                            context={**item.context(), "verifier": "rules" if item.family == "ops" else "artifact"})  # fmt: skip
    store.reviews.record(
        queue[0].episode_id, "agree", reviewer="ana", note="checked", context=queue[0].context()
    )
    assert len(store.reviews.read()) == 8  # the same verdict twice is one review
    assert {i.episode_id for i in review_queue(store, per_stratum=5)}.isdisjoint(
        {i.episode_id for i in queue}
    )

    rows = {r["family"]: r for r in store.named("review_agreement").to_pylist()}
    assert rows["data_analysis"]["agreement_rate"] == 1.0 and rows["ops"]["agreement_rate"] == 0.0
    assert rows["ops"]["verifier"] == "rules"

    decisions = review_gate(store, min_reviews=3, min_agreement=0.8)
    assert decisions["data_analysis"].admit and not decisions["ops"].admit
    assert review_gate(store, min_reviews=50)["ops"].admit  # too few reviews never block
    blocked = blocked_families(decisions)
    checks = [TaskChecks(task_dir=f"/t/{f}", task_id=f"{f}-2", task_version="1", family=f, source=None,
                         declared_difficulty=None, n_fail_to_pass=0, n_pass_to_pass=0, reasons=(),
                         flip_rates={}, runs=1, solution_passes=True, fingerprint=None, difficulty=None)
              for f in ("data_analysis", "ops")]  # fmt: skip
    gated = apply_review_gate(decide(checks, CurationSettings(reruns=1)), blocked)
    assert [(v.task_id, v.verdict) for v in gated] == [
        ("data_analysis-2", "admitted"),
        ("ops-2", "rejected"),
    ]
    assert gated[1].reasons[-1].rule == "low_review_agreement"

    episode = review_queue(store, per_stratum=1)[0].episode_id
    assert main(["review", "record", "--store", str(tmp_path / "store"), episode, "disagree",
                 "--note", "reward 1 but the answer is wrong", "--reviewer", "bo"]) == 0  # fmt: skip
    assert main(["review", "agreement", "--store", str(tmp_path / "store")]) == 0
    with pytest.raises(SystemExit) as usage:
        main(["review", "record", "--store", str(tmp_path / "store"), episode, "maybe"])
    assert usage.value.code == 2
    out = capsys.readouterr().out
    assert '"verdict": "disagree"' in out and '"agreement_rate"' in out
