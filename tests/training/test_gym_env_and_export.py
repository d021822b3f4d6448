"""The Gymnasium environment (through Gymnasium's own checker), trajectories read back from a real
store, and the export from the store for external trainers."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from gymnasium.utils.env_checker import check_env

from rollyard.errors import RollyardError
from rollyard.status import INFRASTRUCTURE_STATUSES, EpisodeStatus
from sandboxes import Sandbox
from storage import TrajectoryStore
from tasks_lib.format.model import Task
from training.actions import TOOL_NAMES, EditFile, RunCommand, Submit, action_to_json
from training.episode import EpisodeConfig, VerdictFlag
from training.errors import EnvInfrastructureError, EnvLifecycleError, TrainingSettingsError
from training.export import DATA_FILE, HF_SCHEMA, TRL_SCHEMA, export_store
from training.gym_env import RollyardEnv, make_task_env
from training.policy import ChatRecord
from training.stored import IterationRange, read_trajectories
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
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)


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


def _stored(tmp_path: Path, trajectories: list[Trajectory], *, iteration: int = 2) -> Any:
    """A real store holding `trajectories`, committed as one shard of (run, iteration)."""
    store = TrajectoryStore(tmp_path / "store")
    store.commit_iteration_shard(
        "run",
        iteration,
        0,
        episodes=[t.to_episode_record() for t in trajectories],
        steps=[row for t in trajectories for row in t.to_step_records()],
    )
    return store


def test_trajectories_read_back_from_the_store_equal_what_was_committed(tmp_path: Path) -> None:
    batch = [
        _trajectory(0, 1.0),
        _trajectory(1, 0.0),
        _trajectory(2, None, EpisodeStatus.INFRA_ERROR),
    ]
    stored = read_trajectories(_stored(tmp_path, batch))
    assert [t.episode_id for t in stored] == [t.episode_id for t in batch]
    for before, after in zip(batch, stored, strict=True):
        assert after.history() == before.history()
        assert (after.status, after.reward, after.passed, after.group_id) == (
            before.status,
            before.reward,
            before.passed,
            before.group_id,
        )
        for stored_step, step in zip(after.steps, before.steps, strict=True):
            assert isinstance(stored_step.record, ChatRecord)
            assert isinstance(step.record, ChatRecord)
            assert stored_step.record.prompt_token_ids == step.record.prompt_token_ids
            assert stored_step.record.completion_token_ids == step.record.completion_token_ids
            # the store keeps logprobs as float32
            assert stored_step.record.completion_logprobs == pytest.approx(
                step.record.completion_logprobs, abs=1e-6
            )
    assert IterationRange.parse("2:3") == IterationRange(2, 3) == IterationRange.parse("2")
    assert read_trajectories(_stored(tmp_path, batch), iterations=IterationRange(3, None)) == []
    with pytest.raises(TrainingSettingsError, match="A:B"):
        IterationRange.parse("two:3")


def test_export_from_the_store_loads_with_datasets(tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    store = _stored(tmp_path, [_trajectory(0, 1.0), _trajectory(1, 0.0), _trajectory(2, 0.0)])
    result = export_store(store, tmp_path / "hf", export_format="hf", run_id="run")
    assert result.rows == 3 and result.path == tmp_path / "hf" / DATA_FILE
    table = pq.read_table(result.path)
    assert table.schema.equals(HF_SCHEMA, check_metadata=False)
    dataset = datasets.load_dataset("parquet", data_files=str(result.path), split="train")
    rows = list(dataset)
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
    assert messages[1]["content"] == "Fix calc.py"
    assert json.loads(messages[4]["tool_calls"][0]["function"]["arguments"]) == {
        "path": "calc.py",
        "old_text": FIX.old_text,
        "new_text": FIX.new_text,
    }
    assert messages[3]["content"] == "1 failed"
    assert [t["function"]["name"] for t in json.loads(rows[0]["tools"])] == list(TOOL_NAMES)
    # one entry per language-model turn: the ids and logprobs the rollout stored
    assert rows[0]["prompt_token_ids"] == [[1, 2], [1, 2]]
    assert rows[0]["completion_token_ids"] == [[5, 6], [5, 6]]
    assert rows[0]["completion_logprobs"][0] == pytest.approx([-0.1, -0.2], abs=1e-6)
    # no trials here: every action trains with its episode's advantage
    assert all(r["step_advantages"] == [r["advantage"]] * 2 for r in rows)
    with pytest.raises(TrainingSettingsError, match="not an empty directory"):
        export_store(store, tmp_path / "hf")
    with pytest.raises(TrainingSettingsError, match="no committed, non-quarantined"):
        export_store(store, tmp_path / "none", run_id="other")
    assert not (tmp_path / "none").exists() and not list(tmp_path.glob(".*partial*"))


def test_export_leaves_out_masked_groups_unless_asked(tmp_path: Path) -> None:
    # an infra failure masks the whole group
    store = _stored(
        tmp_path,
        [
            _trajectory(0, 1.0),
            _trajectory(1, 0.0),
            _trajectory(2, 0.0),
            _trajectory(3, None, EpisodeStatus.INFRA_ERROR),
        ],
    )
    with pytest.raises(TrainingSettingsError, match="all 4 episodes are in groups the trainer"):
        export_store(store, tmp_path / "masked")
    assert not (tmp_path / "masked").exists()  # no empty file left behind
    kept = pq.read_table(export_store(store, tmp_path / "all", include_masked=True).path)
    assert kept.num_rows == 4 and kept.column("advantage").null_count == 4


def test_trl_and_verl_layouts(tmp_path: Path) -> None:
    store = _stored(tmp_path, [_trajectory(0, 1.0), _trajectory(1, 0.0)])
    trl = pq.read_table(export_store(store, tmp_path / "trl", export_format="trl").path)
    assert trl.schema.equals(TRL_SCHEMA, check_metadata=False)
    row = trl.to_pylist()[0]
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    assert [m["role"] for m in row["completion"]] == ["assistant", "tool", "assistant", "tool"]
    assert row["label"] is True and row["reward"] == 1.0

    verl = pq.read_table(export_store(store, tmp_path / "verl", export_format="verl").path)
    assert verl.column_names == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    first = verl.to_pylist()[0]
    assert first["data_source"] == "rollyard/unknown" and first["ability"] == "agent"
    assert first["reward_model"]["style"] == "rule"
    assert json.loads(first["reward_model"]["ground_truth"]) == {
        "task_id": "calc",
        "task_version": "1",
    }
    assert [m["role"] for m in first["prompt"]] == ["system", "user"]
    info = first["extra_info"]
    assert info["split"] == "train" and info["index"] == 0
    assert info["completion_token_ids"] == [[5, 6], [5, 6]] and len(info["messages"]) == 6


def test_export_carries_per_action_trial_credit(tmp_path: Path) -> None:
    from test_grpo import _trial, make_trajectory

    # Both samples fail (zero variance, no episode advantage), but one's trial was kept: its
    # actions still carry a signal, and the export says which.
    batch = [
        make_trajectory(0, 0, 0.0, steps=(_trial(0, kept=True), _trial(1, kept=False))),
        make_trajectory(0, 1, 0.0, steps=(_trial(0, kept=False),)),
    ]
    store = TrajectoryStore(tmp_path / "store")
    store.commit_iteration_shard(
        "run",
        0,
        0,
        episodes=[t.to_episode_record() for t in batch],
        steps=[row for t in batch for row in t.to_step_records()],
    )
    rows = pq.read_table(export_store(store, tmp_path / "trials").path).to_pylist()
    assert [r["advantage"] for r in rows] == [None, None]
    credit = 1.0 - 1.0 / 3.0  # kept, against the mean of the group's three trials
    assert rows[0]["step_advantages"] == pytest.approx([credit, -1.0 / 3.0])
    assert rows[1]["step_advantages"] == pytest.approx([-1.0 / 3.0])
    assert "try_edit" in [t["function"]["name"] for t in json.loads(rows[0]["tools"])]


# ---- registered with Gymnasium, Unicode text, infrastructure failures ---------------------------


def test_registered_env_runs_a_real_episode_with_the_real_verifier(bug_task_dir: Path) -> None:
    import gymnasium as gym

    import training  # noqa: F401 - importing the package registers the environment

    env = gym.make("rollyard/Task-v0", task_dir=bug_task_dir)
    try:
        observation, _ = env.reset(seed=0)
        assert "clamp" in observation and env.observation_space.contains(observation)
        env.step(action_to_json(FIX))
        _, reward, terminated, _, info = env.step(action_to_json(Submit()))
        assert terminated and reward == 1.0 and info["status"] == "ok"
    finally:
        env.close()


def test_a_directory_that_is_not_a_task_is_refused_by_name(tmp_path: Path) -> None:
    import gymnasium as gym

    import training.gym_env  # noqa: F401

    with pytest.raises(RollyardError, match=r"instruction\.md"):
        gym.make("rollyard/Task-v0", task_dir=tmp_path)


def test_text_spaces_hold_any_unicode_the_task_holds(bug_task_dir: Path) -> None:
    root = bug_task_dir
    instruction = "Réparez `clamp` — 修复 ✓ 🐍\n"
    (root / "instruction.md").write_text(instruction, encoding="utf-8")
    env = make_task_env(root, config=EpisodeConfig(max_steps=4), verifier=quick_verifier)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        observation, _ = env.reset()
        assert observation == instruction and env.observation_space.contains(observation)
        edit = action_to_json(EditFile("calc.py", "def clamp", "# ünïcode ✓\ndef clamp"))
        assert env.action_space.contains(edit)
        observation, *_ = env.step(edit)
        observation, *_ = env.step(action_to_json(RunCommand("head -1 calc.py")))
        assert "# ünïcode ✓" in observation and env.observation_space.contains(observation)
    finally:
        env.close()
    assert not env.observation_space.contains("\ud800")  # a lone surrogate is no text
    assert env.action_space.contains(env.action_space.sample())


@pytest.mark.parametrize(
    "verifier",
    [
        pytest.param(lambda task, sandbox: 1 / 0, id="verifier-raises"),
        pytest.param(
            lambda task, sandbox: Verdict(0.0, status="infra_error", detail="pytest vanished"),
            id="verifier-reports-infra-error",
        ),
    ],
)
def test_a_verifier_failure_is_an_infrastructure_failure_not_reward_0(
    bug_task: Task, verifier: Any
) -> None:
    env = RollyardEnv(bug_task, config=EpisodeConfig(max_steps=4), verifier=verifier)
    try:
        env.reset()
        with pytest.raises(EnvInfrastructureError, match="not a score") as raised:
            env.step(action_to_json(Submit()))
        assert raised.value.status in {str(s) for s in INFRASTRUCTURE_STATUSES}
        assert raised.value.info["status"] == raised.value.status
        env.reset()  # the environment is usable again
    finally:
        env.close()
