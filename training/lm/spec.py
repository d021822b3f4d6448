"""The policy spec: which policy acts, in one string the CLI, the flows and the Python API share.

    builtin                      the built-in candidate scorer (the default)
    openai:BASE_URL#MODEL        a model behind an OpenAI-compatible server (vLLM, SGLang, ...)
    hf:DIR                       a local Hugging Face causal-LM directory, generated in-process

`parse_policy_spec` reads one into a frozen `PolicySpec` (a malformed one raises
`PolicySpecError`, exit 2); `check_policy_spec` confirms before any episode that the server
answers, serves the model (unreachable: exit 3; model not served: exit 2, naming the models it
serves) and accepts tools (`OpenAIPolicy.check`), or that the directory holds what a chat model
needs; `policy_from_spec` builds the policy.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from training.errors import PolicySpecError
from training.lm.conversation import ChatSampling
from training.policy import Policy

PolicyKind = Literal["builtin", "openai", "hf"]
SPEC_FORMS = "builtin, openai:BASE_URL#MODEL or hf:DIR"
_OPENAI_EXAMPLE = "openai:http://127.0.0.1:8000/v1#Qwen/Qwen2.5-0.5B-Instruct"


@dataclasses.dataclass(frozen=True, slots=True)
class PolicySpec:
    """A parsed policy spec; `str(spec)` gives its text back."""

    kind: PolicyKind
    base_url: str | None = None
    """`openai:` only: the server's API root, e.g. `http://127.0.0.1:8000/v1`."""
    model: str | None = None
    """`openai:` only: the model name the server serves."""
    model_dir: str | None = None
    """`hf:` only: the model directory."""

    def __str__(self) -> str:
        if self.kind == "openai":
            return f"openai:{self.base_url}#{self.model}"
        if self.kind == "hf":
            return f"hf:{self.model_dir}"
        return "builtin"


def parse_policy_spec(text: str) -> PolicySpec:
    """Read a policy spec; raises `PolicySpecError` saying what is wrong and what to write."""
    spec = text.strip()
    if spec == "builtin":
        return PolicySpec("builtin")
    kind, colon, rest = spec.partition(":")
    if kind == "openai" and colon:
        base_url, hash_sign, model = rest.partition("#")
        if not hash_sign or not model.strip():
            raise PolicySpecError(
                f"policy spec {text!r} names no model: write openai:BASE_URL#MODEL, "
                f"e.g. {_OPENAI_EXAMPLE}"
            )
        parts = urlsplit(base_url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise PolicySpecError(
                f"policy spec {text!r}: {base_url!r} is not an http(s) URL; write "
                f"openai:BASE_URL#MODEL, e.g. {_OPENAI_EXAMPLE}"
            )
        try:
            parts.port  # noqa: B018 - urlsplit checks the port only when asked
        except ValueError:
            raise PolicySpecError(
                f"policy spec {text!r}: the port of {base_url!r} is not a number in 0-65535"
            ) from None
        if any(c.isspace() for c in spec):
            raise PolicySpecError(f"policy spec {text!r} holds whitespace; URLs and names do not")
        return PolicySpec("openai", base_url=base_url.rstrip("/"), model=model)
    if kind == "hf" and colon:
        if not rest.strip():
            raise PolicySpecError(f"policy spec {text!r} names no directory: write hf:DIR")
        return PolicySpec("hf", model_dir=rest)
    raise PolicySpecError(f"policy spec {text!r} is not one of {SPEC_FORMS}")


_WEIGHT_FILES = (
    "model.safetensors",
    "adapter_model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def check_model_dir(model_dir: str | Path) -> None:
    """Raise `PolicySpecError` unless `model_dir` holds a config, weights, a tokenizer and a
    chat template (in `tokenizer_config.json` or `chat_template.jinja`)."""
    where = Path(model_dir)
    if not where.is_dir():
        raise PolicySpecError(f"hf:{model_dir}: no such directory")
    missing = []
    adapter = (where / "adapter_config.json").is_file()  # a LoRA adapter over its base model
    if not adapter and not (where / "config.json").is_file():
        missing.append("config.json")
    if not any((where / name).is_file() for name in _WEIGHT_FILES):
        missing.append("weights (model.safetensors or pytorch_model.bin)")
    if not any(
        (where / name).is_file() for name in ("tokenizer.json", "tokenizer.model", "vocab.json")
    ):
        missing.append("a tokenizer (tokenizer.json)")
    if not _has_chat_template(where):
        missing.append("a chat template (chat_template in tokenizer_config.json)")
    if missing:
        raise PolicySpecError(
            f"hf:{model_dir} is not a chat model directory: it lacks {', '.join(missing)}; "
            "save the model and its tokenizer with save_pretrained"
        )


def _has_chat_template(where: Path) -> bool:
    if (where / "chat_template.jinja").is_file() or (where / "chat_template.json").is_file():
        return True
    config = where / "tokenizer_config.json"
    if not config.is_file():
        return False
    try:
        return bool(json.loads(config.read_text()).get("chat_template"))
    except (ValueError, OSError):
        return False


def check_policy_spec(spec: PolicySpec) -> None:
    """Confirm, before any episode, that the policy a spec names can act (see module doc)."""
    if spec.kind == "openai":
        from training.lm.openai_policy import OpenAIPolicy

        assert spec.base_url is not None and spec.model is not None
        policy = OpenAIPolicy(spec.base_url, spec.model)
        try:
            policy.check()
        finally:
            policy.close()
    elif spec.kind == "hf":
        assert spec.model_dir is not None
        check_model_dir(spec.model_dir)


def policy_from_spec(
    spec: PolicySpec | str, *, sampling: ChatSampling | None = None, check: bool = True
) -> Policy:
    """The policy a spec names; `sampling` applies to chat policies (default `ChatSampling()`).
    `check` runs `check_policy_spec` first (an `openai:` policy then also takes its context
    window from the server)."""
    if isinstance(spec, str):
        spec = parse_policy_spec(spec)
    if spec.kind == "openai":
        from training.lm.openai_policy import OpenAIPolicy

        assert spec.base_url is not None and spec.model is not None
        policy = OpenAIPolicy(spec.base_url, spec.model, sampling=sampling)
        if check:
            policy.check()
        return policy
    if spec.kind == "hf":
        from training.lm.hf_policy import HFPolicy

        assert spec.model_dir is not None
        if check:
            check_model_dir(spec.model_dir)
        return HFPolicy(spec.model_dir, sampling=sampling)
    from training import CandidateScorerPolicy

    return CandidateScorerPolicy()
