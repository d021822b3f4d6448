"""The gates table: each quality-gate evaluation of an iteration, and the quarantine it decides.

A quarantined iteration keeps its data; `TrajectoryStore.read_episodes` and the
`training_episodes` view leave it out. The latest evaluation of each suite decides.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from storage.commits import CommitEngine, now
from storage.delta_tables import transaction_id
from storage.readers import SnapshotReader
from storage.records import conform
from storage.schemas import GATES


@dataclass(frozen=True, slots=True)
class GateResult:
    """One expectation's outcome in a quality-gate evaluation."""

    expectation: str
    success: bool
    observed: str | None = None
    details: str | None = None


@dataclass(frozen=True, slots=True)
class IterationStatus:
    """Whether an iteration's data may be trained on, and why not."""

    run_id: str
    iteration: int
    quarantined: bool
    reasons: tuple[str, ...]


class GatesTable:
    """Records gate evaluations and answers which iterations are quarantined."""

    def __init__(self, engine: CommitEngine, reader: SnapshotReader) -> None:
        self._engine = engine
        self._reader = reader

    def record(
        self,
        run_id: str,
        iteration: int,
        suite: str,
        results: Sequence[GateResult],
        *,
        quarantined: bool,
        reason: str | None = None,
        evaluation: int = 0,
    ) -> bool:
        """Record one evaluation of a gate suite and its verdict for an iteration.

        A quarantined iteration keeps its data; `read_episodes` and the `training_episodes` view
        leave it out. The latest `evaluation` of each suite decides, so lifting a quarantine is
        recording a later evaluation with `quarantined=False`. Replays of the same evaluation
        write nothing (returns False).
        """
        evaluated_at = now()
        rows: list[dict[str, Any]] = [
            {
                "kind": "expectation",
                "expectation": r.expectation,
                "success": r.success,
                "observed": r.observed,
                "details": r.details,
            }
            for r in results
        ]
        rows.append(
            {"kind": "verdict", "expectation": suite, "success": not quarantined, "reason": reason}
        )
        for row in rows:
            row.update(
                run_id=run_id,
                iteration=iteration,
                suite=suite,
                quarantined=quarantined,
                evaluation=evaluation,
                evaluated_at=evaluated_at,
            )
        source = f"gates of (run_id={run_id!r}, iteration={iteration}, suite={suite!r})"
        data = conform(GATES, rows, key={}, source=source)
        return self._engine.append_once(
            GATES,
            data,
            app_id=transaction_id("gates", run_id, iteration, suite),
            app_version=evaluation + 1,
        )

    def mark_quarantined(
        self,
        run_id: str,
        iteration: int,
        *,
        reason: str,
        quarantined: bool = True,
        suite: str = "manual",
        evaluation: int = 0,
    ) -> bool:
        """Quarantine (or, with `quarantined=False`, release) an iteration by hand."""
        return self.record(
            run_id,
            iteration,
            suite,
            (),
            quarantined=quarantined,
            reason=reason,
            evaluation=evaluation,
        )

    def quarantined_iterations(self, run_id: str | None = None) -> list[tuple[str, int]]:
        """(run_id, iteration) pairs whose latest verdict of some suite is quarantined."""
        sql = "SELECT DISTINCT run_id, iteration FROM gate_verdicts WHERE quarantined"
        with self._reader.connection(("gates",)) as con:
            rows = con.sql(sql).fetchall()
        return sorted((str(r), int(i)) for r, i in rows if run_id is None or r == run_id)

    def iteration_status(self, run_id: str, iteration: int) -> IterationStatus:
        """Whether the trainer may consume an iteration, and the reasons if not."""
        sql = """SELECT suite, reason FROM gate_verdicts
                 WHERE quarantined AND run_id = ? AND iteration = ? ORDER BY suite"""
        with self._reader.connection(("gates",)) as con:
            rows = con.execute(sql, [run_id, iteration]).fetchall()
        reasons = tuple(f"{suite}: {reason or 'no reason given'}" for suite, reason in rows)
        return IterationStatus(run_id, iteration, bool(rows), reasons)
