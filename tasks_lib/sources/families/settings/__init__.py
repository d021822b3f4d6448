"""The settings family: one-edit tasks sized for tiny language models (set a constant)."""

from tasks_lib.sources.families.settings.generate import (
    FAMILY,
    generate_settings_tasks,
    plan_settings_task,
)

__all__ = ["FAMILY", "generate_settings_tasks", "plan_settings_task"]
