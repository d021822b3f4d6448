"""A tiny tool-calling model, built once and cached on disk between test sessions (keyed by the
code and library versions that make it), and rollyard's small OpenAI-compatible server serving it
as a real subprocess on a loopback port."""

from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from training.lm.tiny import ToolCallTraining, cached_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED_MODEL_NAME = "tiny-agent"
SERVER_START_TIMEOUT_S = 180.0
MODEL_CACHE_VARIABLE = "ROLLYARD_TEST_CACHE"
"""Where built test models are kept (default: rollyard-test-cache in the temp directory)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LmServer:
    """A running `python -m training.lm.server`."""

    base_url: str
    """`http://127.0.0.1:PORT/v1` (what an `openai:` policy spec names)."""
    model: str
    """The served model name."""
    model_dir: Path
    process: subprocess.Popen[bytes]
    log_path: Path


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """A ~1 M-parameter Qwen2-architecture model fine-tuned to answer with well-formed
    `<tool_call>` blocks: a fixed step budget of minutes of CPU, so built once per code version
    and reused from the cache afterwards."""
    cache = (
        os.environ.get(MODEL_CACHE_VARIABLE) or Path(tempfile.gettempdir()) / "rollyard-test-cache"
    )
    return cached_tiny_model(cache, seed=0, tool_call_training=ToolCallTraining())


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def lm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmServer]:
    """The tiny model served over real HTTP by a server subprocess; stopped at session end."""
    port = _free_loopback_port()
    log_path = tmp_path_factory.mktemp("lm-server") / "server.log"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "training.lm.server",
                "--model",
                str(tiny_model_dir),
                "--host",
                "127.0.0.1",
                "--port",
                str(port),
                "--served-model-name",
                SERVED_MODEL_NAME,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + SERVER_START_TIMEOUT_S
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"the LM server exited with {process.returncode}:\n{log_path.read_text()}"
                )
            try:
                if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the LM server did not answer within {SERVER_START_TIMEOUT_S:.0f} s")
            time.sleep(0.2)
        yield LmServer(base_url, SERVED_MODEL_NAME, tiny_model_dir, process, log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
