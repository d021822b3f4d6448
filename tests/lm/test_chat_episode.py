"""Chat episodes in a real bwrap sandbox on a demo task, against a scripted server over HTTP:
parallel tool calls, the format-error rule, the context rule, a server that dies mid-run, and
what the store keeps of each turn."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_chat_server import ScriptedChatServer, completion, tool_call

from rollyard.status import is_trainable
from sandboxes import Limits, Sandbox, SandboxPool, open_sandbox
from storage import TrajectoryStore
from tasks_lib import Task, generate_demo_tasks, load_task
from training.actions import InvalidCall, ReadFile, RunCommand, Submit
from training.episode import EpisodeConfig, run_episode
from training.lm.openai_policy import ClientSettings, OpenAIPolicy
from training.lm.tokens import stored_turns, trajectory_turns
from training.recovery import RecoveryPolicy, run_episode_with_recovery
from training.trajectory import EpisodeKey, EpisodeStatus


@pytest.fixture(scope="module")
def demo_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    (task_dir,) = generate_demo_tasks(tmp_path_factory.mktemp("tasks"), 1, seed=3)
    return load_task(task_dir)


@pytest.fixture
def sandbox(demo_task: Task) -> Iterator[Sandbox]:
    with open_sandbox(demo_task.snapshot_dir, limits=demo_task.limits) as opened:
        yield opened


@pytest.fixture
def server() -> Iterator[ScriptedChatServer]:
    scripted = ScriptedChatServer()
    yield scripted
    scripted.close()


def make_policy(server: ScriptedChatServer, **client: object) -> OpenAIPolicy:
    settings = {"retry_backoff_s": 0.01, "timeout_s": 10.0, "max_retries": 1} | client
    return OpenAIPolicy(server.base_url, "served-model", client=ClientSettings(**settings))  # type: ignore[arg-type]


def first_module(task: Task) -> str:
    return next(
        str(p.relative_to(task.snapshot_dir))
        for p in sorted(task.snapshot_dir.rglob("*.py"))
        if "test" not in p.name
    )


def test_every_call_runs_in_order_and_each_turn_is_stored_token_in_token_out(
    demo_task: Task, sandbox: Sandbox, server: ScriptedChatServer, tmp_path: Path
) -> None:
    module = first_module(demo_task)
    server.answer(
        completion(
            tool_call("a", "run_command", {"command": "echo first"}),
            tool_call("b", "read_file", {"path": module}),
            prompt_ids=(1, 2),
            completion_ids=(10, 11, 12),
        )
    )
    server.answer(
        completion(content="Hmm.", prompt_ids=(1, 2, 10, 11, 12, 3), completion_ids=(13,))
    )
    server.answer(completion(tool_call("c", "submit", {}), prompt_ids=(1, 2, 10, 11, 12, 3, 13, 4)))
    trajectory = run_episode(demo_task, make_policy(server), sandbox, key=EpisodeKey("chat", 0))
    assert trajectory.status is EpisodeStatus.OK and trajectory.reward is not None
    actions = [step.action for step in trajectory.steps]
    assert actions[:2] == [RunCommand("echo first"), ReadFile(module)]
    assert isinstance(actions[2], InvalidCall) and actions[3] == Submit()
    assert [step.turn for step in trajectory.steps] == [0, 0, 1, 2]
    assert trajectory.steps[0].observation.text.startswith("first")
    # The second prompt answers both calls under their ids; the third answers the reply
    # without a tool call with a user message.
    second = server.requests[1]["messages"]
    assert [(m["role"], m.get("tool_call_id")) for m in second[-3:]] == [
        ("assistant", None),
        ("tool", "a"),
        ("tool", "b"),
    ]
    third = server.requests[2]["messages"]
    assert third[-2]["content"] == "Hmm." and third[-1]["role"] == "user"
    assert trajectory.policy is not None and trajectory.policy.kind == "openai"

    store = TrajectoryStore(tmp_path / "store")
    store.commit_iteration_shard(
        "chat",
        0,
        0,
        episodes=[trajectory.to_episode_record()],
        steps=trajectory.to_step_records(),
    )
    episode = store.query("SELECT policy_kind, policy_model, sampling FROM episodes").to_pylist()
    assert episode[0]["policy_kind"] == "openai" and episode[0]["policy_model"] == "served-model"
    assert json.loads(episode[0]["sampling"])["top_p"] == 1.0
    rows = store.query(
        "SELECT step, turn, tool_call_id, prompt_token_ids, token_ids, logprobs, reply_message "
        "FROM steps ORDER BY step"
    ).to_pylist()
    assert stored_turns(rows) == trajectory_turns(trajectory)
    assert [len(t.prompt_token_ids) for t in stored_turns(rows)] == [2, 6, 8]
    assert [r["tool_call_id"] for r in rows] == ["a", "b", None, "c"]
    assert rows[0]["prompt_token_ids"] == [1, 2] and rows[0]["token_ids"] == [10, 11, 12]
    assert rows[0]["logprobs"] == [-0.25, -0.25, -0.25]
    assert rows[1]["token_ids"] is None  # the turn's tokens go on its first row only
    assert rows[2]["token_ids"] == [13] and rows[3]["prompt_token_ids"][-1] == 4
    assert json.loads(rows[0]["reply_message"])["tool_calls"][1]["id"] == "b"


def test_replies_without_tool_calls_end_the_episode_past_the_budget(
    demo_task: Task, sandbox: Sandbox, server: ScriptedChatServer
) -> None:
    for _ in range(3):
        server.answer(completion(content="I will not call tools."))
    trajectory = run_episode(
        demo_task,
        make_policy(server),
        sandbox,
        key=EpisodeKey("chat", 0),
        config=EpisodeConfig(max_format_errors=2),
    )
    assert trajectory.status is EpisodeStatus.FORMAT_ERROR
    assert len(trajectory.steps) == 3 and not trajectory.terminated
    assert trajectory.reward is not None and is_trainable(trajectory.status)  # still verified
    assert "the budget is 2" in (trajectory.error or "")


def test_a_conversation_that_outgrows_the_context_ends_with_its_own_status(
    demo_task: Task, sandbox: Sandbox, server: ScriptedChatServer
) -> None:
    server.answer(
        completion(
            tool_call("a", "run_command", {"command": "seq 1 3000"}),
            prompt_ids=tuple(range(900)),
        )
    )
    trajectory = run_episode(
        demo_task,
        make_policy(server, context_tokens=1200),
        sandbox,
        key=EpisodeKey("chat", 0),
        config=EpisodeConfig(observation_max_bytes=4000),
    )
    assert trajectory.status is EpisodeStatus.CONTEXT_EXHAUSTED
    assert trajectory.steps[0].observation.truncated
    assert "bytes cut" in trajectory.steps[0].observation.text
    assert trajectory.reward is not None and len(server.requests) == 1


def test_a_server_that_dies_mid_run_is_an_infra_failure_the_recovery_replays(
    demo_task: Task, server: ScriptedChatServer
) -> None:
    server.answer(completion(tool_call("a", "run_command", {"command": "echo one"})))
    server.answer({"error": {"message": "engine dead"}}, status=503)
    server.answer({"error": {"message": "engine dead"}}, status=503)
    # After the restart: the recorded first turn is replayed, not asked again.
    server.answer(completion(tool_call("b", "submit", {})))
    policy = make_policy(server, max_retries=1)
    pool = SandboxPool(limits=Limits())
    try:
        first = run_episode(
            demo_task, policy, pool.take(demo_task.snapshot_dir), key=EpisodeKey("chat", 0)
        )
    finally:
        pool.close()
    assert first.status is EpisodeStatus.INFRA_ERROR and first.reward is None
    assert "engine dead" in (first.error or "")

    server.script.clear()
    server.requests.clear()
    server.answer(completion(tool_call("a", "run_command", {"command": "echo one"})))
    server.answer({"error": {"message": "engine dead"}}, status=503)
    server.answer({"error": {"message": "engine dead"}}, status=503)
    server.answer(completion(tool_call("b", "submit", {})))
    pool = SandboxPool(limits=Limits())
    try:
        recovered = run_episode_with_recovery(
            demo_task,
            policy,
            pool,
            key=EpisodeKey("chat", 0),
            config=EpisodeConfig(),
            recovery=RecoveryPolicy(max_attempts=2),
        )
    finally:
        pool.close()
    assert recovered.status is EpisodeStatus.OK and recovered.key.attempt == 1
    assert [s.action for s in recovered.steps] == [RunCommand("echo one"), Submit()]
    assert len(server.requests) == 4  # 1 answered, 2 failed, 1 after the replayed turn
