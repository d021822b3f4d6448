"""A shard of chat episodes with many in flight against one endpoint: the server sees them
together, the sandboxes stay bounded, and the shard commits once with what acted."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from scripted_chat_server import ScriptedChatServer, completion, tool_call

from sandboxes import Limits, SandboxPool
from storage import TrajectoryStore
from tasks_lib import generate_demo_tasks
from training.lm.openai_policy import ClientSettings, OpenAIPolicy
from training.rollout import commit_shard, plan_iteration, run_shard
from training.trajectory import EpisodeStatus


@pytest.fixture
def server() -> Iterator[ScriptedChatServer]:
    scripted = ScriptedChatServer()
    yield scripted
    scripted.close()


@pytest.mark.slow  # three verifications of a demo task: ~25 s on two busy cores
def test_episodes_in_flight_share_the_endpoint(server: ScriptedChatServer, tmp_path: Path) -> None:
    task_dirs = generate_demo_tasks(tmp_path / "tasks", 1, seed=5)
    for _ in range(3):
        server.answer(completion(tool_call("a", "submit", {})), delay_s=0.5)
    policy = OpenAIPolicy(server.base_url, "served-model", client=ClientSettings(timeout_s=10))
    (request,) = plan_iteration(
        task_dirs,
        run_id="chat",
        iteration=0,
        policy=policy,
        tasks_per_iteration=1,
        group_size=3,
        shard_count=1,
        max_concurrent_requests=3,
    )
    pool = SandboxPool(limits=Limits(), max_idle_per_snapshot=2)
    try:
        trajectories = run_shard(request, pool=pool)
    finally:
        pool.close()
    assert [t.key for t in trajectories] == [e.key for e in request.episodes]
    assert all(t.status is EpisodeStatus.OK for t in trajectories)
    assert server.max_in_flight == 3  # the three requests reached the server together
    # Each episode's seed is its own, even with one policy shared by three threads.
    assert len({r["seed"] for r in server.requests}) == 3
    store = TrajectoryStore(tmp_path / "store")
    assert commit_shard(store, request, trajectories).committed
    kinds = store.query("SELECT DISTINCT policy_kind, policy_version FROM episodes").to_pylist()
    assert kinds == [{"policy_kind": "openai", "policy_version": "openai:served-model"}]
