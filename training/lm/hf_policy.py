"""The `hf:` policy: a local Hugging Face causal LM generating in-process with torch.

The same conversation code as the `openai:` policy (`training.lm.conversation`), answered by
`training.lm.generate.LocalGenerator` instead of a server: exact prompt and completion ids and the
sampler's logprobs come from the generator itself. The model loads once per process and model
version; the version is the digest of the weight files, so a trained checkpoint is a new version.
Episodes in flight on one worker (`max_concurrent_requests`) send their turns through one
batcher per version, so their tokens are drawn in shared forward passes.
"""

from __future__ import annotations

import functools
import hashlib
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.errors import ContextExhaustedError
from training.lm.conversation import (
    TOOL_SCHEMAS,
    ChatPolicy,
    ChatSampling,
    ChatTurn,
    completion_budget,
)

if TYPE_CHECKING:
    from training.lm.generate import BatchingGenerator, Completion, LocalGenerator

_WEIGHT_SUFFIXES = (".safetensors", ".bin")


@functools.lru_cache(maxsize=16)
def _weights_digest(model_dir: str, stamp: tuple[tuple[str, int, int], ...]) -> str:
    digest = hashlib.sha256()
    for name, _, _ in stamp:
        digest.update(name.encode())
        with open(Path(model_dir, name), "rb") as weights:
            for block in iter(lambda: weights.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()


def weights_digest(model_dir: str | Path) -> str:
    """sha256 over the directory's weight files (names and bytes), cached while they are
    unchanged (same sizes and modification times)."""
    where = Path(model_dir).resolve()
    stamp = tuple(
        (path.name, path.stat().st_size, path.stat().st_mtime_ns)
        for path in sorted(where.iterdir())
        if path.suffix in _WEIGHT_SUFFIXES and path.is_file()
    )
    return _weights_digest(str(where), stamp)


_LOADING = threading.Lock()
"""Episodes in flight share a worker's threads: the first load runs alone, since transformers'
lazy imports are not thread-safe (two threads importing `AutoModelForCausalLM` at once fail
with ImportError) and the cache below would otherwise load the model once per thread."""


def _generator(model_dir: str, digest: str) -> LocalGenerator:
    with _LOADING:
        return _load_generator(model_dir, digest)


@functools.lru_cache(maxsize=2)
def _load_generator(model_dir: str, digest: str) -> LocalGenerator:
    del digest  # part of the cache key: changed weights load again
    from training.lm.generate import LocalGenerator

    return LocalGenerator.from_pretrained(model_dir)


_BATCHERS: dict[tuple[str, str], BatchingGenerator] = {}
_BATCHERS_KEPT = 2
"""Model versions with a live batcher per process: the current one and, in async mode, the one
before it."""


def _batcher(model_dir: str, digest: str) -> BatchingGenerator:
    """The process's batcher for one model version: the episodes a shard keeps in flight
    (`max_concurrent_requests`) share its forward passes. A model generating one sequence at a
    time is bound by per-token overhead, not arithmetic (`benchmarks/llm_rollout.py --cases hf`).
    Rows keep their own seeds: a reply does not depend on what else is in its batch."""
    from training.lm.generate import BatchingGenerator

    with _LOADING:
        key = (model_dir, digest)
        batcher = _BATCHERS.get(key)
        if batcher is None:
            batcher = BatchingGenerator(_load_generator(model_dir, digest))
            _BATCHERS[key] = batcher
            while len(_BATCHERS) > _BATCHERS_KEPT:
                oldest = next(iter(_BATCHERS))
                _BATCHERS.pop(oldest).close()  # finishes what is queued, then stops
        return batcher


class HFPolicy(ChatPolicy):
    """Acts with a transformers causal LM loaded from a directory, in this process."""

    kind = "hf"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        sampling: ChatSampling | None = None,
        min_completion_tokens: int = 16,
    ) -> None:
        super().__init__(sampling or ChatSampling(), min_completion_tokens=min_completion_tokens)
        self.model_dir = str(model_dir)

    @property
    def model_name(self) -> str:
        return Path(self.model_dir).resolve().name

    @property
    def version(self) -> str:
        return f"hf:{self.model_name}@{weights_digest(self.model_dir)[:12]}"

    def generator(self) -> LocalGenerator:
        return _generator(str(Path(self.model_dir).resolve()), weights_digest(self.model_dir))

    def batcher(self) -> BatchingGenerator:
        return _batcher(str(Path(self.model_dir).resolve()), weights_digest(self.model_dir))

    def complete(self, messages: list[dict[str, Any]], *, seed: int | None) -> ChatTurn:
        from training.errors import ContextLengthError
        from training.lm.generate import SamplingParams as GenerationSampling

        batcher = self.batcher()  # the weights' digest read once per turn
        generator = batcher.generator
        try:
            # Tokenized once, by the model's own template: its length is the exact prompt
            # length, and the same ids go to the model (token in).
            prompt_ids = generator.prompt(messages, list(TOOL_SCHEMAS)).token_ids
        except ContextLengthError as error:  # not one token of room left
            raise ContextExhaustedError(
                str(error), error.prompt_tokens, error.max_context_tokens
            ) from None
        max_tokens = completion_budget(
            len(prompt_ids),
            generator.max_context_tokens,
            max_tokens=self.sampling.max_tokens,
            min_tokens=self.min_completion_tokens,
        )
        sampling = GenerationSampling(
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_tokens=max_tokens,
            seed=seed,
        )
        completion = batcher.submit(generator.prompt_from_token_ids(prompt_ids, sampling)).result()
        return ChatTurn(
            model=self.model_name,
            message=_message(completion),
            prompt_token_ids=completion.prompt_token_ids,
            completion_token_ids=completion.token_ids,
            completion_logprobs=completion.logprobs,
            finish_reason=completion.finish_reason,
            format_problems=tuple(m.error for m in completion.malformed_tool_calls),
        )


def _message(completion: Completion) -> dict[str, Any]:
    """The reply as an OpenAI assistant message, read as vLLM's hermes parser reads it: when a
    tool-call block does not parse, the whole text is content and no call is taken."""
    if completion.tool_calls and not completion.malformed_tool_calls:
        return {
            "role": "assistant",
            "content": completion.content,
            "tool_calls": [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in completion.tool_calls
            ],
        }
    return {"role": "assistant", "content": completion.text}
