"""Deterministic iteration batches for the gate tests and the gate benchmark: a clean batch and
poisons that a gate must catch."""

from __future__ import annotations

import random
from typing import Any

from storage import TrajectoryStore, episode_id_for


def make_batch(
    run_id: str,
    iteration: int,
    *,
    groups: int = 40,
    group_size: int = 4,
    seed: int = 0,
    infra_share: float = 0.0,
    zero_variance: bool = False,
    hack_share: float = 0.0,
    pass_probability: float = 0.5,
) -> list[dict[str, Any]]:
    """Episode rows of one iteration: `groups` GRPO groups of `group_size` samples."""
    rng = random.Random(f"{seed}/{run_id}/{iteration}")
    rows: list[dict[str, Any]] = []
    for group in range(groups):
        task_id = f"task-{group:04d}"
        rewards = [float(rng.random() < pass_probability) for _ in range(group_size)]
        if not zero_variance and len(set(rewards)) == 1 and group_size > 1:
            rewards[0] = 1.0 - rewards[0]
        if zero_variance:
            rewards = [rewards[0]] * group_size
        for sample, reward in enumerate(rewards):
            status = "ok"
            value: float | None = reward
            if rng.random() < infra_share:
                status, value = "infra_error", None
            flags = ["test_file_edit:tests/test_a.py"] if rng.random() < hack_share else []
            rows.append(
                {
                    "episode_id": episode_id_for(run_id, iteration, task_id, group, sample),
                    "run_id": run_id,
                    "iteration": iteration,
                    "task_id": task_id,
                    "task_version": "1",
                    "group_index": group,
                    "sample_index": sample,
                    "policy_version": f"p{iteration}",
                    "snapshot_digest": "sha256:abc",
                    "sandbox_backend": "bwrap",
                    "reward": value,
                    "passed": None if value is None else value == 1.0,
                    "status": status,
                    "flags": flags,
                    "terminated": True,
                    "n_steps": rng.randint(1, 12),
                    "wall_s": rng.uniform(0.5, 8.0),
                }
            )
    return rows


def commit_batch(
    store: TrajectoryStore, run_id: str, iteration: int, rows: list[dict[str, Any]], shards: int = 2
) -> None:
    for shard in range(shards):
        part = rows[shard::shards]
        if part:
            store.commit_iteration_shard(run_id, iteration, shard, episodes=part)
