"""rollyard's small-scale OpenAI-compatible server, for tests and CPU runs: it serves a local
Hugging Face causal LM through `LocalGenerator`; production serves models with vLLM or SGLang.

The wire format is the OpenAI chat-completions API with vLLM's extras for token-in/token-out
(`return_token_ids: true` puts `prompt_token_ids` on the response and `token_ids` on each
choice; `return_tokens_as_token_ids: true` names logprob tokens `token_id:N`), tool calls parsed
from the model's `<tool_call>` blocks as vLLM's `hermes` parser does, and errors as vLLM's
`{"error": {"message", "type", "param", "code"}}` body. Concurrent requests are grouped into one
forward batch (`BatchingGenerator`). LoRA adapters load and unload at runtime through vLLM's
endpoints (`POST /v1/load_lora_adapter {"lora_name", "lora_path"}`, `POST
/v1/unload_lora_adapter {"lora_name"}`, as vLLM serves them with
`VLLM_ALLOW_RUNTIME_LORA_UPDATING=True --enable-lora`); a request names an adapter as its
`model`, and `/v1/models` lists adapters with the base model as their parent.

    python -m training.lm.server --model DIR --host 127.0.0.1 --port 8000 \\
        [--served-model-name NAME] [--extra-latency-ms MS] [--max-batch-size N]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse
from pydantic import BaseModel, ConfigDict, Field

from training.errors import (
    ContextLengthError,
    LanguageModelError,
    ModelDirError,
    ServerRequestError,
)
from training.lm.generate import (
    BatchingGenerator,
    Completion,
    LocalGenerator,
    Prompt,
    SamplingParams,
)

MAX_CHOICES = 16


# -- the request (the trust boundary) -----------------------------------------------------------


class _Strict(BaseModel):
    # OpenAI clients send optional fields this server has no use for (user, metadata, ...):
    # they are ignored, as vLLM ignores them; fields it cannot honour are rejected below.
    model_config = ConfigDict(extra="ignore")


class FunctionCallIn(_Strict):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCallIn(_Strict):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCallIn


class ContentPart(_Strict):
    type: Literal["text"]
    text: str


class MessageIn(_Strict):
    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None
    name: str | None = None


class FunctionIn(_Strict):
    name: str = Field(min_length=1)
    description: str | None = None
    parameters: dict[str, Any] | None = None


class ToolIn(_Strict):
    type: Literal["function"] = "function"
    function: FunctionIn


class NamedToolChoice(_Strict):
    type: Literal["function"] = "function"
    function: FunctionCallIn | dict[str, Any]


class ChatCompletionRequest(_Strict):
    model: str
    messages: list[MessageIn] = Field(min_length=1)
    tools: list[ToolIn] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    temperature: float = Field(default=1.0, ge=0, le=2)
    top_p: float = Field(default=1.0, gt=0, le=1)
    max_tokens: int | None = Field(default=None, ge=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    seed: int | None = None
    n: int = Field(default=1, ge=1, le=MAX_CHOICES)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    return_token_ids: bool = False
    return_tokens_as_token_ids: bool = False
    stream: bool = False
    stop: str | list[str] | None = None


class LoadLoraAdapterRequest(_Strict):
    lora_name: str = Field(min_length=1)
    lora_path: str = Field(min_length=1)
    load_inplace: bool = False


class UnloadLoraAdapterRequest(_Strict):
    lora_name: str = Field(min_length=1)


# -- errors -------------------------------------------------------------------------------------


_ERROR_TYPES = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}


def _error_response(status: int, message: str, param: str | None = None) -> JSONResponse:
    body = {
        "error": {
            "message": message,
            "type": _ERROR_TYPES.get(status, "Error"),
            "param": param,
            "code": status,
        }
    }
    return JSONResponse(body, status_code=status)


def _validation_message(error: RequestValidationError) -> str:
    problems = []
    for item in error.errors()[:3]:
        where = ".".join(str(part) for part in item.get("loc", ()) if part != "body")
        problems.append(f"{where or 'body'}: {item.get('msg', 'invalid')}")
    return "invalid request: " + "; ".join(problems)


# -- the app ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class ServerOptions:
    served_model_name: str
    extra_latency_ms: float = 0.0
    """Added to every chat completion before it is answered (not while the model runs): stands
    for a remote GPU server's latency in benchmarks."""
    max_batch_size: int = 16
    enable_auto_tool_choice: bool = True
    """Off, tools with `tool_choice: auto` are refused as vLLM refuses them without
    `--enable-auto-tool-choice --tool-call-parser` (so clients can test that answer)."""


@dataclasses.dataclass(slots=True)
class _ServedModel:
    generator: LocalGenerator
    batcher: BatchingGenerator
    root: str
    """The base model's name, or the adapter's directory."""
    parent: str | None
    """The base model's name, for an adapter."""


def create_app(generator: LocalGenerator, options: ServerOptions) -> FastAPI:
    """The FastAPI app serving `generator` under `options.served_model_name`, and LoRA adapters
    of it loaded at run time under their own names (vLLM's adapter endpoints)."""
    base_name = options.served_model_name
    served = {
        base_name: _ServedModel(
            generator,
            BatchingGenerator(generator, max_batch_size=options.max_batch_size),
            root=base_name,
            parent=None,
        )
    }
    adapters_lock = asyncio.Lock()
    finished_batch_sizes: list[int] = []
    app = FastAPI(title="rollyard small-scale OpenAI-compatible server")
    created = int(time.time())

    def close_all() -> None:
        for model in served.values():
            model.batcher.close()

    app.router.add_event_handler("shutdown", close_all)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        return _error_response(400, _validation_message(error))

    @app.exception_handler(ServerRequestError)
    async def _api_error(request: Request, error: ServerRequestError) -> JSONResponse:
        return _error_response(error.status, error.message, error.param)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        """How requests were grouped (not part of the OpenAI API): batches run and their sizes,
        over every model served since the start."""
        sizes = finished_batch_sizes + [
            size for model in served.values() for size in model.batcher.batch_sizes
        ]
        return {
            "batches": len(sizes),
            "generations": sum(sizes),
            "max_batch_size": max(sizes, default=0),
        }

    @app.get("/v1/models")
    async def models() -> dict[str, Any]:
        return {
            "object": "list",
            "data": [
                {
                    "id": name,
                    "object": "model",
                    "created": created,
                    "owned_by": "rollyard",
                    "root": model.root,
                    "parent": model.parent,
                    "max_model_len": model.generator.max_context_tokens,
                }
                for name, model in served.items()
            ],
        }

    @app.post("/v1/chat/completions")
    async def chat_completions(request: ChatCompletionRequest) -> dict[str, Any]:
        model = served.get(request.model)
        if model is None:
            raise ServerRequestError(404, f"The model `{request.model}` does not exist.", "model")
        prompts = _prompts(model.generator, request, options)
        futures = [asyncio.wrap_future(model.batcher.submit(prompt)) for prompt in prompts]
        completions = await asyncio.gather(*futures)
        if options.extra_latency_ms:
            await asyncio.sleep(options.extra_latency_ms / 1000)
        return _response(model.generator, request, request.model, completions)

    @app.post("/v1/load_lora_adapter")
    async def load_lora_adapter(request: LoadLoraAdapterRequest) -> PlainTextResponse:
        name = request.lora_name
        if name == base_name:
            raise ServerRequestError(
                400, f"The lora adapter '{name}' conflicts with a served base model.", "lora_name"
            )
        async with adapters_lock:
            if name in served and not request.load_inplace:
                raise ServerRequestError(
                    400,
                    f"The lora adapter '{name}' has already been loaded. If you want to load "
                    "the adapter in place, set 'load_inplace' to True.",
                    "lora_name",
                )
            if not Path(request.lora_path).is_dir():
                raise ServerRequestError(
                    404, f"Loading lora {name} failed: No adapter found for {request.lora_path}"
                )
            try:
                adapted = await asyncio.to_thread(
                    served[base_name].generator.with_lora_adapter, request.lora_path, name=name
                )
            except ModelDirError as error:
                raise ServerRequestError(400, str(error), "lora_path") from error
            previous = served.get(name)
            served[name] = _ServedModel(
                adapted,
                BatchingGenerator(adapted, max_batch_size=options.max_batch_size),
                root=request.lora_path,
                parent=base_name,
            )
            if previous is not None:
                # Requests already queued on the old weights finish on them.
                await asyncio.to_thread(previous.batcher.close)
                finished_batch_sizes.extend(previous.batcher.batch_sizes)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' added successfully.")

    @app.post("/v1/unload_lora_adapter")
    async def unload_lora_adapter(request: UnloadLoraAdapterRequest) -> PlainTextResponse:
        name = request.lora_name
        async with adapters_lock:
            if name == base_name or name not in served:
                raise ServerRequestError(
                    404, f"The lora adapter '{name}' cannot be found.", "lora_name"
                )
            removed = served.pop(name)
            await asyncio.to_thread(removed.batcher.close)
            finished_batch_sizes.extend(removed.batcher.batch_sizes)
        return PlainTextResponse(f"Success: LoRA adapter '{name}' removed successfully.")

    return app


def _prompts(
    generator: LocalGenerator, request: ChatCompletionRequest, options: ServerOptions
) -> list[Prompt]:
    if request.stream:
        raise ServerRequestError(
            400, "stream: true is not supported by this server; send stream: false"
        )
    if request.stop:
        raise ServerRequestError(
            400, "stop sequences are not supported by this server; leave stop unset"
        )
    if request.tools and request.tool_choice not in (None, "auto", "none"):
        raise ServerRequestError(
            400,
            "tool_choice 'required' and named tool choices need constrained decoding, which this "
            "server does not do; use tool_choice 'auto' (or leave it unset)",
            "tool_choice",
        )
    if request.tools and request.tool_choice != "none" and not options.enable_auto_tool_choice:
        raise ServerRequestError(
            400,
            '"auto" tool choice requires --enable-auto-tool-choice and --tool-call-parser to be set',
            "tool_choice",
        )
    if request.top_logprobs and not request.logprobs:
        raise ServerRequestError(400, "top_logprobs needs logprobs: true", "top_logprobs")
    messages = [_template_message(message) for message in request.messages]
    tools = [tool.model_dump(exclude_none=True) for tool in request.tools or ()]
    max_tokens = request.max_completion_tokens or request.max_tokens
    prompts = []
    try:
        for choice in range(request.n):
            sampling = SamplingParams(
                temperature=request.temperature,
                top_p=request.top_p,
                max_tokens=max_tokens,
                # Choice i of a seeded request draws with seed + i: the n choices differ and
                # each is reproducible.
                seed=None if request.seed is None else request.seed + choice,
                top_logprobs=request.top_logprobs or 0,
            )
            prompts.append(generator.prompt(messages, tools or None, sampling))
    except ContextLengthError as error:
        raise ServerRequestError(400, str(error), "messages") from error
    except LanguageModelError as error:
        raise ServerRequestError(400, str(error), "messages") from error
    return prompts


def _template_message(message: MessageIn) -> dict[str, Any]:
    """An OpenAI message as the chat template reads it: text content, tool calls verbatim."""
    if isinstance(message.content, list):
        content: str | None = "".join(part.text for part in message.content)
    else:
        content = message.content
    rendered: dict[str, Any] = {"role": message.role, "content": content}
    if message.role == "tool":
        rendered["content"] = content or ""
        rendered["tool_call_id"] = message.tool_call_id
    elif message.role in ("system", "user"):
        rendered["content"] = content or ""
    if message.tool_calls:
        rendered["tool_calls"] = [call.model_dump() for call in message.tool_calls]
    return rendered


def _response(
    generator: LocalGenerator,
    request: ChatCompletionRequest,
    model_name: str,
    completions: Sequence[Completion],
) -> dict[str, Any]:
    parse_tools = bool(request.tools) and request.tool_choice != "none"
    choices = []
    for index, completion in enumerate(completions):
        # As vLLM's hermes parser: a reply whose tool-call blocks do not all parse comes back
        # as plain content (the model's whole text), with no tool calls.
        use_calls = parse_tools and completion.tool_calls and not completion.malformed_tool_calls
        message: dict[str, Any] = {"role": "assistant"}
        if use_calls:
            message["content"] = completion.content
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in completion.tool_calls
            ]
        else:
            message["content"] = completion.text
        finish = completion.finish_reason
        if finish == "tool_calls" and not use_calls:
            finish = "stop"
        choices.append(
            {
                "index": index,
                "message": message,
                "logprobs": _logprobs(generator, completion, request) if request.logprobs else None,
                "finish_reason": finish,
                "stop_reason": None,
                "token_ids": list(completion.token_ids) if request.return_token_ids else None,
            }
        )
    prompt_tokens = len(completions[0].prompt_token_ids)
    completion_tokens = sum(len(completion.token_ids) for completion in completions)
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model_name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
        "prompt_token_ids": (
            list(completions[0].prompt_token_ids) if request.return_token_ids else None
        ),
    }


def _logprobs(
    generator: LocalGenerator, completion: Completion, request: ChatCompletionRequest
) -> dict[str, Any]:
    def entry(token_id: int, logprob: float) -> dict[str, Any]:
        text = generator.tokenizer.decode([token_id])
        token = f"token_id:{token_id}" if request.return_tokens_as_token_ids else text
        return {"token": token, "logprob": logprob, "bytes": list(text.encode())}

    content = []
    for token_id, logprob, alternatives in zip(
        completion.token_ids, completion.logprobs, completion.top_logprobs, strict=True
    ):
        item = entry(token_id, logprob)
        item["top_logprobs"] = [entry(alt.token_id, alt.logprob) for alt in alternatives]
        content.append(item)
    return {"content": content}


# -- the command line ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m training.lm.server",
        description="rollyard's small-scale OpenAI-compatible server (tests and CPU runs; "
        "production uses vLLM or SGLang).",
    )
    parser.add_argument("--model", required=True, help="Hugging Face causal-LM directory")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--served-model-name", help="name clients ask for (default: DIR's name)")
    parser.add_argument(
        "--extra-latency-ms",
        type=float,
        default=0.0,
        help="add this much to every answer (stands for a remote GPU server in benchmarks)",
    )
    parser.add_argument("--max-batch-size", type=int, default=16)
    parser.add_argument(
        "--disable-auto-tool-choice",
        action="store_true",
        help="refuse tools with tool_choice auto, as vLLM does without its tool-call flags",
    )
    args = parser.parse_args(argv)
    if args.extra_latency_ms < 0 or args.max_batch_size < 1:
        parser.error("--extra-latency-ms must be >= 0 and --max-batch-size >= 1")
    try:
        generator = LocalGenerator.from_pretrained(Path(args.model))
    except ModelDirError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    options = ServerOptions(
        served_model_name=args.served_model_name or Path(args.model).name,
        extra_latency_ms=args.extra_latency_ms,
        max_batch_size=args.max_batch_size,
        enable_auto_tool_choice=not args.disable_auto_tool_choice,
    )
    import uvicorn

    uvicorn.run(create_app(generator, options), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
