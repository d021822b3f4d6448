"""In-process generation with a Hugging Face causal LM: prompt and completion token ids, the
sampler's log-probabilities and parsed tool calls, one request or a padded batch at a time.

The one generation core under both the `hf:` policy and rollyard's small OpenAI-compatible
server (`training.lm.server`), so the two return the very same tokens for the same request.

Log-probabilities are those of the distribution each token was actually drawn from: the model's
logits divided by the temperature, softmaxed, then restricted to the top-p nucleus (the smallest
set of most likely tokens whose probability reaches `top_p`) and renormalized. At temperature 1
and top_p 1 that is the model's own distribution, which a trainer's forward pass recomputes. At
temperature 0 (greedy) the token is the argmax and the reported log-probability is the model's
unscaled one (the distribution drawn from is a point mass, whose log-probability says nothing).
"""

from __future__ import annotations

import dataclasses
import json
import re
import secrets
import threading
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future
from pathlib import Path
from typing import Any, Literal

import torch

from training.errors import ContextLengthError, LanguageModelError, ModelDirError

FinishReason = Literal["stop", "length", "tool_calls"]

_TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)\Z", re.DOTALL)


@dataclasses.dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample one completion (the OpenAI request fields of the same names)."""

    temperature: float = 1.0
    """0 samples greedily (argmax)."""
    top_p: float = 1.0
    """Nucleus: sample only among the most likely tokens whose probability reaches this."""
    max_tokens: int | None = None
    """Completion tokens at most; None: up to the model's context window."""
    seed: int | None = None
    """Fixes the draws: the same prompt, parameters and seed give the same tokens."""
    top_logprobs: int = 0
    """Also return, per sampled token, this many most likely alternatives (0 to 20)."""

    def __post_init__(self) -> None:
        if not self.temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"max_tokens must be at least 1, got {self.max_tokens}")
        if not 0 <= self.top_logprobs <= 20:
            raise ValueError(f"top_logprobs must be in 0..20, got {self.top_logprobs}")


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCall:
    """One well-formed `<tool_call>` block of a reply."""

    id: str
    """`call_<24 hex>`, unique per call (what a tool message's `tool_call_id` names)."""
    name: str
    arguments: str
    """The arguments object as JSON text (`json.dumps`, non-ASCII kept), as OpenAI sends it."""


@dataclasses.dataclass(frozen=True, slots=True)
class MalformedToolCall:
    """A `<tool_call>` block that is not `{"name": str, "arguments": object}` JSON, or that
    was never closed; reported with the reply, never raised."""

    text: str
    """The block's text between the tags (to the end of the reply if unclosed)."""
    error: str
    """What is wrong, in one line."""


@dataclasses.dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float


@dataclasses.dataclass(frozen=True, slots=True)
class Prompt:
    """A prompt ready to generate from: its token ids (checked against the context window)
    and how to sample. Build one with `LocalGenerator.prompt` or `prompt_from_token_ids`."""

    token_ids: tuple[int, ...]
    sampling: SamplingParams
    max_tokens: int
    """`sampling.max_tokens`, or what is left of the context window when that is None."""


@dataclasses.dataclass(frozen=True, slots=True)
class Completion:
    """One sampled reply with everything a token-level trainer needs."""

    prompt_token_ids: tuple[int, ...]
    token_ids: tuple[int, ...]
    """The sampled tokens, the stop token (`<|im_end|>`) included when the reply stopped."""
    logprobs: tuple[float, ...]
    """Per sampled token, its log-probability under the distribution it was drawn from (see the
    module docstring)."""
    top_logprobs: tuple[tuple[TokenLogprob, ...], ...]
    """Per sampled token, the `top_logprobs` most likely tokens of that same distribution
    (tokens outside the top-p nucleus, of probability 0, are left out); empty tuples when 0."""
    text: str
    """The completion decoded without special tokens (so without the stop token)."""
    content: str | None
    """The text outside `<tool_call>` blocks, stripped; None when nothing is left."""
    tool_calls: tuple[ToolCall, ...]
    malformed_tool_calls: tuple[MalformedToolCall, ...]
    finish_reason: FinishReason
    """`tool_calls` (stopped with at least one well-formed call), `stop` (stopped without),
    `length` (ran out of `max_tokens`)."""


def parse_tool_calls(
    text: str,
) -> tuple[str | None, tuple[ToolCall, ...], tuple[MalformedToolCall, ...]]:
    """Split a reply into its content, its well-formed tool calls and its malformed blocks.

    Every `<tool_call>...</tool_call>` block counts (parallel tool calls), plus an unclosed last
    one (a reply cut by `max_tokens`). A block is well-formed when it is a JSON object with a
    string `name` and an object `arguments` (given as an object or as JSON text of one)."""
    calls: list[ToolCall] = []
    malformed: list[MalformedToolCall] = []
    for match in _TOOL_CALL_BLOCK.finditer(text):
        closed = match.group(1) is not None
        block = match.group(1) if closed else match.group(2)
        if not closed:
            malformed.append(MalformedToolCall(block, "the <tool_call> block is never closed"))
            continue
        try:
            parsed = json.loads(block)
        except json.JSONDecodeError as error:
            malformed.append(MalformedToolCall(block, f"not valid JSON ({error.msg})"))
            continue
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
            malformed.append(MalformedToolCall(block, 'needs a JSON object with a string "name"'))
            continue
        arguments = parsed.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError as error:
                malformed.append(
                    MalformedToolCall(block, f'"arguments" text is not valid JSON ({error.msg})')
                )
                continue
        if not isinstance(arguments, dict):
            malformed.append(MalformedToolCall(block, '"arguments" must be a JSON object'))
            continue
        calls.append(
            ToolCall(
                id=f"call_{uuid.uuid4().hex[:24]}",
                name=parsed["name"],
                arguments=json.dumps(arguments, ensure_ascii=False),
            )
        )
    content = _TOOL_CALL_BLOCK.sub("", text).strip()
    return content or None, tuple(calls), tuple(malformed)


class LocalGenerator:
    """A causal LM and its tokenizer in this process, generating with the model's chat
    template. Calls from several threads are serialized (one forward at a time); to have
    concurrent callers share forward passes, put a `BatchingGenerator` in front."""

    def __init__(self, model: Any, tokenizer: Any, *, name: str) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ModelDirError(
                f"the tokenizer of {name} has no chat template; save one with the tokenizer "
                "(tokenizer.chat_template = ...; tokenizer.save_pretrained(dir))"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.name = name
        self.max_context_tokens: int = int(
            getattr(model.config, "max_position_embeddings", 0) or tokenizer.model_max_length
        )
        eos = model.generation_config.eos_token_id
        eos_ids = set(eos if isinstance(eos, list) else [] if eos is None else [eos])
        if tokenizer.eos_token_id is not None:
            eos_ids.add(tokenizer.eos_token_id)
        if not eos_ids:
            raise ModelDirError(f"{name} names no end-of-sequence token; generation never stops")
        self.stop_token_ids = frozenset(eos_ids)
        pad = tokenizer.pad_token_id
        self.pad_token_id: int = int(pad if pad is not None else min(eos_ids))
        self._lock = threading.Lock()

    @classmethod
    def from_pretrained(
        cls, model_dir: str | Path, *, name: str | None = None, dtype: torch.dtype = torch.float32
    ) -> LocalGenerator:
        """Load a Hugging Face causal-LM directory (config, weights, tokenizer with a chat
        template) with `AutoModelForCausalLM` / `AutoTokenizer`, on CPU; a LoRA adapter
        directory (adapter + tokenizer) loads its base model with the adapter merged."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        path = Path(model_dir)
        adapter = (path / "adapter_config.json").is_file()
        if not adapter and not (path / "config.json").is_file():
            raise ModelDirError(
                f"{path} is not a Hugging Face model directory (no config.json); give the "
                "directory save_pretrained wrote"
            )
        try:
            tokenizer = AutoTokenizer.from_pretrained(path)
            if adapter:
                # A LoRA adapter directory (peft): its base model with the adapter merged in.
                from peft import AutoPeftModelForCausalLM

                model = AutoPeftModelForCausalLM.from_pretrained(path, dtype=dtype)
                model = model.merge_and_unload()
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        except (OSError, ValueError, KeyError) as error:
            raise ModelDirError(f"cannot load a causal LM from {path}: {error}") from error
        return cls(model, tokenizer, name=name or path.name)

    def with_lora_adapter(self, adapter_dir: str | Path, *, name: str) -> LocalGenerator:
        """A generator for this model with a peft LoRA adapter merged into a copy of its
        weights (this generator is left as it was). Raises `ModelDirError` when `adapter_dir`
        is not an adapter of this model."""
        import copy

        from peft import PeftModel

        path = Path(adapter_dir)
        if not (path / "adapter_config.json").is_file():
            raise ModelDirError(
                f"{path} is not a LoRA adapter directory (no adapter_config.json); give the "
                "directory peft's save_pretrained wrote"
            )
        try:
            adapted = PeftModel.from_pretrained(copy.deepcopy(self.model), path)
            merged = adapted.merge_and_unload()
        except (OSError, ValueError, KeyError, RuntimeError) as error:
            raise ModelDirError(
                f"cannot apply the LoRA adapter {path} to {self.name}: {error}"
            ) from error
        return LocalGenerator(merged, self.tokenizer, name=name)

    # -- prompts --------------------------------------------------------------------------------

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
    ) -> str:
        """The chat template's text for `messages` (and the tools' schemas)."""
        try:
            text = self.tokenizer.apply_chat_template(
                [dict(message) for message in messages],
                tools=[dict(tool) for tool in tools] if tools else None,
                add_generation_prompt=add_generation_prompt,
                tokenize=False,
            )
        except Exception as error:  # jinja raises its own errors for a message it cannot render
            raise LanguageModelError(
                f"cannot render the messages with the chat template: {error}"
            ) from error
        return str(text)

    def prompt(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> Prompt:
        """The prompt for a chat: the template rendered with the generation prompt, tokenized
        as is (no special tokens added). Raises `ContextLengthError` if it does not fit."""
        text = self.render(messages, tools)
        return self.prompt_from_token_ids(
            self.tokenizer.encode(text, add_special_tokens=False), sampling
        )

    def prompt_from_token_ids(
        self, token_ids: Sequence[int], sampling: SamplingParams | None = None
    ) -> Prompt:
        """A prompt given as token ids (token-in: e.g. the previous turn's prompt and completion
        ids plus the new messages' ids, so nothing is re-tokenized)."""
        sampling = sampling or SamplingParams()
        ids = tuple(int(token) for token in token_ids)
        if not ids:
            raise LanguageModelError("the prompt is empty; give at least one token")
        vocab_size = int(self.model.config.vocab_size)
        if min(ids) < 0 or max(ids) >= vocab_size:
            raise LanguageModelError(f"prompt token ids must be in 0..{vocab_size - 1}")
        room = self.max_context_tokens - len(ids)
        asked = sampling.max_tokens if sampling.max_tokens is not None else max(room, 1)
        if room < 1 or asked > room:
            raise ContextLengthError(
                f"This model's maximum context length is {self.max_context_tokens} tokens. "
                f"However, the request needs {len(ids) + asked} tokens ({len(ids)} in the "
                f"prompt, {asked} for the completion). Shorten the messages or lower max_tokens.",
                len(ids),
                self.max_context_tokens,
            )
        return Prompt(ids, sampling, asked)

    # -- generation -----------------------------------------------------------------------------

    def generate(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        sampling: SamplingParams | None = None,
    ) -> Completion:
        """Sample one reply to `messages` (the tools' schemas go into the prompt)."""
        return self.generate_batch([self.prompt(messages, tools, sampling)])[0]

    @torch.no_grad()
    def generate_batch(self, prompts: Sequence[Prompt]) -> list[Completion]:
        """Sample a reply for each prompt in one padded batch (left padding; each row has its
        own positions, sampling parameters and random generator, so a row's tokens do not
        depend on what else is in the batch)."""
        if not prompts:
            return []
        with self._lock:
            return self._generate_batch(prompts)

    def _generate_batch(self, prompts: Sequence[Prompt]) -> list[Completion]:
        batch = len(prompts)
        width = max(len(prompt.token_ids) for prompt in prompts)
        input_ids = torch.full((batch, width), self.pad_token_id, dtype=torch.long)
        attention = torch.zeros((batch, width), dtype=torch.long)
        for row, prompt in enumerate(prompts):
            input_ids[row, width - len(prompt.token_ids) :] = torch.tensor(prompt.token_ids)
            attention[row, width - len(prompt.token_ids) :] = 1
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        generators = []
        for prompt in prompts:
            seed = prompt.sampling.seed
            generator = torch.Generator()
            generator.manual_seed(seed if seed is not None else secrets.randbits(63))
            generators.append(generator)
        temperatures = torch.tensor([prompt.sampling.temperature for prompt in prompts])
        top_ps = torch.tensor([prompt.sampling.top_p for prompt in prompts])
        sampled: list[list[int]] = [[] for _ in prompts]
        logprobs: list[list[float]] = [[] for _ in prompts]
        alternatives: list[list[tuple[TokenLogprob, ...]]] = [[] for _ in prompts]
        finished = [False] * batch
        stopped = [False] * batch

        output = self.model(
            input_ids=input_ids,
            attention_mask=attention,
            position_ids=positions,
            use_cache=True,
            logits_to_keep=1,
        )
        cache = output.cache
        logits = output.logits[:, -1, :].float()
        while True:
            log_dist = _sampling_log_probs(logits, temperatures, top_ps)
            next_tokens = torch.full((batch,), self.pad_token_id, dtype=torch.long)
            for row, prompt in enumerate(prompts):
                if finished[row]:
                    continue
                if prompt.sampling.temperature == 0:
                    token = int(torch.argmax(logits[row]))
                else:
                    probs = log_dist[row].exp()
                    token = int(torch.multinomial(probs, 1, generator=generators[row]))
                next_tokens[row] = token
                sampled[row].append(token)
                logprobs[row].append(float(log_dist[row, token]))
                if prompt.sampling.top_logprobs:
                    alternatives[row].append(
                        _top_alternatives(log_dist[row], prompt.sampling.top_logprobs)
                    )
                if token in self.stop_token_ids:
                    finished[row] = stopped[row] = True
                elif len(sampled[row]) >= prompt.max_tokens:
                    finished[row] = True
            if all(finished):
                break
            attention = torch.cat([attention, torch.ones((batch, 1), dtype=torch.long)], dim=1)
            positions = positions[:, -1:] + 1
            output = self.model(
                input_ids=next_tokens[:, None],
                attention_mask=attention,
                position_ids=positions,
                cache=cache,
                use_cache=True,
            )
            cache = output.cache
            logits = output.logits[:, -1, :].float()
        return [
            self._completion(prompt, sampled[row], logprobs[row], alternatives[row], stopped[row])
            for row, prompt in enumerate(prompts)
        ]

    def _completion(
        self,
        prompt: Prompt,
        token_ids: list[int],
        logprobs: list[float],
        alternatives: list[tuple[TokenLogprob, ...]],
        stopped: bool,
    ) -> Completion:
        text_ids = token_ids[:-1] if stopped else token_ids
        text = self.tokenizer.decode(text_ids, skip_special_tokens=True)
        content, tool_calls, malformed = parse_tool_calls(text)
        finish: FinishReason = "length"
        if stopped:
            finish = "tool_calls" if tool_calls else "stop"
        return Completion(
            prompt_token_ids=prompt.token_ids,
            token_ids=tuple(token_ids),
            logprobs=tuple(logprobs),
            top_logprobs=tuple(alternatives) if alternatives else tuple(() for _ in token_ids),
            text=text,
            content=content,
            tool_calls=tool_calls,
            malformed_tool_calls=malformed,
            finish_reason=finish,
        )


def _sampling_log_probs(
    logits: torch.Tensor, temperatures: torch.Tensor, top_ps: torch.Tensor
) -> torch.Tensor:
    """Per row, the log-probabilities of the distribution sampled from: logits / temperature,
    restricted to the top-p nucleus, renormalized (-inf outside it). Greedy rows (temperature
    0) get the unscaled log-softmax."""
    scale = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    log_probs = torch.log_softmax(logits / scale[:, None], dim=-1)
    nucleus_rows = (top_ps < 1) & (temperatures > 0)
    if not bool(nucleus_rows.any()):
        return log_probs
    sorted_log_probs, order = torch.sort(log_probs, dim=-1, descending=True)
    sorted_probs = sorted_log_probs.exp()
    # A token is in the nucleus when the tokens more likely than it sum to less than top_p; the
    # most likely token always is.
    before = sorted_probs.cumsum(dim=-1) - sorted_probs
    outside_sorted = (before >= top_ps[:, None]) & nucleus_rows[:, None]
    outside = torch.zeros_like(outside_sorted).scatter(-1, order, outside_sorted)
    return torch.log_softmax(log_probs.masked_fill(outside, float("-inf")), dim=-1)


def _top_alternatives(log_dist: torch.Tensor, count: int) -> tuple[TokenLogprob, ...]:
    values, indices = torch.topk(log_dist, count)
    return tuple(
        TokenLogprob(int(index), float(value))
        for value, index in zip(values.tolist(), indices.tolist(), strict=True)
        if value != float("-inf")
    )


class BatchingGenerator:
    """Groups concurrent requests into shared forward batches: callers `submit` prompts from
    any thread; a worker thread takes everything queued (up to `max_batch_size`) and runs it
    as one `generate_batch`, so requests that arrive while a batch runs form the next one."""

    def __init__(self, generator: LocalGenerator, *, max_batch_size: int = 16) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be at least 1, got {max_batch_size}")
        self.generator = generator
        self.max_batch_size = max_batch_size
        self.batch_sizes: list[int] = []
        """Size of every batch run so far (how well requests were grouped)."""
        self._queue: list[tuple[Prompt, Future[Completion]]] = []
        self._wakeup = threading.Condition()
        self._closed = False
        self._worker = threading.Thread(target=self._run, name="rollyard-lm-batcher", daemon=True)
        self._worker.start()

    def submit(self, prompt: Prompt) -> Future[Completion]:
        future: Future[Completion] = Future()
        with self._wakeup:
            if self._closed:
                raise LanguageModelError("the batching generator is closed")
            self._queue.append((prompt, future))
            self._wakeup.notify()
        return future

    def close(self) -> None:
        """Finish what is queued, then stop the worker; later `submit`s raise. Idempotent."""
        with self._wakeup:
            self._closed = True
            self._wakeup.notify()
        if self._worker is not threading.current_thread():
            self._worker.join()

    def _run(self) -> None:
        while True:
            with self._wakeup:
                while not self._queue and not self._closed:
                    self._wakeup.wait()
                if not self._queue:
                    return
                work = self._queue[: self.max_batch_size]
                del self._queue[: self.max_batch_size]
            self.batch_sizes.append(len(work))
            try:
                completions = self.generator.generate_batch([prompt for prompt, _ in work])
            except Exception as error:  # a failed batch fails its requests, not the worker
                for _, future in work:
                    future.set_exception(error)
                continue
            for (_, future), completion in zip(work, completions, strict=True):
                future.set_result(completion)
