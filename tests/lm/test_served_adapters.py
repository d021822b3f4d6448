"""Weight sync to a served policy: after an update the trainer loads its LoRA adapter into the
OpenAI-compatible server through vLLM's `/v1/load_lora_adapter`, and the policy's requests name
it; the server's adapter endpoints answer as vLLM's do."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from tests.lm.conftest import LmServer
from tests.lm.sampled_episodes import batch_of
from training.actions import History
from training.lm.generate import LocalGenerator
from training.lm.grpo_config import LMTrainerConfig, LoraSettings
from training.lm.openai_policy import OpenAIPolicy
from training.lm.trainer import LMTrainer
from training.lm.weights import ServedAdapters
from training.policy import ChatRecord


@pytest.mark.slow  # a LoRA update, a merge in the server and a served episode: minutes on 2 cores
def test_each_update_loads_its_adapter_and_requests_name_it(
    lm_server: LmServer, tmp_path: Path
) -> None:
    trainer = LMTrainer.from_model_dir(
        lm_server.model_dir,
        weights_dir=tmp_path / "weights",
        config=LMTrainerConfig(learning_rate=1e-3, lora=LoraSettings(rank=4, alpha=8)),
        served=ServedAdapters(lm_server.base_url, lm_server.model),
    )
    before = trainer.policy
    assert isinstance(before, OpenAIPolicy) and before.model == lm_server.model

    generator = LocalGenerator.from_pretrained(lm_server.model_dir)
    trainer.update(batch_of(generator, {0: [1.0, 0.0], 1: [0.0, 1.0]}))
    after = trainer.policy
    assert isinstance(after, OpenAIPolicy)
    assert after.model == trainer.adapter_name and after.version == f"openai:{after.model}"
    listed = httpx.get(f"{lm_server.base_url}/models").json()["data"]
    adapter = next(m for m in listed if m["id"] == after.model)
    assert adapter["parent"] == lm_server.model
    assert adapter["root"] == str(trainer.policy_dir)

    after.seed(3)
    decision = after.act(History("Fix the failing test in calc.py."))
    assert isinstance(decision.record, ChatRecord) and decision.record.completion_token_ids
    assert decision.record.model == after.model
    after.close()

    # Loading the same name again is refused as vLLM refuses it (the trainer treats it as
    # loaded: a resumed run reloads its last adapter); unloading frees the name.
    again = httpx.post(
        f"{lm_server.base_url}/load_lora_adapter",
        json={"lora_name": after.model, "lora_path": str(trainer.policy_dir)},
    )
    assert again.status_code == 400 and "already been loaded" in again.json()["error"]["message"]
    trainer.served.load(after.model, trainer.policy_dir)  # type: ignore[union-attr]
    gone = httpx.post(f"{lm_server.base_url}/unload_lora_adapter", json={"lora_name": after.model})
    assert gone.status_code == 200 and "removed successfully" in gone.text
    missing = httpx.post(
        f"{lm_server.base_url}/unload_lora_adapter", json={"lora_name": after.model}
    )
    assert missing.status_code == 404


def test_a_directory_without_an_adapter_is_refused(lm_server: LmServer, tmp_path: Path) -> None:
    answer = httpx.post(
        f"{lm_server.base_url}/load_lora_adapter",
        json={"lora_name": "nothing", "lora_path": str(tmp_path)},
    )
    assert answer.status_code == 400 and "adapter_config.json" in answer.json()["error"]["message"]


def test_a_served_trainer_needs_lora(lm_server: LmServer, tmp_path: Path) -> None:
    from training.errors import TrainingSettingsError

    with pytest.raises(TrainingSettingsError, match="LoRA"):
        LMTrainer.from_model_dir(
            lm_server.model_dir,
            weights_dir=tmp_path,
            served=ServedAdapters(lm_server.base_url, lm_server.model),
        )
