"""Deterministic shard data for the store tests, importable by the test modules and by the writer
subprocesses they start."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from typing import Any

from storage import episode_id_for

STATUSES = ("ok", "ok", "ok", "infra_error", "timeout")


def make_shard(
    run_id: str, iteration: int, shard: int, *, n_episodes: int = 4, max_steps: int = 3
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Episodes and steps of one shard; the same arguments give the same rows."""
    rng = random.Random(f"{run_id}/{iteration}/{shard}")
    start = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=iteration)
    episodes: list[dict[str, Any]] = []
    steps: list[dict[str, Any]] = []
    for index in range(n_episodes):
        sample = shard * n_episodes + index
        episode_id = episode_id_for(run_id, iteration, f"task-{sample % 3}", shard, sample)
        n_steps = rng.randint(0, max_steps)
        status = rng.choice(STATUSES)
        reward = None if status == "infra_error" else float(rng.random() > 0.5)
        episodes.append(
            {
                "episode_id": episode_id,
                "run_id": run_id,
                "iteration": iteration,
                "task_id": f"task-{sample % 3}",
                "task_version": "v1",
                "group_index": shard,
                "sample_index": sample,
                "policy_version": f"p{iteration}",
                "snapshot_digest": "sha256:abc",
                "sandbox_backend": "bwrap",
                "reward": reward,
                "passed": reward == 1.0 if reward is not None else None,
                "status": status,
                "flags": ["edited_tests"] if rng.random() < 0.2 else [],
                "terminated": True,
                "n_steps": n_steps,
                "started_at": start,
                "finished_at": start + timedelta(seconds=rng.uniform(1, 5)),
                "sandbox_s": rng.uniform(0.1, 2.0),
                "worker": f"w{shard % 2}",
            }
        )
        for step in range(n_steps):
            steps.append(
                {
                    "episode_id": episode_id,
                    "step": step,
                    "action_kind": "run",
                    "action_text": f"pytest -q  # {step}",
                    "observation": "." * rng.randint(0, 50),
                    "exit_code": rng.choice([0, 1]),
                    "duration_s": rng.uniform(0.001, 0.5),
                }
            )
    return episodes, steps
