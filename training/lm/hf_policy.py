"""The `hf:` policy: a local Hugging Face causal LM generating in-process with torch.

The same conversation code as the `openai:` policy (`training.lm.conversation`), answered by
`training.lm.generate.LocalGenerator` instead of a server: exact prompt and completion ids and the
sampler's logprobs come from the generator itself. The model loads once per process and model
version; the version is the digest of the weight files, so a trained checkpoint is a new version.
"""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from training.lm.conversation import (
    TOOL_SCHEMAS,
    ChatPolicy,
    ChatTurn,
    SamplingParams,
    completion_budget,
)

if TYPE_CHECKING:
    from training.lm.generate import LocalGenerator

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


@functools.lru_cache(maxsize=2)
def _load_generator(model_dir: str, digest: str) -> LocalGenerator:
    del digest  # part of the cache key: changed weights load again
    from training.lm.generate import LocalGenerator

    return LocalGenerator.from_pretrained(model_dir)


class HFPolicy(ChatPolicy):
    """Acts with a transformers causal LM loaded from a directory, in this process."""

    kind = "hf"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        sampling: SamplingParams | None = None,
        min_completion_tokens: int = 16,
    ) -> None:
        super().__init__(sampling or SamplingParams(), min_completion_tokens=min_completion_tokens)
        self.model_dir = str(model_dir)

    @property
    def model_name(self) -> str:
        return Path(self.model_dir).resolve().name

    @property
    def version(self) -> str:
        return f"hf:{self.model_name}@{weights_digest(self.model_dir)[:12]}"

    def generator(self) -> LocalGenerator:
        return _load_generator(str(Path(self.model_dir).resolve()), weights_digest(self.model_dir))

    def complete(self, messages: list[dict[str, Any]], *, seed: int | None) -> ChatTurn:
        generator = self.generator()
        tools = list(TOOL_SCHEMAS)
        prompt_tokens = generator.count_prompt_tokens(messages, tools)
        max_tokens = completion_budget(
            prompt_tokens,
            generator.context_tokens,
            max_tokens=self.sampling.max_tokens,
            min_tokens=self.min_completion_tokens,
        )
        completion = generator.generate(
            messages,
            tools,
            temperature=self.sampling.temperature,
            top_p=self.sampling.top_p,
            max_new_tokens=max_tokens,
            seed=seed,
        )
        return ChatTurn(
            model=self.model_name,
            message=completion.message(),
            prompt_token_ids=tuple(completion.prompt_token_ids),
            completion_token_ids=tuple(completion.completion_token_ids),
            completion_logprobs=tuple(completion.logprobs),
            finish_reason=completion.finish_reason,
        )
