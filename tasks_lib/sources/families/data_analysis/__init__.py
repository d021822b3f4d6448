"""The data-analysis family: a generated orders dataset and a question; the agent writes a script
(pandas or DuckDB SQL) that produces an answer artifact, compared with references on hidden data."""

from tasks_lib.sources.families.data_analysis.generate import (
    FAMILY,
    QUESTIONS,
    generate_data_analysis_tasks,
    plan_data_task,
)

__all__ = ["FAMILY", "QUESTIONS", "generate_data_analysis_tasks", "plan_data_task"]
