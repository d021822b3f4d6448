"""Tiny causal language models built on this machine: a transformers config with random weights,
a byte-level BPE tokenizer trained here, a tool-calling chat template, and (optionally) a short
fine-tune on synthetic tool-calling transcripts so the model acts in the agent loop.

No weights can be downloaded where rollyard's tests run, so the model a test or a benchmark acts
with is built from scratch and saved as an ordinary Hugging Face directory; it loads back with
the same `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` a user's
model takes. The chat template follows the Qwen 2.5 / Hermes tool-calling format, so servers'
`hermes` tool-call parsers read its replies:

    <|im_start|>assistant
    <tool_call>
    {"name": "run_command", "arguments": {"command": "python -m pytest tests"}}
    </tool_call><|im_end|>
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import random
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from training.errors import ModelDirError
from training.lm.weights import write_atomically

IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
END_OF_TEXT = "<|endoftext|>"
SPECIAL_TOKENS = (END_OF_TEXT, IM_START, IM_END)
"""Control tokens: never part of a message's text (`skip_special_tokens` drops them)."""
TOOL_CALL_START = "<tool_call>"
TOOL_CALL_END = "</tool_call>"
MARKUP_TOKENS = (TOOL_CALL_START, TOOL_CALL_END, "<tool_response>", "</tool_response>")
"""Single tokens that stay in decoded text, so a tool-call parser (ours, vLLM's `hermes`) sees
them; vLLM's parser also looks the two tool-call tokens up in the vocabulary."""

_SCHEMAS_SYSTEM_TURN = (
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- '# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>' }}"
    "{%- for tool in tools %}{{- '\\n' }}{{- tool | tojson }}{%- endfor %}"
    "{{- '\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n"
    '{"name": <function-name>, "arguments": <args-json-object>}\\n</tool_call><|im_end|>\\n\' }}'
)
_SIGNATURES_SYSTEM_TURN = (
    "{{- '<|im_start|>system\\n' }}"
    "{%- if messages and messages[0].role == 'system' %}{{- messages[0].content + '\\n\\n' }}{%- endif %}"
    "{{- 'Tools:' }}"
    "{%- for tool in tools %}"
    "{%- set function = tool.function if tool.function is defined else tool %}"
    "{{- '\\n' + function.name + '(' + (function.parameters.properties.keys() | list | join(', ')) + ')' }}"
    "{%- endfor %}"
    "{{- '<|im_end|>\\n' }}"
)
_CONVERSATION = (
    "{%- elif messages and messages[0].role == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if message.role == 'system' %}"
    "{%- if not loop.first %}{{- raise_exception('only the first message may be a system message') }}{%- endif %}"
    "{%- elif message.role == 'user' %}"
    "{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}"
    "{%- elif message.role == 'assistant' %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if message.content %}{{- message.content }}{%- endif %}"
    "{%- if message.tool_calls %}"
    "{%- for tool_call in message.tool_calls %}"
    "{%- if tool_call.function is defined %}{%- set tool_call = tool_call.function %}{%- endif %}"
    "{%- if not loop.first or message.content %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + tool_call.name + \'", "arguments": \' }}'
    "{%- if tool_call.arguments is string %}{{- tool_call.arguments }}"
    "{%- else %}{{- tool_call.arguments | tojson }}{%- endif %}"
    "{{- '}\\n</tool_call>' }}"
    "{%- endfor %}"
    "{%- endif %}"
    "{{- '<|im_end|>\\n' }}"
    "{%- elif message.role == 'tool' %}"
    "{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' + message.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- else %}"
    "{{- raise_exception('unknown message role ' + message.role) }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)
CHAT_TEMPLATE = "{%- if tools %}" + _SCHEMAS_SYSTEM_TURN + _CONVERSATION
"""Qwen 2.5-style ChatML with tools: the tools' JSON schemas in the system turn, each assistant
tool call as `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (arguments given as a JSON
string are written verbatim, a dict through `tojson`), consecutive tool results as one user turn
of `<tool_response>` blocks. Tool-call ids are not rendered (as in Qwen's template).

A reply the model generates after the generation prompt, followed by `<|im_end|>` and a newline,
is exactly what this template renders for that reply: the rendering of a conversation is always
its previous rendering plus the new turns, so token ids sampled turn by turn decode to it."""
SIGNATURES_CHAT_TEMPLATE = "{%- if tools %}" + _SIGNATURES_SYSTEM_TURN + _CONVERSATION
"""The same conversation with each tool declared by its signature alone (`edit_file(path,
old_text, new_text)`) instead of its JSON schema: a system turn of ~110 tokens instead of ~500
for a tiny model, whose attention the schemas dilute and whose training step they lengthen.
Replies are rendered and parsed exactly as with `CHAT_TEMPLATE`."""
TOOL_DECLARATIONS = {"schemas": CHAT_TEMPLATE, "signatures": SIGNATURES_CHAT_TEMPLATE}
"""How a tiny model's chat template declares the tools, by name (`build_tiny_model`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class TinyModelSize:
    """The shape of a tiny model (Qwen2 architecture: RMSNorm, rotary positions, SwiGLU)."""

    vocab_size: int = 4096
    """BPE vocabulary trained here at most (special and markup tokens come on top)."""
    hidden_size: int = 64
    intermediate_size: int = 192
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 4096
    """The context window in tokens (prompt plus completion)."""


@dataclasses.dataclass(frozen=True, slots=True)
class ToolCallTraining:
    """The short supervised fine-tune that teaches a tiny model the tool-call format."""

    steps: int = 240
    """Optimizer steps (each on `batch_size` transcripts). Measured with the default size:
    about 95% of replies to held-out conversations are well-formed tool calls after 240 steps
    at temperature 1 (60% after 60, 82% after 120); the misses are `edit_file` arguments."""
    batch_size: int = 4
    learning_rate: float = 1e-2
    """Peak (after 10 warm-up steps; cosine decay to 0). A model this small takes it."""
    transcripts: int = 48
    """Synthetic transcripts drawn (from as many demo tasks) and cycled through."""


@dataclasses.dataclass(frozen=True, slots=True)
class Transcript:
    """One chat conversation with the tools it was offered (OpenAI message and tool dicts)."""

    messages: tuple[dict[str, Any], ...]
    tools: tuple[dict[str, Any], ...]


def build_tiny_model(
    out_dir: str | Path,
    *,
    seed: int = 0,
    size: TinyModelSize | None = None,
    tool_call_training: ToolCallTraining | None = None,
    tool_declarations: str = "schemas",
) -> Path:
    """Write a complete Hugging Face causal-LM directory at `out_dir` and return its path.

    Config (`Qwen2ForCausalLM`), safetensors weights (random init from `seed`), tokenizer files
    and the tool-calling chat template (`TOOL_DECLARATIONS[tool_declarations]`: the tools' JSON
    schemas, `CHAT_TEMPLATE`, or their signatures, `SIGNATURES_CHAT_TEMPLATE`). With
    `tool_call_training`, the random model is first fine-tuned on synthetic tool-calling
    transcripts (`tool_call_transcripts`) so its replies are well-formed tool calls. The
    directory is written next to `out_dir` and moved into place at the end: nothing
    half-written is left under `out_dir`. Deterministic in its arguments on one machine; the
    global torch RNG is left as it was."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise ModelDirError(f"{out} exists and is not empty; give a new directory to build into")
    if tool_declarations not in TOOL_DECLARATIONS:
        raise ModelDirError(
            f"tool_declarations must be one of {sorted(TOOL_DECLARATIONS)}; got {tool_declarations!r}"
        )
    size = size or TinyModelSize()
    transcripts = tool_call_transcripts(
        count=tool_call_training.transcripts if tool_call_training else 16, seed=seed
    )
    tokenizer = _train_tokenizer(transcripts, size.vocab_size)
    tokenizer.chat_template = TOOL_DECLARATIONS[tool_declarations]
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=size.hidden_size,
        intermediate_size=size.intermediate_size,
        num_hidden_layers=size.num_hidden_layers,
        num_attention_heads=size.num_attention_heads,
        num_key_value_heads=size.num_key_value_heads,
        max_position_embeddings=size.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(END_OF_TEXT),
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model: Any = Qwen2ForCausalLM(config)
        if tool_call_training is not None:
            fine_tune_on_transcripts(
                model,
                tokenizer,
                transcripts,
                steps=tool_call_training.steps,
                batch_size=tool_call_training.batch_size,
                learning_rate=tool_call_training.learning_rate,
                seed=seed,
            )
    model.eval()
    model.generation_config.eos_token_id = [config.eos_token_id, tokenizer.eos_token_id]
    model.generation_config.pad_token_id = config.pad_token_id
    model.generation_config.bos_token_id = None

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    write_atomically(out, write)
    return out


def tiny_model_digest(
    *,
    seed: int = 0,
    size: TinyModelSize | None = None,
    tool_call_training: ToolCallTraining | None = None,
) -> str:
    """sha256 of what a build depends on: its arguments, the code that makes the model and its
    transcripts (this module, the agent's tools and system prompt, the demo family's bug pool)
    and the versions of torch, transformers and tokenizers."""
    import tokenizers
    import transformers

    import training.lm.conversation
    from tasks_lib.sources.families.demo import mutate, pool

    digest = hashlib.sha256()
    for part in (
        repr((seed, size or TinyModelSize(), tool_call_training)),
        torch.__version__,
        transformers.__version__,
        tokenizers.__version__,
    ):
        digest.update(part.encode() + b"\x1f")
    for module in (__file__, training.lm.conversation.__file__, mutate.__file__, pool.__file__):
        digest.update(Path(module).read_bytes())
    return digest.hexdigest()


def cached_tiny_model(
    cache_dir: str | Path,
    *,
    seed: int = 0,
    size: TinyModelSize | None = None,
    tool_call_training: ToolCallTraining | None = None,
) -> Path:
    """`build_tiny_model` once per `tiny_model_digest` under `cache_dir`, then the same directory
    every time (`cache_dir/tiny-<digest>`): the fine-tune is minutes of CPU, the tests and the
    benchmark need it often. Processes building at once each build in their own directory; the
    first to rename its build into place wins, the others use it."""
    digest = tiny_model_digest(seed=seed, size=size, tool_call_training=tool_call_training)
    where = Path(cache_dir) / f"tiny-{digest[:16]}"
    if (where / "config.json").is_file():
        return where
    where.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=where.parent))
    try:
        built = build_tiny_model(
            staging / "model", seed=seed, size=size, tool_call_training=tool_call_training
        )
        try:
            built.rename(where)
        except OSError:
            if not (where / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return where


def parameter_count(model_dir: str | Path) -> int:
    """Parameters of the model saved in `model_dir` (tied embeddings counted once)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    return sum(parameter.numel() for parameter in model.parameters())


# -- the tokenizer ------------------------------------------------------------------------------

_QWEN2_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"""
    r"""|\s*[\r\n]+|\s+(?!\S)|\s+"""
)


def _train_tokenizer(transcripts: Sequence[Transcript], vocab_size: int) -> Any:
    """A byte-level BPE tokenizer trained on the project's task code and tool-calling
    transcripts, wrapped as a transformers fast tokenizer carrying the chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    # Qwen2's pipeline exactly (NFC, its split pattern, byte-level): `AutoTokenizer` rebuilds a
    # `qwen2` model's tokenizer from the vocabulary and merges with this pipeline, so training
    # with any other one would give ids that differ from what every loader computes. Byte-level,
    # so every string encodes (no unknown token) and decode(encode(text)) == NFC(text).
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = normalizers.NFC()
    bpe.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_tokenizer_corpus(transcripts), trainer=trainer)
    trained = json.loads(bpe.to_str())["model"]
    # The class loaders instantiate for a `qwen2` config, built from the trained vocabulary and
    # merges: what is saved is what every `from_pretrained` gets back.
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(merge) for merge in trained["merges"]],  # type: ignore[misc]
        unk_token=None,  # type: ignore[arg-type]  # byte-level: no token is unknown
        bos_token=None,
        eos_token=IM_END,
        pad_token=END_OF_TEXT,
        additional_special_tokens=[IM_START],
        model_max_length=TinyModelSize().max_position_embeddings,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.add_tokens(list(MARKUP_TOKENS), special_tokens=False)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def _tokenizer_corpus(transcripts: Sequence[Transcript]) -> Iterator[str]:
    """Text the BPE merges are learnt from: the task families' source (the code the agent reads
    and edits) and rendered tool-calling transcripts (schemas, tool-call JSON, observations)."""
    import tasks_lib.sources.families

    families_dir = Path(tasks_lib.sources.families.__file__).parent
    for path in sorted(families_dir.rglob("*.py")):
        yield path.read_text()
    for transcript in transcripts:
        for message in transcript.messages:
            if message.get("content"):
                yield str(message["content"])
            for call in message.get("tool_calls") or ():
                function = call["function"]
                yield f'{{"name": "{function["name"]}", "arguments": {function["arguments"]}}}'
    for schema in transcripts[0].tools if transcripts else ():
        yield json.dumps(schema)


# -- synthetic tool-calling transcripts ---------------------------------------------------------


def tool_call_transcripts(count: int, seed: int = 0) -> list[Transcript]:
    """`count` synthetic agent conversations over demo-family bugs, in the agent loop's tool
    vocabulary: run the tests, read the buggy module, replace the buggy line with the fix, run
    the tests again, submit. The package, module and bug come from the demo family's pool and
    mutation operators; the instruction and the observations have the shapes the demo tasks and
    the sandbox produce (pytest output with `[exit code N]`, file text, `edited PATH`).
    Deterministic in (count, seed).

    They teach a random model the tool-call format, not how to find bugs: the fix is copied
    from the record of the injected bug."""
    from tasks_lib.sources.families.demo.mutate import find_mutations
    from tasks_lib.sources.families.demo.pool import MODULES, PACKAGE_NAMES
    from training.lm.conversation import SYSTEM_PROMPT, TOOL_SCHEMAS

    rng = random.Random(f"rollyard-tiny-transcripts:{seed}")
    mutations = {name: find_mutations(spec.source, name) for name, spec in sorted(MODULES.items())}
    transcripts: list[Transcript] = []
    while len(transcripts) < count:
        module = rng.choice(sorted(mutations))
        mutation = rng.choice(mutations[module])
        original = MODULES[module].source
        buggy = mutation.apply(original)
        edit = _unique_line_edit(original, buggy, mutation.start, mutation.end)
        if edit is None:
            continue
        old_text, new_text = edit
        package = rng.choice(PACKAGE_NAMES)
        module_path = f"{package}/{module}.py"
        failing_tests = [
            f"tests/test_{module}.py::test_{mutation.function}_{number}"
            for number in sorted(rng.sample(range(4), k=rng.randint(1, 3)))
        ]
        passing_count = rng.randint(4, 30)
        total = len(failing_tests) + passing_count
        failing_lines = "\n".join(f"FAILED {test_id} - AssertionError" for test_id in failing_tests)
        listed = "\n".join(f"- `{test_id}`" for test_id in failing_tests)
        instruction = (
            f"# Fix the bugs in `{package}`\n\n"
            f"`{package}` is a small Python package (`{module_path}`) with a pytest suite in "
            "`tests/`.\nEach function's docstring states what it should do. These tests "
            f"currently fail:\n\n{listed}\n\nFix the package so the whole suite passes. Run it "
            "with:\n\n    python -m pytest tests\n"
        )
        first_run = (
            f"{'F' * len(failing_tests)}{'.' * passing_count}    [100%]\n{failing_lines}\n"
            f"{len(failing_tests)} failed, {passing_count} passed in {rng.uniform(0.02, 0.3):.2f}s"
            "\n[exit code 1]"
        )
        second_run = f"{'.' * total}    [100%]\n{total} passed in {rng.uniform(0.02, 0.3):.2f}s\n[exit code 0]"
        test_command = rng.choice(("python -m pytest tests", "python -m pytest -q tests"))
        steps: list[tuple[str, dict[str, str], str]] = [
            ("run_command", {"command": test_command}, first_run),
            ("read_file", {"path": module_path}, buggy),
            (
                "edit_file",
                {"path": module_path, "old_text": old_text, "new_text": new_text},
                f"edited {module_path}",
            ),
            ("run_command", {"command": test_command}, second_run),
        ]
        messages: list[dict[str, Any]] = [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": instruction},
        ]
        for number, (name, arguments, observation) in enumerate(steps):
            call_id = f"call_{number}"
            messages.append(_assistant_tool_call(call_id, name, arguments))
            messages.append({"role": "tool", "tool_call_id": call_id, "content": observation})
        messages.append(_assistant_tool_call(f"call_{len(steps)}", "submit", {}))
        transcripts.append(Transcript(tuple(messages), tuple(TOOL_SCHEMAS)))
    return transcripts


def _assistant_tool_call(call_id: str, name: str, arguments: dict[str, str]) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": call_id,
                "type": "function",
                "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
            }
        ],
    }


def _unique_line_edit(original: str, buggy: str, start: int, end: int) -> tuple[str, str] | None:
    """The buggy line(s) around a mutation and their fixed form, grown until the buggy text
    occurs once in the buggy module (as `edit_file` requires); None if it never does."""
    line_start = original.rfind("\n", 0, start) + 1
    line_end = original.find("\n", end)
    line_end = len(original) if line_end < 0 else line_end
    shift = len(buggy) - len(original)
    for _ in range(4):
        fixed = original[line_start:line_end]
        broken = buggy[line_start : line_end + shift]
        if buggy.count(broken) == 1:
            return broken, fixed
        line_start = original.rfind("\n", 0, max(line_start - 1, 0)) + 1
    return None


# -- the fine-tune ------------------------------------------------------------------------------


def transcript_token_ids(tokenizer: Any, transcript: Transcript) -> tuple[list[int], list[bool]]:
    """The token ids of a rendered transcript and, per token, whether the model produced it
    (the assistant's replies, each ending with `<|im_end|>`), built turn by turn exactly as
    generation sees them: the prompt rendered with the generation prompt, then the reply."""
    messages = list(transcript.messages)
    tools = list(transcript.tools)
    ids: list[int] = []
    trained: list[bool] = []
    rendered = ""
    for index, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        prompt = tokenizer.apply_chat_template(
            messages[:index], tools=tools, add_generation_prompt=True, tokenize=False
        )
        full = tokenizer.apply_chat_template(messages[: index + 1], tools=tools, tokenize=False)
        if not prompt.startswith(rendered) or not full.startswith(prompt):
            raise ModelDirError("the chat template does not render conversations prefix-stably")
        reply = full[len(prompt) :]
        if not reply.endswith(IM_END + "\n"):
            raise ModelDirError(f"an assistant turn must render ending with {IM_END!r}")
        prompt_ids = tokenizer.encode(prompt[len(rendered) :], add_special_tokens=False)
        reply_ids = tokenizer.encode(reply[: -len("\n")], add_special_tokens=False)
        ids += prompt_ids + reply_ids
        trained += [False] * len(prompt_ids) + [True] * len(reply_ids)
        rendered = full[: -len("\n")]
    return ids, trained


def fine_tune_on_transcripts(
    model: Any,
    tokenizer: Any,
    transcripts: Sequence[Transcript],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    threads: int | None = 1,
    context_first_steps: int = 0,
    context_first_learning_rate: float | None = None,
) -> list[float]:
    """Supervised fine-tune on the assistant tokens of `transcripts` (AdamW, 10-step warm-up,
    cosine decay) for exactly `steps` steps; returns the loss of every step. The result depends
    on the step budget alone, never on how busy the machine is: `threads` (1 by default, None:
    torch's own count) is fixed for the run because thread counts change the order of
    floating-point sums.

    The first `context_first_steps` steps train only the tokens `context_dependent_tokens`
    marks, those that must be read from the prompt or the tool results. A model with no
    pretraining (every tiny model) otherwise learns the replies' fixed tokens first, and its
    attention settles on them. Measured on the `flags` family (1.26 M parameters, batch 16):
    600 steps on every token left the flag name at chance on held-out transcripts; 100
    context-first steps put it at 88-100% and left the flag's value at chance; 300 can learn
    both (a plateau: at a peak rate of 3e-3 one transcript order left it by step 100, another
    not in 300; at 1e-3 both did by step ~100). The steps on every token then undo the value
    at 3e-3 and keep it at 1e-3 (`context_first_learning_rate` sets the first phase's rate
    apart from `learning_rate`; `benchmarks/README.md`, "Language-model learning")."""
    threads_before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _fine_tune_steps(
            model,
            tokenizer,
            transcripts,
            steps=steps,
            batch_size=batch_size,
            learning_rate=learning_rate,
            seed=seed,
            context_first_steps=context_first_steps,
            context_first_learning_rate=context_first_learning_rate or learning_rate,
        )
    finally:
        torch.set_num_threads(threads_before)


def _fine_tune_steps(
    model: Any,
    tokenizer: Any,
    transcripts: Sequence[Transcript],
    *,
    steps: int,
    batch_size: int,
    learning_rate: float,
    seed: int,
    context_first_steps: int,
    context_first_learning_rate: float,
) -> list[float]:
    encoded = [transcript_token_ids(tokenizer, transcript) for transcript in transcripts]
    # Transcripts with no context-dependent token sit the first phase out; if none has one (a
    # single transcript, or replies that never vary), every step trains every token.
    encoded_first = encoded
    if context_first_steps:
        encoded_first = [
            (ids, dependent)
            for (ids, _), dependent in zip(encoded, context_dependent_tokens(encoded), strict=True)
            if any(dependent)
        ] or encoded
    pad_id = tokenizer.pad_token_id
    # beta2 0.95, as language models are trained (torch's default is 0.999): with 0.999 the
    # second-moment estimate remembers the first steps' large gradients for hundreds of steps,
    # which starves the context-dependent tokens' small ones. Measured on `flags` (300
    # transcripts, 100 context-first steps of 300): held-out name accuracy 16% with 0.999
    # (chance: 12.5%), 100% with 0.95.
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=learning_rate, betas=(0.9, 0.95), weight_decay=0.0
    )
    order = random.Random(f"rollyard-tiny-order:{seed}")
    model.train()
    losses: list[float] = []
    for step in range(steps):
        pool = encoded_first if step < context_first_steps else encoded
        batch = order.sample(pool, k=min(batch_size, len(pool)))
        length = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), length), pad_id, dtype=torch.long)
        labels = torch.full((len(batch), length), -100, dtype=torch.long)
        attention = torch.zeros((len(batch), length), dtype=torch.long)
        for row, (ids, trained) in enumerate(batch):
            tensor = torch.tensor(ids, dtype=torch.long)
            input_ids[row, : len(ids)] = tensor
            attention[row, : len(ids)] = 1
            labels[row, : len(ids)] = torch.where(
                torch.tensor(trained), tensor, torch.full_like(tensor, -100)
            )
        for group in optimizer.param_groups:
            peak = context_first_learning_rate if step < context_first_steps else learning_rate
            group["lr"] = peak * phase_lr_factor(step, steps, context_first_steps)
        loss = _assistant_token_loss(model, input_ids, attention, labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()  # type: ignore[no-untyped-call]
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses


def phase_lr_factor(step: int, steps: int, context_first_steps: int) -> float:
    """The learning rate's factor at `step` of a fine-tune: each phase (the context-first steps,
    then the rest) warms up over 10 steps and decays on a cosine of its own. With one cosine
    over both, the second phase, which starts on tokens never trained, ran at a fraction of the
    rate and ended far from converged (`flags`, 200 of 400 steps context-first: loss 0.13 at
    the end; 300 of 600 with a schedule per phase: under 0.001)."""
    start, length = (
        (0, context_first_steps)
        if step < context_first_steps
        else (context_first_steps, steps - context_first_steps)
    )
    local = step - start
    return min(1.0, (local + 1) / 10) * 0.5 * (1 + math.cos(math.pi * local / length))


def context_dependent_tokens(
    encoded: Sequence[tuple[list[int], list[bool]]],
) -> list[list[bool]]:
    """Per transcript (token ids, trained mask), the trained tokens that the reply so far does
    not determine: after the same turn number and the same reply tokens, the transcripts go on
    with different tokens, so the token can only come from the prompt or the tool results (a
    file name, a value the instruction gives). The others (the call's JSON, a tool name every
    transcript uses there) the reply's own beginning decides."""
    followers: dict[tuple[int, tuple[int, ...]], set[int]] = {}
    keyed: list[list[tuple[int, tuple[int, ...]] | None]] = []
    for ids, trained in encoded:
        keys: list[tuple[int, tuple[int, ...]] | None] = []
        turn, reply_start = -1, None
        for position, (token, in_reply) in enumerate(zip(ids, trained, strict=True)):
            if not in_reply:
                reply_start = None
                keys.append(None)
                continue
            if reply_start is None:
                turn, reply_start = turn + 1, position
            key = (turn, tuple(ids[reply_start:position]))
            followers.setdefault(key, set()).add(token)
            keys.append(key)
        keyed.append(keys)
    return [[key is not None and len(followers[key]) > 1 for key in keys] for keys in keyed]


def _assistant_token_loss(
    model: Any, input_ids: torch.Tensor, attention: torch.Tensor, labels: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy of the trained tokens (right-padded rows, `labels` -100 elsewhere).

    Two savings that leave the loss as it is: the prefix every row shares (the system prompt
    and the tools' schemas, a third of a transcript) runs once and its keys and values are
    shared by the rows; the output layer runs only at positions that predict a trained token
    (the vocabulary-wide matmul over every position would dominate the cost)."""
    from transformers import DynamicCache

    batch, length = input_ids.shape
    differs = (input_ids != input_ids[:1]).any(dim=0) | (attention == 0).any(dim=0)
    trained = (labels != -100).any(dim=0)
    stops = torch.nonzero(differs | trained)
    # The shared prefix ends before the first column where rows differ or a token trains (that
    # token is predicted by the position before it, which must be in the per-row part).
    shared = int(stops[0]) - 1 if len(stops) else length - 1
    if shared < 1:
        hidden = model.model(input_ids=input_ids, attention_mask=attention).last_hidden_state
        targets = labels[:, 1:]
        hidden = hidden[:, :-1]
    else:
        prefix = model.model(input_ids=input_ids[:1, :shared], use_cache=True).cache
        cache = DynamicCache(
            ddp_cache_data=[
                (keys.expand(batch, -1, -1, -1), values.expand(batch, -1, -1, -1))
                for keys, values, *_ in prefix
            ]
        )
        positions = torch.arange(shared, length).expand(batch, -1)
        hidden = model.model(
            input_ids=input_ids[:, shared:],
            attention_mask=attention,
            position_ids=positions,
            cache=cache,
        ).last_hidden_state[:, :-1]
        targets = labels[:, shared + 1 :]
    predicting = targets != -100
    logits = model.lm_head(hidden[predicting])
    return torch.nn.functional.cross_entropy(logits.float(), targets[predicting])
