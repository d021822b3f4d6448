"""The episode runner on real bwrap sandboxes: every way an episode ends has its status."""

from __future__ import annotations

import dataclasses
import pickle
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from rollyard.status import EpisodeStatus
from sandboxes import Sandbox, open_sandbox
from storage import TrajectoryStore, episode_id_for
from tasks_lib.format.model import Task
from training.actions import (
    TRIAL_KEPT,
    TRIAL_REVERTED,
    EditFile,
    History,
    ReadFile,
    RunCommand,
    Submit,
    TryEdit,
)
from training.builtin.grpo import GRPOTrainer
from training.builtin.scorer_policy import CandidateScorerPolicy
from training.episode import EpisodeConfig, VerdictFlag, run_episode
from training.errors import PolicyError
from training.policy import Decision, Policy, ScorerRecord, ScriptedPolicy
from training.trajectory import EpisodeKey

# the bug tests/training/conftest.py injects into calc.py, and its fix
BUGGY_LINE = "    if value >= high:\n        return value"
FIXED_LINE = "    if value > high:\n        return high"
FIX = EditFile("calc.py", BUGGY_LINE, FIXED_LINE)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict of the shape `training.episode.Verdict` reads."""

    reward: float | None
    status: str = "ok"
    detail: str = ""
    partial_credit: float | None = None
    tests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flags: tuple[VerdictFlag, ...] = ()
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


def fixed_file_verifier(task: Task, sandbox: Sandbox) -> Verdict:
    """A quick verifier for the runner's own tests: reads the agent's file instead of running
    pytest (the real verifier is exercised by `test_scripted_fix_is_verified_and_stored`)."""
    return Verdict(1.0 if FIXED_LINE in sandbox.read_file("calc.py").decode() else 0.0)


class FailingPolicy(Policy):
    """Raises at a given step, like a model whose endpoint went down mid-episode."""

    def __init__(self, fail_at_step: int) -> None:
        self.fail_at_step = fail_at_step

    @property
    def version(self) -> str:
        return "failing"

    def act(self, history: History) -> Decision:
        if history.step_count >= self.fail_at_step:
            raise PolicyError("endpoint unreachable")
        return Decision((ReadFile("calc.py"),))


@pytest.fixture
def sandbox(bug_task: Task) -> Iterator[Sandbox]:
    with open_sandbox(bug_task.snapshot_dir, limits=bug_task.limits) as opened:
        yield opened


def test_scripted_fix_is_verified_and_stored(
    bug_task: Task, sandbox: Sandbox, tmp_path: Path
) -> None:
    policy = ScriptedPolicy(
        [RunCommand("python -m pytest -q tests"), ReadFile("calc.py"), FIX, Submit()]
    )
    key = EpisodeKey("run-a", 3, group_index=1, sample_index=2)
    trajectory = run_episode(bug_task, policy, sandbox, key=key)

    assert trajectory.status is EpisodeStatus.OK, trajectory.error
    assert trajectory.reward == 1.0 and trajectory.passed and trajectory.terminated
    assert not trajectory.truncated
    assert trajectory.episode_id == episode_id_for("run-a", 3, "calc-clamp", 1, 2, 0)
    assert (trajectory.task_id, trajectory.task_version) == ("calc-clamp", "1")
    assert trajectory.snapshot_digest == sandbox.snapshot_digest
    assert trajectory.policy_version == "scripted"
    assert [s.observation.exit_code for s in trajectory.steps] == [1, 0, 0, 0]
    assert "test_clamp_high" in trajectory.steps[0].observation.text
    assert all(s.duration_s >= 0 for s in trajectory.steps)
    assert pickle.loads(pickle.dumps(trajectory)) == trajectory

    store = TrajectoryStore(tmp_path / "store")
    store.commit_iteration_shard(
        "run-a",
        3,
        0,
        episodes=[trajectory.to_episode_record()],
        steps=trajectory.to_step_records(),
    )
    episodes = store.read_episodes("run-a", 3).to_pylist()
    assert [(e["episode_id"], e["status"], e["reward"]) for e in episodes] == [
        (trajectory.episode_id, "ok", 1.0)
    ]
    assert store.read_steps("run-a", 3).num_rows == 4


def test_a_trial_keeps_an_edit_only_when_fewer_tests_fail(bug_task: Task, sandbox: Sandbox) -> None:
    tests = "python -m pytest -q tests"
    wrong = TryEdit("calc.py", "if value >= high", "if value > high", tests, 1)  # still fails
    broken = TryEdit("calc.py", "return x * 2", "return x ** 3", tests, 1)  # fails one more
    fix = TryEdit("calc.py", BUGGY_LINE, FIXED_LINE, tests, 1)
    policy = ScriptedPolicy([wrong, broken, fix])
    trajectory = run_episode(
        bug_task, policy, sandbox, key=EpisodeKey("r", 0), config=EpisodeConfig(max_steps=3)
    )
    assert trajectory.status is EpisodeStatus.OK, trajectory.error
    first, second, third = (s.observation.text for s in trajectory.steps)
    assert TRIAL_REVERTED in first and "1 failed" in first
    assert TRIAL_REVERTED in second and "2 failed" in second
    assert f"{TRIAL_KEPT}: 1 -> 0 failing tests]" in third
    assert trajectory.reward == 1.0 and trajectory.passed  # the verifier saw only the fix
    assert sandbox.read_file("calc.py").decode().count("return x * 2") == 1


def test_step_budget_truncates_and_the_workspace_is_still_verified(
    bug_task: Task, sandbox: Sandbox
) -> None:
    policy = ScriptedPolicy([FIX, ReadFile("calc.py"), ReadFile("calc.py")])
    trajectory = run_episode(
        bug_task,
        policy,
        sandbox,
        key=EpisodeKey("r", 0),
        config=EpisodeConfig(max_steps=2),
        verifier=fixed_file_verifier,
    )
    assert trajectory.status is EpisodeStatus.OK
    assert trajectory.truncated and not trajectory.terminated
    assert len(trajectory.steps) == 2 and trajectory.reward == 1.0


def test_episode_budget_ends_in_timeout_with_a_verdict(bug_task: Task, sandbox: Sandbox) -> None:
    policy = ScriptedPolicy([RunCommand("sleep 5"), RunCommand("sleep 5")])
    trajectory = run_episode(
        bug_task,
        policy,
        sandbox,
        key=EpisodeKey("r", 0),
        config=EpisodeConfig(episode_timeout_s=0.8),
        verifier=fixed_file_verifier,
    )
    assert trajectory.status is EpisodeStatus.TIMEOUT and trajectory.truncated
    assert trajectory.steps[0].timed_out and trajectory.wall_s < 4
    assert trajectory.reward == 0.0 and trajectory.trainable


def test_agent_mistakes_are_observations_not_errors(bug_task: Task, sandbox: Sandbox) -> None:
    policy = ScriptedPolicy(
        [
            ReadFile("missing.py"),
            ReadFile("../../etc/passwd"),
            EditFile("calc.py", "return value", "return high"),  # occurs twice
            EditFile("calc.py", "not there", "x"),
            RunCommand("exit 3"),
        ]
    )
    trajectory = run_episode(
        bug_task, policy, sandbox, key=EpisodeKey("r", 0), verifier=fixed_file_verifier
    )
    assert trajectory.status is EpisodeStatus.OK
    codes = [s.observation.exit_code for s in trajectory.steps]
    assert codes == [1, 1, 1, 1, 3, 0]
    assert "occurs 2 times" in trajectory.steps[2].observation.text
    assert "does not occur" in trajectory.steps[3].observation.text


def test_long_output_is_capped_head_and_tail(bug_task: Task, sandbox: Sandbox) -> None:
    policy = ScriptedPolicy([RunCommand("seq 1 20000")])
    trajectory = run_episode(
        bug_task,
        policy,
        sandbox,
        key=EpisodeKey("r", 0),
        config=EpisodeConfig(observation_max_bytes=500),
        verifier=fixed_file_verifier,
    )
    observation = trajectory.steps[0].observation
    assert observation.truncated and len(observation.text.encode()) <= 500
    assert observation.text.startswith("1\n2\n") and "[exit code 0]" in observation.text


@pytest.mark.parametrize(
    ("verdict", "status"),
    [
        (Verdict(None, "task_error", "tests do not collect"), EpisodeStatus.TASK_ERROR),
        (Verdict(None, "infra_error", "sandbox failed"), EpisodeStatus.INFRA_ERROR),
        (Verdict(None, "verifier_error", "no report"), EpisodeStatus.VERIFIER_ERROR),
    ],
)
def test_verifier_statuses_carry_no_reward(
    bug_task: Task, sandbox: Sandbox, verdict: Verdict, status: EpisodeStatus
) -> None:
    trajectory = run_episode(
        bug_task,
        ScriptedPolicy([]),
        sandbox,
        key=EpisodeKey("r", 0),
        verifier=lambda task, sb: verdict,
    )
    assert trajectory.status is status and trajectory.reward is None
    assert verdict.detail in (trajectory.error or "") and not trajectory.trainable


def test_failures_of_policy_verifier_and_sandbox_are_statuses(
    bug_task: Task, sandbox: Sandbox
) -> None:
    key = EpisodeKey("r", 0)
    failed = run_episode(bug_task, FailingPolicy(1), sandbox, key=key, verifier=fixed_file_verifier)
    assert failed.status is EpisodeStatus.POLICY_ERROR and len(failed.steps) == 1
    assert "endpoint unreachable" in (failed.error or "") and failed.reward is None

    def crashing(task: Task, sb: Sandbox) -> Verdict:
        raise RuntimeError("verifier bug")

    crashed = run_episode(bug_task, ScriptedPolicy([]), sandbox, key=key, verifier=crashing)
    assert crashed.status is EpisodeStatus.VERIFIER_ERROR and "verifier bug" in (
        crashed.error or ""
    )

    sandbox.close()
    broken = run_episode(
        bug_task, ScriptedPolicy([]), sandbox, key=key, verifier=fixed_file_verifier
    )
    assert broken.status is EpisodeStatus.INFRA_ERROR and broken.steps == ()


def test_scorer_policy_episodes_feed_a_grpo_update(bug_task: Task, sandbox: Sandbox) -> None:
    policy = CandidateScorerPolicy(seed=0)
    config = EpisodeConfig(max_steps=6)
    batch = [
        run_episode(
            bug_task,
            policy,
            sandbox,
            key=EpisodeKey("r", 0, sample_index=i),
            config=config,
            verifier=fixed_file_verifier,
        )
        for i in range(4)
    ]
    for trajectory in batch:
        assert trajectory.status is EpisodeStatus.OK
        assert trajectory.policy_version == policy.version
        for step in trajectory.steps:
            assert isinstance(step.record, ScorerRecord) and step.logprob is not None
            assert step.logprob <= 0.0
    # same key, same seed: the same episode
    again = run_episode(
        bug_task,
        policy,
        sandbox,
        key=EpisodeKey("r", 0, sample_index=0),
        config=config,
        verifier=fixed_file_verifier,
    )
    assert [s.action for s in again.steps] == [s.action for s in batch[0].steps]

    metrics = GRPOTrainer(policy).update(batch)
    assert metrics.groups.groups_total == 1
    assert metrics.groups.groups_used + metrics.groups.groups_zero_variance == 1
