"""Where the language-model trainer's weights live: loading a trainable model (full or LoRA),
writing each update's Hugging Face directory atomically, the paths a checkpoint records, and the
server that takes each new LoRA adapter at runtime (`ServedAdapters`)."""

from __future__ import annotations

import dataclasses
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch

from training.errors import TrainerError
from training.lm.grpo_config import LoraSettings


@dataclasses.dataclass(frozen=True, slots=True)
class ServedAdapters:
    """The server an `openai:` policy talks to, which takes each new LoRA adapter at runtime:
    vLLM started with `--enable-lora` and `VLLM_ALLOW_RUNTIME_LORA_UPDATING=True`, or rollyard's
    small-scale server (`training.lm.server`), serving the base model the trainer starts from."""

    base_url: str
    """The API root, e.g. `http://127.0.0.1:8000/v1`."""
    base_model: str
    """The served base model's name."""

    def load(self, lora_name: str, adapter_dir: Path) -> None:
        """`POST /v1/load_lora_adapter`; an adapter already loaded under the name is kept (a
        resumed run loads its last adapter again)."""
        import httpx

        try:
            response = httpx.post(
                f"{self.base_url}/load_lora_adapter",
                json={"lora_name": lora_name, "lora_path": str(adapter_dir)},
                timeout=120.0,
            )
        except httpx.TransportError as error:
            raise TrainerError(
                f"cannot load adapter {lora_name} into {self.base_url}: {error}"
            ) from error
        if response.status_code == 400 and "already been loaded" in response.text:
            return
        if response.status_code != 200:
            raise TrainerError(
                f"{self.base_url}/load_lora_adapter answered {response.status_code} for "
                f"{lora_name}: {response.text[:300]}; start vLLM with --enable-lora and "
                "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True"
            )


def write_atomically(out: Path, write: Any) -> None:
    """Call `write(directory)` on a fresh directory beside `out`, then move it into place."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        write(partial)
        if out.exists():
            shutil.rmtree(out)
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise


def load_trainable_model(
    model_dir: str | Path,
    *,
    adapter_dir: Path | None,
    lora: LoraSettings | None,
    weights_from: Path | None = None,
) -> tuple[Any, Any]:
    """Model (trainable) and tokenizer: full weights from `weights_from` (or `model_dir`); under
    LoRA the base from `model_dir` with the adapter of `adapter_dir`, or a fresh adapter."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    source = weights_from or Path(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(source)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    if lora is None:
        return model, tokenizer
    from peft import LoraConfig, PeftModel, get_peft_model

    if adapter_dir is not None:
        return PeftModel.from_pretrained(model, adapter_dir, is_trainable=True), tokenizer
    adapter = LoraConfig(
        r=lora.rank,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    return get_peft_model(model, adapter), tokenizer


def path_under_root(path: Path, root: Path) -> str:
    """`path` relative to the store root when inside it (the store can move), else absolute."""
    try:
        return str(path.resolve().relative_to(root))
    except ValueError:
        return str(path.resolve())


def resolve_under_root(path: str, root: Path) -> Path:
    candidate = Path(path)
    return candidate if candidate.is_absolute() else root / candidate
