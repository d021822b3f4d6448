"""The in-process `hf:` policy under concurrency: the episodes a shard keeps in flight share its
forward passes, and each reply is still the one its own seed draws alone."""

from __future__ import annotations

import threading
from pathlib import Path

from training.lm.conversation import SYSTEM_PROMPT, ChatSampling, ChatTurn
from training.lm.hf_policy import HFPolicy

REQUESTS = 6


def messages(index: int) -> list[dict[str, str]]:
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": f"Fix the bug in pkg/mod_{index}.py; run python -m pytest."},
    ]


def test_concurrent_replies_share_forward_passes_and_keep_their_own_tokens(
    tiny_model_dir: Path,
) -> None:
    policy = HFPolicy(tiny_model_dir, sampling=ChatSampling(temperature=1.0, max_tokens=48))
    alone = [policy.complete(messages(i), seed=100 + i) for i in range(REQUESTS)]
    batches_before = len(policy.batcher().batch_sizes)

    together: list[ChatTurn | None] = [None] * REQUESTS
    start = threading.Barrier(REQUESTS)

    def ask(index: int) -> None:
        start.wait()
        together[index] = policy.complete(messages(index), seed=100 + index)

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(REQUESTS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    sizes = policy.batcher().batch_sizes[batches_before:]
    assert sum(sizes) == REQUESTS
    assert max(sizes) > 1, f"no two requests shared a forward pass: batches {sizes}"
    for single, batched in zip(alone, together, strict=True):
        assert batched is not None
        assert batched.completion_token_ids == single.completion_token_ids
        assert batched.prompt_token_ids == single.prompt_token_ids
        drawn = zip(batched.completion_logprobs, single.completion_logprobs, strict=True)
        assert all(abs(a - b) < 1e-4 for a, b in drawn)
