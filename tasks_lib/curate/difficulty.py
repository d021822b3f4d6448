"""Difficulty from a reference policy: the pass rate over k samples, bucketed, and a training
sampler that stratifies by bucket and skips the all-pass and all-fail buckets (they give GRPO no
variance to learn from; DAPO drops such groups, MiMo drops such problems).

The policy is whatever the caller samples with (`sample(task, index) -> reward or None`); the
`curate` flow passes a checkpoint of the built-in policy from the store.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable, Mapping, Sequence

from tasks_lib.format.model import Task

ALL_FAIL = "all_fail"
ALL_PASS = "all_pass"
Sampler = Callable[[Task, int], float | None]
"""Runs sample `index` of the reference policy on a task; its reward, or None for no verdict."""


def bucket_for(pass_rate: float, edges: Sequence[float]) -> str:
    """`all_fail` (0), `all_pass` (1), or the range `lo-hi` of `edges` holding `pass_rate`."""
    if pass_rate <= 0.0:
        return ALL_FAIL
    if pass_rate >= 1.0:
        return ALL_PASS
    low = 0.0
    for high in (*edges, 1.0):
        if pass_rate <= high:
            return f"{low:.2f}-{high:.2f}"
        low = high
    return ALL_PASS  # unreachable: pass_rate < 1


@dataclasses.dataclass(frozen=True, slots=True)
class DifficultyEstimate:
    pass_rate: float
    samples: int
    """Samples with a verdict (those without are not counted)."""
    bucket: str


def estimate_difficulty(
    task: Task, sample: Sampler, *, k: int, edges: Sequence[float]
) -> DifficultyEstimate | None:
    """Pass rate of `k` samples; None when no sample produced a verdict."""
    rewards = [sample(task, index) for index in range(k)]
    scored = [r for r in rewards if r is not None]
    if not scored:
        return None
    rate = sum(1 for r in scored if r >= 1.0) / len(scored)
    return DifficultyEstimate(rate, len(scored), bucket_for(rate, edges))


def stratified_sample(
    buckets: Mapping[str, str],
    count: int,
    *,
    seed: int = 0,
    skip: Sequence[str] = (ALL_PASS, ALL_FAIL),
) -> list[str]:
    """`count` task ids drawn evenly across buckets (task id -> bucket), skipping `skip`.

    Buckets take turns (in sorted order), each yielding its tasks in a seeded shuffle, so a rare
    bucket is not drowned by a common one. Fewer ids come back when fewer are eligible."""
    by_bucket: dict[str, list[str]] = {}
    for task_id, bucket in sorted(buckets.items()):
        if bucket not in skip:
            by_bucket.setdefault(bucket, []).append(task_id)
    rng = random.Random(seed)
    for ids in by_bucket.values():
        rng.shuffle(ids)
    chosen: list[str] = []
    while len(chosen) < count and any(by_bucket.values()):
        for bucket in sorted(by_bucket):
            if by_bucket[bucket] and len(chosen) < count:
                chosen.append(by_bucket[bucket].pop())
    return chosen
