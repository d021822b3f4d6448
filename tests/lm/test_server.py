"""rollyard's small OpenAI-compatible server over real HTTP: token ids and logprobs as vLLM
returns them, tool calls with ids, batching of concurrent requests, and 4xx answers with
OpenAI-style error bodies for bad requests."""

from __future__ import annotations

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from transformers import AutoTokenizer

from training.lm.conversation import TOOL_SCHEMAS
from training.lm.tiny import tool_call_transcripts

if TYPE_CHECKING:
    from tests.lm.conftest import LmServer

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Any:
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _conversation(seed: int = 77, cut: int = 2) -> list[dict[str, Any]]:
    return list(tool_call_transcripts(1, seed=seed)[0].messages[:cut])


def _chat(server: LmServer, **fields: Any) -> httpx.Response:
    body = {"model": server.model, "messages": _conversation(), "tools": TOOL_SCHEMAS, **fields}
    return httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=120.0)


def test_models_lists_the_served_model_with_its_context(lm_server: LmServer) -> None:
    answer = httpx.get(f"{lm_server.base_url}/models", timeout=10.0).json()
    assert answer["object"] == "list"
    (model,) = answer["data"]
    assert model["id"] == lm_server.model
    assert model["max_model_len"] == 4096


def test_chat_completion_returns_token_ids_logprobs_and_tool_calls(
    lm_server: LmServer, tokenizer: Any
) -> None:
    response = _chat(
        lm_server,
        temperature=0,
        max_tokens=200,
        logprobs=True,
        top_logprobs=2,
        return_token_ids=True,
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["object"] == "chat.completion"
    assert body["model"] == lm_server.model
    (choice,) = body["choices"]
    prompt_ids, completion_ids = body["prompt_token_ids"], choice["token_ids"]
    assert body["usage"] == {
        "prompt_tokens": len(prompt_ids),
        "completion_tokens": len(completion_ids),
        "total_tokens": len(prompt_ids) + len(completion_ids),
    }
    messages = _conversation()
    rendered_prompt = tokenizer.apply_chat_template(
        messages, tools=TOOL_SCHEMAS, add_generation_prompt=True, tokenize=False
    )
    assert tokenizer.decode(prompt_ids) == rendered_prompt
    # One sampler logprob per completion token, with the alternatives asked for.
    content = choice["logprobs"]["content"]
    assert len(content) == len(completion_ids)
    assert all(item["logprob"] <= 0 and len(item["top_logprobs"]) == 2 for item in content)
    assert "".join(item["token"] for item in content) == tokenizer.decode(completion_ids)
    # The fine-tuned model answers with a tool call; its message carries ids, and rendering
    # the conversation with it gives back exactly the prompt and completion tokens' text.
    assert choice["finish_reason"] == "tool_calls", choice
    message = choice["message"]
    assert message["role"] == "assistant"
    (call,) = message["tool_calls"]
    assert call["id"].startswith("call_") and call["type"] == "function"
    assert call["function"]["name"] in {tool["function"]["name"] for tool in TOOL_SCHEMAS}
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    conversation = tokenizer.apply_chat_template(
        [*messages, message], tools=TOOL_SCHEMAS, tokenize=False
    )
    assert tokenizer.decode(prompt_ids + completion_ids) + "\n" == conversation


def test_token_ids_only_when_asked_and_tokens_as_ids_on_request(lm_server: LmServer) -> None:
    plain = _chat(lm_server, temperature=0, max_tokens=8).json()
    assert plain["prompt_token_ids"] is None
    assert plain["choices"][0]["token_ids"] is None
    assert plain["choices"][0]["logprobs"] is None
    as_ids = _chat(
        lm_server,
        temperature=0,
        max_tokens=8,
        logprobs=True,
        return_tokens_as_token_ids=True,
        return_token_ids=True,
    ).json()
    choice = as_ids["choices"][0]
    assert [item["token"] for item in choice["logprobs"]["content"]] == [
        f"token_id:{token}" for token in choice["token_ids"]
    ]
    assert choice["finish_reason"] == "length"


def test_seeded_requests_are_reproducible_and_n_choices_differ(lm_server: LmServer) -> None:
    fields = {"temperature": 1.5, "max_tokens": 24, "seed": 3, "n": 3, "return_token_ids": True}
    first = _chat(lm_server, **fields).json()
    second = _chat(lm_server, **fields).json()
    first_ids = [choice["token_ids"] for choice in first["choices"]]
    assert first_ids == [choice["token_ids"] for choice in second["choices"]]
    assert [choice["index"] for choice in first["choices"]] == [0, 1, 2]
    assert len({tuple(ids) for ids in first_ids}) > 1


def test_concurrent_requests_share_forward_batches(lm_server: LmServer) -> None:
    stats_url = lm_server.base_url.removesuffix("/v1") + "/stats"
    before = httpx.get(stats_url, timeout=10.0).json()
    alone = {
        seed: _chat(lm_server, max_tokens=16, seed=seed, return_token_ids=True).json()
        for seed in range(2)
    }
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(
            pool.map(
                lambda seed: _chat(lm_server, max_tokens=16, seed=seed % 2, return_token_ids=True),
                range(8),
            )
        )
    after = httpx.get(stats_url, timeout=10.0).json()
    assert all(answer.status_code == 200 for answer in answers)
    for seed, answer in enumerate(answers):
        # Batched with others, a seeded request draws what it draws alone.
        expected = alone[seed % 2]["choices"][0]["token_ids"]
        assert answer.json()["choices"][0]["token_ids"] == expected
    assert after["generations"] - before["generations"] == 10
    assert after["max_batch_size"] > 1
    assert after["batches"] - before["batches"] < 10


@pytest.mark.parametrize(
    ("fields", "status", "message"),
    [
        ({"model": "no-such-model"}, 404, "The model `no-such-model` does not exist"),
        ({"messages": []}, 400, "messages"),
        ({"messages": [{"role": "robot", "content": "hi"}]}, 400, "messages.0.role"),
        ({"temperature": -1}, 400, "temperature"),
        ({"max_tokens": 0}, 400, "max_tokens"),
        ({"max_tokens": 5000}, 400, "maximum context length is 4096"),
        ({"stream": True}, 400, "stream"),
        ({"tool_choice": "required"}, 400, "tool_choice"),
        ({"top_logprobs": 2}, 400, "top_logprobs needs logprobs"),
        (
            {"messages": [{"role": "user", "content": "x " * 5000}]},
            400,
            "maximum context length is 4096",
        ),
        (
            {"messages": [{"role": "user", "content": "a"}, {"role": "system", "content": "b"}]},
            400,
            "only the first message may be a system message",
        ),
    ],
)
def test_bad_requests_get_an_openai_style_error(
    lm_server: LmServer, fields: dict[str, Any], status: int, message: str
) -> None:
    response = _chat(lm_server, **fields)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert message in error["message"]
    assert error["code"] == status
    assert error["type"] in {"BadRequestError", "NotFoundError"}


def test_a_body_that_is_not_json_gets_400(lm_server: LmServer) -> None:
    response = httpx.post(
        f"{lm_server.base_url}/chat/completions",
        content=b"{not json",
        headers={"content-type": "application/json"},
        timeout=30.0,
    )
    assert response.status_code == 400
    assert "invalid request" in response.json()["error"]["message"]


def test_server_refuses_a_directory_that_is_not_a_model(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "training.lm.server", "--model", str(tmp_path), "--port", "1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2
    assert "no config.json" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_lora_adapters_load_serve_and_unload_as_on_vllm(
    lm_server: LmServer, tiny_model_dir: Path, tmp_path: Path
) -> None:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from training.lm.generate import LocalGenerator

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    # Random B matrices (not peft's zero init), so the adapter changes what the model says.
    lora = LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False)
    adapter_dir = tmp_path / "adapter"
    get_peft_model(model, lora).save_pretrained(adapter_dir)
    not_an_adapter = tmp_path / "empty"
    not_an_adapter.mkdir()

    def post(path: str, **body: Any) -> httpx.Response:
        return httpx.post(f"{lm_server.base_url}/{path}", json=body, timeout=120.0)

    name = "tiny-agent-lora-v1"
    loaded = post("load_lora_adapter", lora_name=name, lora_path=str(adapter_dir))
    assert loaded.status_code == 200, loaded.text
    assert loaded.text == f"Success: LoRA adapter '{name}' added successfully."
    try:
        listed = httpx.get(f"{lm_server.base_url}/models", timeout=10.0).json()["data"]
        assert {"id": name, "parent": lm_server.model, "root": str(adapter_dir)}.items() <= next(
            entry for entry in listed if entry["id"] == name
        ).items()
        again = post("load_lora_adapter", lora_name=name, lora_path=str(adapter_dir))
        assert again.status_code == 400 and "already been loaded" in again.text
        assert (
            post("load_lora_adapter", lora_name="x", lora_path=str(tmp_path / "no")).status_code
            == 404
        )
        bad = post("load_lora_adapter", lora_name="x", lora_path=str(not_an_adapter))
        assert bad.status_code == 400 and "adapter_config.json" in bad.json()["error"]["message"]

        fields = {"max_tokens": 8, "seed": 1, "logprobs": True, "return_token_ids": True}
        base = _chat(lm_server, **fields).json()
        adapted = _chat(lm_server, **{**fields, "model": name}).json()
        assert adapted["model"] == name
        assert adapted["prompt_token_ids"] == base["prompt_token_ids"]
        served = [item["logprob"] for item in adapted["choices"][0]["logprobs"]["content"]]
        assert served != [item["logprob"] for item in base["choices"][0]["logprobs"]["content"]]
        # The served adapter is the same model as the adapter merged in-process.
        local = LocalGenerator.from_pretrained(tiny_model_dir).with_lora_adapter(
            adapter_dir, name=name
        )
        ids = adapted["prompt_token_ids"] + adapted["choices"][0]["token_ids"]
        with torch.no_grad():
            logits = local.model(input_ids=torch.tensor([ids])).logits[0].float()
        log_probs = torch.log_softmax(logits, dim=-1)
        start = len(adapted["prompt_token_ids"]) - 1
        expected = [
            float(log_probs[start + index, token])
            for index, token in enumerate(adapted["choices"][0]["token_ids"])
        ]
        assert served == pytest.approx(expected, abs=1e-4)
    finally:
        unloaded = post("unload_lora_adapter", lora_name=name)
    assert unloaded.status_code == 200, unloaded.text
    assert _chat(lm_server, model=name, max_tokens=1).status_code == 404
    assert post("unload_lora_adapter", lora_name=name).status_code == 404
