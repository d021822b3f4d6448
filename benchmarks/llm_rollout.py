"""Language-model rollout throughput: episodes/s of one shard with 1 vs 16 episodes in flight
(`--max-concurrent-requests`) on the same tasks in one run, against the tiny model as served
here by `python -m training.lm.server` and against the same server answering 200 ms later
(`--extra-latency-ms 200`, standing for a remote GPU server, where latency dominates); and the
request-side overhead per turn of rollyard's `openai:` client against a bare `httpx` loop
sending the very same request bodies (against the server without added latency, where the
client's own cost weighs most). `--cases hf`: the same model in-process (`hf:`), 1 vs 8 in
flight, whose requests the policy's batcher runs as shared forward passes.

    python benchmarks/llm_rollout.py [--tasks 4] [--samples 4] [--max-steps 4]

Targets: (b) 16 in flight >= 8x the episodes/s of 1; client / bare httpx <= 1.1x per turn. The
tiny model's generation runs on this machine's cores, so (a) is bound by them and reported as
measured. Each side runs the shard function the flow's workers run (`rollout_shard_and_commit`:
bwrap sandboxes, verifier, store commit) in this process, so nothing but the concurrency differs.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVED_MODEL_NAME = "tiny-agent"


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


class Server:
    """`python -m training.lm.server` on a loopback port, stopped on exit."""

    def __init__(self, model_dir: Path, extra_latency_ms: float, log: Path) -> None:
        import httpx

        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}/v1"
        env = dict(os.environ, PYTHONPATH=str(REPO_ROOT))
        command = [
            sys.executable,
            "-m",
            "training.lm.server",
            "--model",
            str(model_dir),
            "--port",
            str(self.port),
            "--served-model-name",
            SERVED_MODEL_NAME,
            "--extra-latency-ms",
            str(extra_latency_ms),
        ]
        with log.open("wb") as out:
            self.process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"the server exited: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{self.base_url}/models", timeout=2).status_code == 200:
                    return
            except httpx.TransportError:
                time.sleep(0.3)
        raise SystemExit("the server did not answer within 300 s")

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)


def _process_cpu_s(pid: int) -> float:
    """User + system CPU seconds of process `pid` so far (its own threads, not its children)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """CPU seconds of this process, every thread. The sandboxes' processes are not in it, and
    RUSAGE_CHILDREN does not see them either (measured ~5 ms per episode, less than one pytest
    run): their cost shows only as the episodes' sandbox and verify seconds."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def episodes_per_s(
    server: Server | None,
    task_dirs: list[Path],
    store: Path,
    *,
    run_id: str,
    in_flight: int,
    args: Any,
    model_dir: Path | None = None,
) -> dict[str, float]:
    """One shard of every task x `samples`, `in_flight` episodes at once, with where the time
    went: CPU seconds per episode of the server and of this process (the episode threads and
    the client), and the longest episode against the mean (with
    every episode in one wave, the shard lasts as long as its longest episode). Without a
    server the policy is `hf:model_dir`, generating in this process."""
    import httpx

    from sandboxes import Limits, SandboxPool
    from training.episode import EpisodeConfig
    from training.lm.conversation import ChatSampling
    from training.lm.hf_policy import HFPolicy
    from training.lm.spec import policy_from_spec
    from training.rollout import plan_iteration, rollout_shard_and_commit

    policy: Any
    sampling = ChatSampling(temperature=0.5, max_tokens=args.max_tokens)
    if server is None:
        policy = HFPolicy(str(model_dir), sampling=sampling)
        policy.generator()  # loaded before the clock starts, as the server's model is
    else:
        policy = policy_from_spec(
            f"openai:{server.base_url}#{SERVED_MODEL_NAME}", sampling=sampling
        )
    (request,) = plan_iteration(
        task_dirs,
        run_id=run_id,
        iteration=0,
        policy=policy,
        tasks_per_iteration=len(task_dirs),
        group_size=args.samples,
        shard_count=1,
        episode_config=EpisodeConfig(max_steps=args.max_steps),
        max_concurrent_requests=in_flight,
    )
    stats_url = None if server is None else f"{server.base_url.removesuffix('/v1')}/stats"
    batches_before = httpx.get(stats_url).json() if stats_url else _batches_of(policy)
    server_cpu_before = _process_cpu_s(server.process.pid) if server else 0.0
    own_before = _own_cpu_s()
    started = time.monotonic()
    with SandboxPool(limits=Limits(), max_idle_per_snapshot=in_flight) as pool:
        outcome = rollout_shard_and_commit(request, store, pool=pool)
    wall_s = time.monotonic() - started
    own_after = _own_cpu_s()
    server_cpu_s = _process_cpu_s(server.process.pid) - server_cpu_before if server else 0.0
    batches_after = httpx.get(stats_url).json() if stats_url else _batches_of(policy)
    trajectories = outcome.trajectories
    count = len(trajectories)
    turns = sum(len({s.turn_index for s in t.steps}) for t in trajectories)
    batches = batches_after["batches"] - batches_before["batches"]
    generations = batches_after["generations"] - batches_before["generations"]
    episode_walls = [t.wall_s for t in trajectories]
    return {
        "episodes": len(trajectories),
        "turns": turns,
        "wall_s": wall_s,
        "episodes_per_s": len(trajectories) / wall_s,
        "policy_s_per_episode": statistics.mean(t.policy_s for t in trajectories),
        "sandbox_and_verify_s_per_episode": statistics.mean(
            t.sandbox_s + t.verify_s for t in trajectories
        ),
        "mean_episode_wall_s": statistics.mean(episode_walls),
        "max_episode_wall_s": max(episode_walls),
        "server_cpu_s_per_episode": server_cpu_s / count,
        "rollout_process_cpu_s_per_episode": (own_after - own_before) / count,
        "mean_server_batch": generations / batches if batches else 0.0,
    }


def _batches_of(policy: Any) -> dict[str, int]:
    """The `hf:` policy's batcher counted as the server's `/stats` counts its batches."""
    sizes = policy.batcher().batch_sizes
    return {"batches": len(sizes), "generations": sum(sizes)}


def client_overhead(base_url: str, turns: int) -> dict[str, float]:
    """Seconds per turn of `OpenAIPolicy.complete` and of a bare `httpx.Client.post` sending
    the same request bodies (recorded from the policy's own requests), one at a time,
    alternating so both see the same server and load."""
    import httpx

    from training.lm.conversation import SYSTEM_PROMPT, ChatSampling
    from training.lm.openai_policy import OpenAIPolicy

    policy = OpenAIPolicy(base_url, SERVED_MODEL_NAME, sampling=ChatSampling(max_tokens=8))
    policy.check()
    messages = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": "Fix the bug in pkg/mod.py; run python -m pytest tests."},
    ]
    body = policy.request_body(messages, seed=0, max_tokens=8)
    rollyard_s: list[float] = []
    bare_s: list[float] = []
    with httpx.Client(base_url=base_url + "/", timeout=120) as bare:
        for _ in range(turns):
            started = time.perf_counter()
            policy.complete(messages, seed=0)
            rollyard_s.append(time.perf_counter() - started)
            started = time.perf_counter()
            response = bare.post("chat/completions", json=body)
            response.json()
            bare_s.append(time.perf_counter() - started)
    policy.close()
    rollyard = statistics.median(rollyard_s)
    plain = statistics.median(bare_s)
    return {"rollyard_s_per_turn": rollyard, "httpx_s_per_turn": plain, "ratio": rollyard / plain}


def one_vs_many(
    case: str,
    server: Server | None,
    task_dirs: list[Path],
    work: Path,
    args: Any,
    *,
    many: int,
    model_dir: Path | None = None,
) -> dict[str, Any]:
    """Episodes/s of one shard with 1 and with `many` episodes in flight, and their ratio."""
    measured = {}
    for in_flight in (1, many):
        measured[in_flight] = episodes_per_s(
            server,
            task_dirs,
            work / f"store-{case}-{in_flight}",
            run_id=f"bench-{case}",
            in_flight=in_flight,
            args=args,
            model_dir=model_dir,
        )
        print(case, in_flight, json.dumps(measured[in_flight]), flush=True)
    speedup = measured[many]["episodes_per_s"] / measured[1]["episodes_per_s"]
    print(f"{case}: {many} in flight / 1 = {speedup:.2f}x (load {load_average()})", flush=True)
    return {"1": measured[1], str(many): measured[many], "speedup": speedup}


def load_average() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=4)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max-steps", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=96)
    parser.add_argument("--overhead-turns", type=int, default=30)
    parser.add_argument(
        "--cases", default="tiny,latency,hf", help="comma-separated: tiny, latency, hf"
    )
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "rollyard-test-cache"))
    args = parser.parse_args()

    from tasks_lib import generate_demo_tasks
    from training.lm.tiny import ToolCallTraining, cached_tiny_model

    work = Path(tempfile.mkdtemp(prefix="rollyard-llm-bench-"))
    print(f"load average before: {load_average()} on {os.cpu_count()} cores", flush=True)
    model_dir = cached_tiny_model(args.cache, seed=0, tool_call_training=ToolCallTraining())
    task_dirs = generate_demo_tasks(work / "tasks", args.tasks, seed=21)
    results: dict[str, Any] = {"load_before": load_average()}
    cases = {"tiny": 0.0, "latency": 200.0}
    for case in args.cases.split(","):
        if case == "hf":  # in this process: its batcher groups the requests in flight
            results["hf"] = one_vs_many(
                case, None, task_dirs, work, args, many=8, model_dir=model_dir
            )
            continue
        server = Server(model_dir, cases[case], work / f"server-{case}.log")
        try:
            results[case] = one_vs_many(case, server, task_dirs, work, args, many=16)
            if case == "tiny":  # no added latency: the client's own cost shows most
                results["client_overhead"] = client_overhead(server.base_url, args.overhead_turns)
                print("client overhead", json.dumps(results["client_overhead"]), flush=True)
        finally:
            server.close()
    results["load_after"] = load_average()
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
