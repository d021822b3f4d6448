"""The train flow with a language-model policy (`hf:DIR`) end to end: Prefect, a Dask
LocalCluster, bwrap sandboxes, the verifier, the store, the gate and the LM trainer."""

from __future__ import annotations

from pathlib import Path

import pytest

from flows.train import run_training
from flows.train_settings import TrainSettings
from storage import TrajectoryStore
from tasks_lib.sources.families.settings import generate_settings_tasks
from training.lm.conversation import ChatSampling
from training.lm.tiny import TinyModelSize, build_tiny_model


@pytest.mark.slow  # a Prefect server, two Dask workers, 4 generated episodes verified: minutes
def test_an_hf_policy_trains_through_the_flow(tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    generate_settings_tasks(tasks, 2, seed=5)
    size = TinyModelSize(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    model = build_tiny_model(tmp_path / "model", seed=0, size=size)
    settings = TrainSettings(
        tasks_dir=str(tasks),
        store=str(tmp_path / "store"),
        run_id="lm",
        policy=f"hf:{model}",
        sampling=ChatSampling(max_tokens=24),
        iterations=1,
        tasks_per_iteration=2,
        group_size=2,
        shards_per_iteration=2,
        max_steps=2,
    )
    (summary,) = run_training(settings, workers=2)
    assert summary.episodes == 4
    store = TrajectoryStore(tmp_path / "store")
    episodes = store.query(
        "SELECT policy_kind, policy_version FROM episodes WHERE run_id = 'lm'"
    ).to_pylist()
    assert {(e["policy_kind"], e["policy_version"]) for e in episodes} == {
        ("hf", f"hf:model@{_digest(model)}")
    }
    steps = store.query(
        "SELECT count(*) AS n FROM steps WHERE prompt_token_ids IS NOT NULL"
    ).to_pylist()
    assert steps[0]["n"] >= 4  # every episode's turns stored token in / token out
    (checkpoint,) = store.checkpoints.recorded("lm")
    assert checkpoint.metadata["trainer"] == "lm"
    names = {
        row["name"]
        for row in store.query("SELECT DISTINCT name FROM metrics WHERE run_id = 'lm'").to_pylist()
    }
    assert {"sampled_tokens_per_s", "rollout_wall_s", "update_s", "sampled_tokens"} <= names


def _digest(model: Path) -> str:
    from training.lm.hf_policy import weights_digest

    return weights_digest(model)[:12]
