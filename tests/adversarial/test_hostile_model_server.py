"""A hostile OpenAI-compatible server driven through the real flows (`rollyard evaluate`,
`train`): Prefect, Dask, bwrap sandboxes, the verifier and the Delta store all real. One
evaluation run covers every hostile mode, one episode each: no shard fails, every episode lands
once with the status its mode deserves, nothing non-finite reaches the store or an export, the
trickle ends at the request deadline and is replayed. The rollout process's peak RSS with a
50 MB reply is measured against a normal one in a process of its own."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from flows.cli import main
from rollyard.status import TRAINABLE_STATUSES
from storage import TrajectoryStore
from tasks_lib import generate_demo_tasks
from tests.adversarial.hostile_chat_server import (
    FORMAT_MODES,
    INFRA_CAUSES,
    INFRA_MODES,
    SCORED_MODES,
    HostileChatServer,
)
from training.export import export_store
from training.lm.conversation import REPLY_MAX_BYTES
from training.lm.tokens import LOGPROB_MIN, TOKEN_ID_MAX

REPO_ROOT = Path(__file__).resolve().parents[2]
ALL_MODES = (*SCORED_MODES, *FORMAT_MODES, *INFRA_MODES)
DEADLINE_S = 2.0
GATE_ENV = {
    # A hostile run is mostly failures by design; the gate's verdict is not what is tested.
    "ROLLYARD_GATE_MAX_ZERO_VARIANCE_GROUP_SHARE": "1.0",
    "ROLLYARD_GATE_MAX_INFRA_ERROR_RATE": "1.0",
}


@pytest.fixture
def hostile(request: pytest.FixtureRequest) -> Iterator[HostileChatServer]:
    server = HostileChatServer(request.param)
    yield server
    server.close()


def episode_modes(store: TrajectoryStore, run_id: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Each stored episode's mode: from its calls' ids (scored modes) or its error (infra)."""
    episodes = store.query(
        "SELECT episode_id, status, reward, error FROM episodes WHERE run_id = ?", [run_id]
    ).to_pylist()
    calls = store.query(
        "SELECT episode_id, tool_call_id FROM steps WHERE run_id = ? AND tool_call_id IS NOT NULL",
        [run_id],
    ).to_pylist()
    named = {
        c["episode_id"]: c["tool_call_id"].rsplit("-", 1)[0]
        for c in calls
        if c["tool_call_id"].rsplit("-", 1)[0] in ALL_MODES
    }
    found = {}
    for episode in episodes:
        mode = named.get(episode["episode_id"])
        if mode is None:
            error = episode["error"] or ""
            mode = next((m for m, cause in INFRA_CAUSES.items() if cause in error), "?")
        assert mode not in {m for m, _ in found.values()}, f"mode {mode} landed twice"
        found[episode["episode_id"]] = (mode, episode)
    return found


def check_nothing_non_finite(store: TrajectoryStore, run_id: str) -> None:
    steps = store.query(
        "SELECT prompt_token_ids, token_ids, logprobs, reply_message, action_text "
        "FROM steps WHERE run_id = ?",
        [run_id],
    ).to_pylist()
    assert steps
    for step in steps:
        for token in (step["prompt_token_ids"] or []) + (step["token_ids"] or []):
            assert 0 <= token <= TOKEN_ID_MAX
        for logprob in step["logprobs"] or []:
            assert math.isfinite(logprob) and LOGPROB_MIN <= logprob <= 0.0
        assert len((step["reply_message"] or "").encode()) <= REPLY_MAX_BYTES + 4096
        assert len(step["action_text"].encode()) <= REPLY_MAX_BYTES + 4096


@pytest.mark.slow  # a dozen bwrap episodes verified through Prefect and Dask: about a minute
@pytest.mark.timeout(420)
@pytest.mark.parametrize("hostile", [ALL_MODES], indirect=True)
def test_every_hostile_mode_through_evaluate_lands_once_with_its_status(
    hostile: HostileChatServer,
    dask_address: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name, value in GATE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ROLLYARD_OPENAI_REQUEST_DEADLINE_S", str(DEADLINE_S))
    generate_demo_tasks(tmp_path / "tasks", len(ALL_MODES), seed=11)
    store_dir = tmp_path / "store"
    argv = [
        "evaluate", "--tasks", str(tmp_path / "tasks"), "--store", str(store_dir),
        "--policy", hostile.spec, "--samples", "1", "--run-id", "hostile",
        "--max-steps", "8", "--shards", "2", "--max-attempts", "2",
        "--max-concurrent-requests", "6", "--dask-address", dask_address,
    ]  # fmt: skip
    started = time.monotonic()
    assert main(argv) == 0, capsys.readouterr().err
    elapsed_s = time.monotonic() - started
    store = TrajectoryStore(store_dir)

    found = episode_modes(store, "hostile")
    assert sorted(mode for mode, _ in found.values()) == sorted(ALL_MODES)  # each once
    for mode, episode in found.values():
        if mode in SCORED_MODES:
            assert episode["status"] == "ok" and episode["reward"] is not None, (mode, episode)
        elif mode in FORMAT_MODES:
            assert episode["status"] == "format_error" and episode["reward"] is not None
        else:
            assert episode["status"] == "infra_error" and episode["reward"] is None, episode
        assert (episode["status"] in TRAINABLE_STATUSES) == (mode not in INFRA_MODES)
    # the infra modes were run again (recovery), the trickle each time ending at the deadline
    assert all(hostile.requests[mode] >= 2 for mode in INFRA_MODES), hostile.requests
    assert elapsed_s < 300, elapsed_s
    check_nothing_non_finite(store, "hostile")

    # what an agent wrote came back as observations, and no tool it was not offered ran
    seen = store.query(
        "SELECT observation, action_text FROM steps WHERE run_id = 'hostile'"
    ).to_pylist()
    text = "\n".join(f"{row['observation']}\n{row['action_text']}" for row in seen)
    for expected in ("NUL byte", "not valid Unicode", "unknown tool 'try_edit'", "bytes cut"):
        assert expected in text, expected  # the 50 MB reply is kept cut, with its marker

    exported = export_store(store, tmp_path / "verl", export_format="verl", include_masked=True)
    rows = pq.read_table(exported.path).to_pylist()
    assert rows
    for value in _numbers(rows):
        assert math.isfinite(value)


def _numbers(value: Any) -> Iterator[float]:
    """Every float anywhere in exported rows."""
    if isinstance(value, float):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _numbers(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _numbers(item)


_MEASURE = textwrap.dedent(
    """
    import json, resource, sys
    from sandboxes import open_sandbox
    from tasks_lib import load_task
    from training.episode import EpisodeConfig, run_episode
    from training.lm.openai_policy import ClientSettings, OpenAIPolicy
    from training.trajectory import EpisodeKey

    task = load_task(sys.argv[2])
    policy = OpenAIPolicy(
        sys.argv[1], "hostile-model", client=ClientSettings(request_deadline_s=60)
    )
    with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
        trajectory = run_episode(
            task, policy, sandbox, key=EpisodeKey("rss", 0), config=EpisodeConfig(max_steps=6)
        )
    kept = sum(len(s.reply_message or "") + len(str(s.action)) for s in trajectory.steps)
    print(json.dumps({
        "status": str(trajectory.status), "kept_bytes": kept,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }))
    """
)


def _rollout_peak(mode: str, task_dir: Path) -> dict[str, Any]:
    server = HostileChatServer((mode,))
    try:
        done = subprocess.run(
            [sys.executable, "-c", _MEASURE, server.base_url, str(task_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            cwd=REPO_ROOT,
            env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
            check=False,
        )
    finally:
        server.close()
    assert done.returncode == 0, done.stderr[-2000:]
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.slow  # two rollout processes with their imports and a verified episode each
@pytest.mark.timeout(300)
def test_a_50_mb_reply_keeps_the_rollout_process_memory_bounded(
    tmp_path: Path, needs_sandbox_host: None
) -> None:
    (task_dir,) = generate_demo_tasks(tmp_path / "tasks", 1, seed=11)
    normal = _rollout_peak("normal", task_dir)
    huge = _rollout_peak("huge_reply", task_dir)
    print(f"rollout peak RSS: normal reply {normal}, 50 MB reply {huge}")
    assert normal["status"] == huge["status"] == "ok"
    assert (
        huge["kept_bytes"] <= 3 * REPLY_MAX_BYTES
    )  # the reply, and its content as the step's action
    # The 50 MB answer passes through the client once (body, then decoded text): a few times its
    # size at the peak, not growing with the turns that follow.
    assert huge["peak_rss_mb"] - normal["peak_rss_mb"] < 250, (normal, huge)


@pytest.mark.slow  # a LoRA update of a tiny model after four bwrap episodes through the flow
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "hostile", [("nul", "huge_reply", "nan_logprobs", "malformed")], indirect=True
)
def test_hostile_answers_through_train_are_scored_or_replayed_never_trained_on_as_ok(
    hostile: HostileChatServer,
    dask_address: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from flows.train import run_training
    from flows.train_settings import TrainSettings
    from training.lm.conversation import ChatSampling
    from training.lm.tiny import TinyModelSize, build_tiny_model

    for name, value in GATE_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("ROLLYARD_OPENAI_REQUEST_DEADLINE_S", str(DEADLINE_S))
    generate_demo_tasks(tmp_path / "tasks", 4, seed=11)
    size = TinyModelSize(
        hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    model = build_tiny_model(tmp_path / "model", seed=0, size=size)
    settings = TrainSettings(
        tasks_dir=str(tmp_path / "tasks"),
        store=str(tmp_path / "store"),
        run_id="hostile-train",
        policy=hostile.spec,
        trainer_model=str(model),
        sampling=ChatSampling(max_tokens=24),
        iterations=1,
        tasks_per_iteration=4,
        group_size=1,
        shards_per_iteration=2,
        max_steps=6,
        max_attempts=2,
        schedule="round_robin",
    )
    (summary,) = run_training(settings, dask_address=dask_address)
    assert summary.episodes == 4
    store = TrajectoryStore(tmp_path / "store")
    found = episode_modes(store, "hostile-train")
    statuses = {mode: episode["status"] for mode, episode in found.values()}
    assert statuses == {
        "nul": "ok", "huge_reply": "ok", "nan_logprobs": "infra_error", "malformed": "format_error",
    }  # fmt: skip
    check_nothing_non_finite(store, "hostile-train")
    (checkpoint,) = store.checkpoints.recorded("hostile-train")
    assert checkpoint.metadata["trainer"] == "lm"
