"""Episode recovery under injected sandbox faults, on real bwrap sandboxes: every episode ends
exactly once, infra failures are retried (replaying the recorded actions) and labelled."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollyard.status import EpisodeStatus
from sandboxes import SandboxPool
from tasks_lib.format.loader import load_task
from training.actions import RunCommand
from training.episode import EpisodeConfig
from training.policy import ScriptedPolicy
from training.recovery import FaultPlan, RecoveryPolicy, run_episode_with_recovery
from training.trajectory import EpisodeKey

ACTIONS = [RunCommand("ls"), RunCommand("echo second"), RunCommand("echo third")]


def _first_task(demo_tasks: Path):  # type: ignore[no-untyped-def]
    return load_task(sorted(p for p in demo_tasks.iterdir() if p.is_dir())[0])


@pytest.mark.parametrize("kind", ["sandbox_kill", "hang", "oom"])
def test_sandbox_fault_is_recovered_by_replay(demo_tasks: Path, kind: str) -> None:
    task = _first_task(demo_tasks)
    plan = FaultPlan(**{kind: 1.0})  # every first attempt fails...
    policy = ScriptedPolicy(ACTIONS)
    with SandboxPool() as pool:
        trajectory = run_episode_with_recovery(
            task,
            policy,
            pool,
            key=EpisodeKey("r", 0),
            config=EpisodeConfig(max_steps=4),
            recovery=RecoveryPolicy(max_attempts=2),
            faults=_only_first_attempt(plan),
        )
    assert trajectory.status is EpisodeStatus.OK, trajectory.error
    assert trajectory.key.attempt == 1
    assert [s.action for s in trajectory.steps[: len(ACTIONS)]] == ACTIONS
    assert trajectory.reward is not None


def test_exhausted_attempts_end_as_infra_error_without_reward(demo_tasks: Path) -> None:
    task = _first_task(demo_tasks)
    with SandboxPool() as pool:
        trajectory = run_episode_with_recovery(
            task,
            ScriptedPolicy(ACTIONS),
            pool,
            key=EpisodeKey("r", 0),
            config=EpisodeConfig(max_steps=4),
            recovery=RecoveryPolicy(max_attempts=2),
            faults=FaultPlan(sandbox_kill=1.0),
        )
        assert pool.idle_count() == 0  # crashed sandboxes are closed, never reused
    assert trajectory.status is EpisodeStatus.INFRA_ERROR
    assert trajectory.reward is None and not trajectory.trainable
    assert trajectory.key.attempt == 1
    assert "SIGKILL" in (trajectory.error or "")


def test_fault_plan_is_deterministic_and_validated() -> None:
    plan = FaultPlan(sandbox_kill=0.1, hang=0.1, oom=0.1, seed=3)
    draws = [plan.fault_for(f"ep-{i}", 0) for i in range(2000)]
    assert draws == [plan.fault_for(f"ep-{i}", 0) for i in range(2000)]
    rate = sum(d is not None for d in draws) / len(draws)
    assert 0.25 < rate < 0.35
    with pytest.raises(ValueError, match="within"):
        FaultPlan(hang=1.5)
    with pytest.raises(ValueError, match="marker_dir"):
        FaultPlan(worker_kill=0.1)
    with pytest.raises(ValueError, match="max_attempts"):
        RecoveryPolicy(max_attempts=0)


class _FirstAttemptOnly(FaultPlan):
    def fault_for(self, episode_id: str, attempt: int):  # type: ignore[no-untyped-def]
        return super().fault_for(episode_id, attempt) if attempt == 0 else None


def _only_first_attempt(plan: FaultPlan) -> FaultPlan:
    return _FirstAttemptOnly(plan.sandbox_kill, plan.hang, plan.oom, plan.worker_kill, plan.seed)
