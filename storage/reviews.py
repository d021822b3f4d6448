"""Human spot checks of reward quality: which episodes to review, and what the verdicts say.

    queue = review_queue(store, per_stratum=3, seed=0)        # stratified by family and reward
    store.reviews.record(item.episode_id, "disagree", reviewer="ana", note="...",
                        context=item.context())
    decisions = review_gate(store, min_reviews=10, min_agreement=0.8)
    blocked = {family for family, d in decisions.items() if not d.admit}

Strata are (family, reward bucket): `fail` (reward 0), `partial`, `pass` (reward 1), so a family
whose rewards are mostly 0 still gets its passes looked at; within a stratum episodes are drawn
with a seeded RNG, so the same seed gives the same queue.
"""

from __future__ import annotations

import dataclasses
import random
from collections import defaultdict
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from storage.queries import REVIEW_AGREEMENT_SQL

if TYPE_CHECKING:
    from storage.store import TrajectoryStore

REWARD_BUCKETS = ("fail", "partial", "pass")


def reward_bucket(reward: float | None) -> str:
    if reward is None or reward <= 0.0:
        return "fail"
    return "pass" if reward >= 1.0 else "partial"


@dataclasses.dataclass(frozen=True, slots=True)
class ReviewItem:
    """One episode to review, with what the reviewer needs to judge its reward."""

    episode_id: str
    run_id: str
    iteration: int
    task_id: str
    task_version: str
    family: str
    verifier: str
    reward: float | None
    status: str
    flags: tuple[str, ...]
    n_steps: int
    bucket: str

    def context(self) -> dict[str, Any]:
        """The fields `TrajectoryStore.reviews.record` stores beside the verdict."""
        return {
            "run_id": self.run_id, "iteration": self.iteration, "task_id": self.task_id,
            "task_version": self.task_version, "family": self.family, "verifier": self.verifier,
            "reward": self.reward, "episode_status": self.status,
        }  # fmt: skip

    def to_json(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "flags": list(self.flags)}


def review_queue(
    store: TrajectoryStore,
    *,
    per_stratum: int = 2,
    seed: int = 0,
    run_id: str | None = None,
    task_info: Mapping[str, tuple[str, str]] | None = None,
    include_reviewed: bool = False,
) -> list[ReviewItem]:
    """Up to `per_stratum` scored episodes per (family, reward bucket), not yet reviewed.

    `task_info` maps a task id to (family, verifier kind) where the caller knows them (from the
    task directories); otherwise the family comes from the task catalog and the verifier is
    `unknown`."""
    sql = """
        SELECT e.episode_id, e.run_id, e.iteration, e.task_id, e.task_version,
               coalesce(t.family, 'unknown') AS family, e.reward, e.status, e.flags, e.n_steps
        FROM episodes e
        LEFT JOIN (SELECT task_id, task_version, family FROM tasks_latest) t
               USING (task_id, task_version)
        WHERE e.status = 'ok' AND e.reward IS NOT NULL
          AND (? IS NULL OR e.run_id = ?)
          AND (? OR e.episode_id NOT IN (SELECT episode_id FROM reviews))
        ORDER BY e.episode_id
    """
    rows = store.query(sql, [run_id, run_id, include_reviewed]).to_pylist()
    info = task_info or {}
    strata: dict[tuple[str, str], list[ReviewItem]] = defaultdict(list)
    for row in rows:
        family, verifier = info.get(row["task_id"], (row["family"], "unknown"))
        item = ReviewItem(
            episode_id=row["episode_id"], run_id=row["run_id"], iteration=row["iteration"],
            task_id=row["task_id"], task_version=row["task_version"], family=family,
            verifier=verifier, reward=row["reward"], status=row["status"],
            flags=tuple(row["flags"] or ()), n_steps=row["n_steps"],
            bucket=reward_bucket(row["reward"]),
        )  # fmt: skip
        strata[(family, item.bucket)].append(item)
    rng = random.Random(seed)
    queue: list[ReviewItem] = []
    for key in sorted(strata):
        members = strata[key]
        queue += rng.sample(members, min(per_stratum, len(members)))
    return queue


@dataclasses.dataclass(frozen=True, slots=True)
class GateDecision:
    """Whether curation may admit more tasks of a family, from its human review agreement."""

    family: str
    reviews: int
    agreement_rate: float | None
    admit: bool
    reason: str


def agreement(store: TrajectoryStore) -> list[dict[str, Any]]:
    """The `review_agreement` named query: per family, verifier and day."""
    rows: list[dict[str, Any]] = store.query(REVIEW_AGREEMENT_SQL).to_pylist()
    return rows


def review_gate(
    store: TrajectoryStore,
    *,
    min_reviews: int = 10,
    min_agreement: float = 0.8,
    since_days: int | None = None,
) -> dict[str, GateDecision]:
    """Per reviewed family: admit more tasks unless at least `min_reviews` latest verdicts (over
    the last `since_days`, or all) agree with the reward less often than `min_agreement`. Too
    few reviews never block: a family is judged once it has been looked at enough."""
    sql = """
        SELECT coalesce(family, 'unknown') AS family, count(*) AS reviews,
               avg(CASE WHEN verdict = 'agree' THEN 1.0 ELSE 0.0 END) AS agreement_rate
        FROM reviews_latest
        WHERE ? IS NULL OR reviewed_at >= now() - to_days(CAST(? AS INTEGER))
        GROUP BY ALL
    """
    decisions = {}
    for row in store.query(sql, [since_days, since_days]).to_pylist():
        family, count, rate = row["family"], row["reviews"], row["agreement_rate"]
        if count < min_reviews:
            decision = GateDecision(family, count, rate, True,
                                    f"{count} review(s), fewer than the {min_reviews} needed to judge")  # fmt: skip
        elif rate < min_agreement:
            decision = GateDecision(family, count, rate, False,
                                    f"reviewers agree with {rate:.0%} of {count} rewards, "
                                    f"below {min_agreement:.0%}: fix the verifier before adding tasks")  # fmt: skip
        else:
            decision = GateDecision(
                family, count, rate, True, f"agreement {rate:.0%} over {count} reviews"
            )
        decisions[family] = decision
    return decisions


def blocked_families(decisions: Mapping[str, GateDecision]) -> dict[str, str]:
    """Family -> reason, for the families the review gate blocks."""
    return {family: d.reason for family, d in decisions.items() if not d.admit}
