"""The policy options every command that rolls out shares (`train`, `demo`, `evaluate`): the
policy spec, how many episodes a shard keeps in flight, and a chat policy's sampling."""

from __future__ import annotations

import argparse
from typing import Any

from flows.cli import MAX_IN_FLIGHT, float_between, int_between, positive_float_up_to
from flows.errors import CliError
from rollyard.errors import EXIT_USAGE

MAX_TEMPERATURE = 10.0
"""Past this every token is near-uniform noise."""
MAX_COMPLETION_TOKENS = 1 << 20
"""Beyond the context of any served model."""


def add_policy_options(parser: argparse.ArgumentParser, *, sampling: bool) -> None:
    """`--policy`, `--max-concurrent-requests` and, with `sampling`, a chat policy's
    `--temperature`, `--top-p` and `--max-tokens`."""
    parser.add_argument(
        "--policy",
        default="builtin",
        metavar="SPEC",
        help="builtin, openai:BASE_URL#MODEL (an OpenAI-compatible server: vLLM, "
        "SGLang; key from OPENAI_API_KEY) or hf:DIR (a local transformers model)",
    )
    parser.add_argument(
        "--max-concurrent-requests",
        type=int_between(1, MAX_IN_FLIGHT),
        default=1,
        metavar="N",
        help="episodes each shard keeps in flight, so a model server batches them",
    )
    if sampling:
        parser.add_argument(
            "--temperature",
            type=float_between(0.0, MAX_TEMPERATURE),
            default=1.0,
            help="a chat policy's sampling temperature (0: greedy)",
        )
        parser.add_argument(
            "--top-p",
            type=positive_float_up_to(1.0),
            default=1.0,
            help="a chat policy's nucleus sampling mass",
        )
        parser.add_argument(
            "--max-tokens",
            type=int_between(1, MAX_COMPLETION_TOKENS),
            default=512,
            help="completion tokens per turn",
        )


def sampling_from(args: argparse.Namespace) -> Any:
    """The `ChatSampling` the options name (exit 2 for values outside their ranges)."""
    from training.lm.conversation import ChatSampling

    try:
        return ChatSampling(
            temperature=args.temperature, top_p=args.top_p, max_tokens=args.max_tokens
        )
    except ValueError as error:
        raise CliError(f"--temperature/--top-p: {error}", EXIT_USAGE) from None
