"""The operations-troubleshooting family: a small service with its database migrations and a batch
job, broken in a realistic way; verified by rules (the job completes, the service answers, the
output is right) over hidden data."""

from tasks_lib.sources.families.ops.generate import (
    FAMILY,
    SCENARIOS,
    generate_ops_tasks,
    plan_ops_task,
)

__all__ = ["FAMILY", "SCENARIOS", "generate_ops_tasks", "plan_ops_task"]
