"""The reviews table: human verdicts on episodes' rewards (which episodes to review, and what the
verdicts decide, are in `storage.reviews`)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from storage.commits import CommitEngine, now
from storage.delta_tables import transaction_id
from storage.errors import RecordError
from storage.readers import SnapshotReader
from storage.records import conform
from storage.schemas import REVIEW_VERDICTS, REVIEWS


class ReviewsTable:
    """Records reviewers' verdicts and reads each reviewer's latest one."""

    def __init__(self, engine: CommitEngine, reader: SnapshotReader) -> None:
        self._engine = engine
        self._reader = reader

    def record(
        self,
        episode_id: str,
        verdict: str,
        *,
        reviewer: str,
        note: str | None = None,
        context: Mapping[str, Any] | None = None,
    ) -> str:
        """Record a reviewer's verdict (`agree` / `disagree` with the episode's reward); returns
        the review id. `context` fills the episode's fields (run_id, iteration, task_id,
        task_version, family, verifier, reward, episode_status); missing ones are read from the
        episodes table. Recording the same verdict and note again writes nothing."""
        if verdict not in REVIEW_VERDICTS:
            raise RecordError(
                f"review verdict {verdict!r} for episode {episode_id!r}; use one of "
                f"{', '.join(REVIEW_VERDICTS)}"
            )
        if not reviewer.strip():
            raise RecordError("a review needs a reviewer name; pass reviewer='...'")
        row: dict[str, Any] = dict(self._episode_context(episode_id))
        row.update({k: v for k, v in (context or {}).items() if v is not None})
        review_id = (
            "review-"
            + uuid.uuid5(
                uuid.NAMESPACE_URL, json.dumps([episode_id, reviewer, verdict, note or ""])
            ).hex
        )
        row.update(
            review_id=review_id,
            episode_id=episode_id,
            verdict=verdict,
            note=note,
            reviewer=reviewer,
            reviewed_at=now(),
        )
        data = conform(REVIEWS, [row], key={}, source=f"review of episode {episode_id!r}")
        self._engine.append_once(REVIEWS, data, app_id=transaction_id("review", review_id))
        return review_id

    def _episode_context(self, episode_id: str) -> dict[str, Any]:
        sql = """
            SELECT e.run_id, e.iteration, e.task_id, e.task_version, t.family,
                   e.reward, e.status AS episode_status
            FROM episodes e
            LEFT JOIN (SELECT task_id, task_version, family FROM tasks_latest) t
                   USING (task_id, task_version)
            WHERE e.episode_id = ?
            LIMIT 1
        """
        rows = self._reader.query(sql, [episode_id]).to_pylist()
        return rows[0] if rows else {}

    def read(self) -> pa.Table:
        """Every reviewer's latest verdict per episode."""
        return self._reader.query("SELECT * FROM reviews_latest ORDER BY reviewed_at, review_id")
