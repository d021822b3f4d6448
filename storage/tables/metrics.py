"""The metrics table: named values per (run, iteration) from the trainer, evaluations and flows."""

from __future__ import annotations

from collections.abc import Mapping

from storage.commits import CommitEngine, now
from storage.delta_tables import transaction_id
from storage.records import conform
from storage.schemas import METRICS


class MetricsTable:
    """Appends one iteration's metrics from one source, once."""

    def __init__(self, engine: CommitEngine) -> None:
        self._engine = engine

    def record(
        self,
        run_id: str,
        iteration: int,
        values: Mapping[str, float | None],
        *,
        source: str = "trainer",
    ) -> bool:
        """Append one iteration's metrics from one source, once (a replay writes nothing)."""
        recorded_at = now()
        rows = [
            {
                "run_id": run_id,
                "iteration": iteration,
                "source": source,
                "name": name,
                "value": None if value is None else float(value),
                "recorded_at": recorded_at,
            }
            for name, value in values.items()
        ]
        data = conform(METRICS, rows, key={}, source=f"metrics of run {run_id!r}")
        return self._engine.append_once(
            METRICS, data, app_id=transaction_id("metrics", run_id, iteration, source)
        )
