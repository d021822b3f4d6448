"""Audits replay stored trajectories into fresh sandboxes and re-verify them: an honest fix is
confirmed; a reward the verifier should never have given (a tampered test) is not reproduced."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from sandboxes import SandboxPool
from storage import TrajectoryStore
from tasks_lib.format.loader import load_task
from tasks_lib.verify.oracle import solution_changes
from training.actions import EditFile, RunCommand
from training.audit import audit_iteration
from training.episode import EpisodeConfig, run_episode
from training.policy import ScriptedPolicy
from training.rollout import ShardRequest, commit_shard
from training.trajectory import EpisodeKey


def _fix_actions(task) -> list[EditFile]:  # type: ignore[no-untyped-def]
    changes = solution_changes(task)
    return [
        EditFile(path, (task.snapshot_dir / path).read_text(), data.decode())
        for path, data in changes.files.items()
    ]


def _commit(store: TrajectoryStore, task, actions, sample: int, reward_override=None):  # type: ignore[no-untyped-def]
    with SandboxPool() as pool, pool.acquire(task.snapshot_dir, limits=task.limits) as sandbox:
        trajectory = run_episode(
            task,
            ScriptedPolicy(actions),
            sandbox,
            key=EpisodeKey("a", 0, sample_index=sample),
            config=EpisodeConfig(max_steps=len(actions) + 1),
        )
    if reward_override is not None:  # a verifier that was fooled once
        import dataclasses

        trajectory = dataclasses.replace(trajectory, reward=reward_override, passed=True)
    request = ShardRequest("a", 0, sample, (), b"", "scripted")
    commit_shard(store, request, [trajectory])
    return trajectory


def test_audit_confirms_honest_fixes_and_catches_unreproducible_rewards(
    demo_tasks: Path, tmp_path: Path
) -> None:
    store = TrajectoryStore(str(tmp_path / "store"))
    task = load_task(sorted(p for p in demo_tasks.iterdir() if p.is_dir())[0])
    honest = _commit(store, task, _fix_actions(task), sample=0)
    assert honest.reward == 1.0
    test_file = next(p for p in task.fail_to_pass)[: next(p for p in task.fail_to_pass).index("::")]
    tamper = [RunCommand(f"printf 'def test_x():\\n    pass\\n' > {test_file}")]
    faked = _commit(store, task, tamper, sample=1, reward_override=1.0)

    findings = {f.episode_id: f for f in audit_iteration(store, demo_tasks, "a", 0, top_k=5)}
    assert findings[honest.episode_id].verdict == "confirmed"
    assert findings[faked.episode_id].verdict == "not_reproduced"
    assert findings[faked.episode_id].replayed_reward == 0.0
    rows = (
        store.query(
            "SELECT observed FROM gates WHERE suite = 'audit' AND kind = 'expectation' ORDER BY 1"
        )
        .column(0)
        .to_pylist()
    )
    assert sorted(rows) == ["confirmed", "not_reproduced"]
    assert not store.gates.iteration_status("a", 0).quarantined  # audits inform, never quarantine
    (rates,) = store.named("audit_rates").to_pylist()
    assert rates["audited"] == 2 and rates["confirmed_rate"] == 0.5


def test_audit_cli_rejects_a_missing_store(tmp_path: Path, demo_tasks: Path) -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "audit",
            "--store",
            str(tmp_path / "none"),
            "--tasks",
            str(demo_tasks),
            "--run-id",
            "x",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "rollyard: error:" in result.stderr
