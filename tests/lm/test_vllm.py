"""vLLM's CPU build serving the tiny model (opt-in, slow): it computes the same prompt token ids
as rollyard's own generation, its sampler logprobs equal a forward pass, and its hermes parser
reads the tiny model's tool calls."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import torch

from training.lm.generate import LocalGenerator, SamplingParams
from training.lm.tiny import tool_call_transcripts

if TYPE_CHECKING:
    from tests.lm.conftest import LmServer

pytestmark = pytest.mark.slow


TRANSCRIPT = tool_call_transcripts(1, seed=77)[0]
TOOL_SCHEMAS = list(TRANSCRIPT.tools)


def _messages() -> list[dict[str, Any]]:
    return list(TRANSCRIPT.messages[:4])


def _chat(server: LmServer, **fields: Any) -> dict[str, Any]:
    body = {
        "model": server.model,
        "messages": _messages(),
        "tools": TOOL_SCHEMAS,
        "return_token_ids": True,
        "logprobs": True,
        **fields,
    }
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=600.0)
    assert response.status_code == 200, response.text
    answer: dict[str, Any] = response.json()
    return answer


def test_vllm_tokenizes_the_prompt_as_rollyard_does(vllm_server: LmServer) -> None:
    generator = LocalGenerator.from_pretrained(vllm_server.model_dir)
    answer = _chat(vllm_server, max_tokens=1)
    assert answer["prompt_token_ids"] == list(generator.prompt(_messages(), TOOL_SCHEMAS).token_ids)


def test_vllm_sampler_logprobs_equal_a_forward_pass(vllm_server: LmServer) -> None:
    generator = LocalGenerator.from_pretrained(vllm_server.model_dir)
    answer = _chat(vllm_server, max_tokens=32, temperature=1.0, seed=4)
    (choice,) = answer["choices"]
    prompt_ids, completion_ids = answer["prompt_token_ids"], choice["token_ids"]
    with torch.no_grad():
        logits = generator.model(input_ids=torch.tensor([prompt_ids + completion_ids])).logits[0]
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    expected = [
        float(log_probs[len(prompt_ids) - 1 + index, token])
        for index, token in enumerate(completion_ids)
    ]
    served = [item["logprob"] for item in choice["logprobs"]["content"]]
    assert served == pytest.approx(expected, abs=1e-4)


def test_vllm_reads_the_tiny_models_tool_calls_as_rollyard_generates_them(
    vllm_server: LmServer,
) -> None:
    generator = LocalGenerator.from_pretrained(vllm_server.model_dir)
    answer = _chat(vllm_server, max_tokens=200, temperature=0)
    (choice,) = answer["choices"]
    local = generator.generate(
        _messages(), TOOL_SCHEMAS, SamplingParams(temperature=0, max_tokens=200)
    )
    assert choice["token_ids"] == list(local.token_ids)
    assert choice["finish_reason"] == "tool_calls"
    served_calls = [
        (call["function"]["name"], json.loads(call["function"]["arguments"]))
        for call in choice["message"]["tool_calls"]
    ]
    assert served_calls == [(call.name, json.loads(call.arguments)) for call in local.tool_calls]
