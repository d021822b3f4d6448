"""The tasks table: the task catalog and curation verdicts, appended one batch at a time."""

from __future__ import annotations

from storage.commits import CommitEngine, now
from storage.delta_tables import transaction_id
from storage.records import TableInput, conform
from storage.schemas import TASKS


class TasksTable:
    """Appends task catalog / curation rows as batches, once per batch id."""

    def __init__(self, engine: CommitEngine) -> None:
        self._engine = engine

    def record(self, tasks: TableInput, *, batch_id: str) -> bool:
        """Append task catalog / curation rows as one batch, once per `batch_id`.

        The latest row per (task_id, task_version) is what the `tasks_latest` view shows.
        """
        data = conform(
            TASKS,
            tasks,
            key={},
            source=f"tasks batch {batch_id!r}",
            overwrite={"batch_id": batch_id, "recorded_at": now()},
        )
        return self._engine.append_once(TASKS, data, app_id=transaction_id("tasks", batch_id))
