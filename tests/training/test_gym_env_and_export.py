"""The Gymnasium environment (through Gymnasium's own checker) and the export for external
trainers."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from gymnasium.utils.env_checker import check_env

from rollyard.status import EpisodeStatus
from sandboxes import Sandbox
from tasks_lib.format.model import Task
from training.actions import EditFile, RunCommand, Submit, action_to_json
from training.episode import EpisodeConfig, VerdictFlag
from training.errors import EnvLifecycleError
from training.export import EXPORT_SCHEMA, export_batch, tool_call_arguments
from training.gym_env import RollyardEnv
from training.policy import ChatRecord
from training.trajectory import Step, Trajectory

FIX = EditFile(
    "calc.py",
    "    if value >= high:\n        return value",
    "    if value > high:\n        return high",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Verdict:
    """A verdict of the shape `training.episode.Verdict` reads."""

    reward: float
    status: str = "ok"
    detail: str = ""
    partial_credit: float | None = None
    tests: Mapping[str, str] = dataclasses.field(default_factory=dict)
    flags: tuple[VerdictFlag, ...] = ()


def quick_verifier(task: Task, sandbox: Sandbox) -> Verdict:
    return Verdict(1.0 if b"value > high" in sandbox.read_file("calc.py") else 0.0)


def test_env_passes_gymnasium_env_checker(bug_task: Task) -> None:
    env = RollyardEnv(bug_task, config=EpisodeConfig(max_steps=4), verifier=quick_verifier)
    try:
        check_env(env, skip_render_check=True)
    finally:
        env.close()
    env.close()  # twice is fine


def test_env_episode_with_text_actions(bug_task: Task) -> None:
    env = RollyardEnv(bug_task, config=EpisodeConfig(max_steps=4), verifier=quick_verifier)
    with pytest.raises(EnvLifecycleError, match="before reset"):
        env.step(action_to_json(Submit()))
    observation, info = env.reset(seed=0)
    assert "clamp" in observation and info["step"] == 0

    observation, reward, terminated, truncated, info = env.step("not json")
    assert observation.startswith("invalid action") and reward == 0.0 and not terminated

    observation, reward, terminated, truncated, info = env.step(
        action_to_json(RunCommand("cat calc.py"))
    )
    assert "def clamp" in observation and info["exit_code"] == 0

    env.step(action_to_json(FIX))
    observation, reward, terminated, truncated, info = env.step(action_to_json(Submit()))
    assert terminated and not truncated and reward == 1.0 and info["status"] == "ok"
    with pytest.raises(EnvLifecycleError, match="call reset"):
        env.step(action_to_json(Submit()))

    env.reset()
    for _ in range(3):
        _, reward, terminated, truncated, _ = env.step(action_to_json(RunCommand("true")))
    _, reward, terminated, truncated, _ = env.step(action_to_json(RunCommand("true")))
    assert truncated and not terminated and reward == 0.0  # reset undid the fix
    env.close()
    with pytest.raises(EnvLifecycleError, match="closed"):
        env.reset()


def _trajectory(
    sample: int, reward: float | None, status: EpisodeStatus = EpisodeStatus.OK
) -> Trajectory:
    from training.actions import Observation
    from training.trajectory import EpisodeKey

    key = EpisodeKey("run", 2, group_index=0, sample_index=sample)
    record = ChatRecord("served", (1, 2), (5, 6), (-0.1, -0.2))
    steps = (
        Step(
            0,
            RunCommand("pytest -q"),
            Observation("1 failed", 1),
            0.5,
            0.1,
            logprob=-0.3,
            record=record,
        ),
        Step(1, FIX, Observation("edited calc.py", 0), 0.01, 0.1, logprob=-0.2, record=record),
    )
    return Trajectory(
        episode_id=key.episode_id("calc"),
        group_id=key.group_id("calc"),
        key=key,
        task_id="calc",
        task_version="1",
        instruction="Fix calc.py",
        snapshot_digest="sha256:x",
        sandbox_backend="bwrap",
        policy_version="chat:served",
        status=status,
        steps=steps,
        terminated=True,
        truncated=False,
        reward=reward,
        partial_credit=reward,
        passed=reward == 1.0,
    )


def test_export_is_a_datasets_ready_parquet(tmp_path: Path) -> None:
    batch = [_trajectory(0, 1.0), _trajectory(1, 0.0), _trajectory(2, 0.0)]
    path = export_batch(batch, tmp_path / "out" / "batch.parquet")
    table = pq.read_table(path)
    assert table.schema.equals(EXPORT_SCHEMA, check_metadata=False)
    rows = table.to_pylist()
    assert [round(r["advantage"], 3) for r in rows] == [1.414, -0.707, -0.707]
    messages = rows[0]["messages"]
    assert [m["role"] for m in messages] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert tool_call_arguments(messages[4]) == [
        {"path": "calc.py", "old_text": FIX.old_text, "new_text": FIX.new_text}
    ]
    assert messages[3]["content"] == "1 failed"
    assert rows[0]["completion_token_ids"] == [[5, 6], [5, 6]]
    # no trials here: every action trains with its episode's advantage
    assert all(r["step_advantages"] == [r["advantage"]] * 2 for r in rows)

    # masked trajectories (an infra failure masks the whole group) only with include_masked
    failed = [*batch, _trajectory(3, None, EpisodeStatus.INFRA_ERROR)]
    assert pq.read_table(export_batch(failed, tmp_path / "masked.parquet")).num_rows == 0
    kept = pq.read_table(export_batch(failed, tmp_path / "all.parquet", include_masked=True))
    assert kept.num_rows == 4 and kept.column("advantage").null_count == 4
    assert not list(tmp_path.glob("**/.*.partial"))


def test_export_carries_per_action_trial_credit(tmp_path: Path) -> None:
    from test_grpo import _trial, make_trajectory

    # Both samples fail (zero variance, no episode advantage), but one's trial was kept: its
    # actions still carry a signal, and the export says which.
    batch = [
        make_trajectory(0, 0, 0.0, steps=(_trial(0, kept=True), _trial(1, kept=False))),
        make_trajectory(0, 1, 0.0, steps=(_trial(0, kept=False),)),
    ]
    rows = pq.read_table(export_batch(batch, tmp_path / "trials.parquet")).to_pylist()
    assert [r["advantage"] for r in rows] == [None, None]
    credit = 1.0 - 1.0 / 3.0  # kept, against the mean of the group's three trials
    assert rows[0]["step_advantages"] == pytest.approx([credit, -1.0 / 3.0])
    assert rows[1]["step_advantages"] == pytest.approx([-1.0 / 3.0])
