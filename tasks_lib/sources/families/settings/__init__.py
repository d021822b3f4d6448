"""The settings family: one-edit tasks sized for tiny language models (set a constant), and
its `flags` vocabulary (set a boolean flag)."""

from tasks_lib.sources.families.settings.generate import (
    FAMILY,
    FLAGS_FAMILY,
    generate_flags_tasks,
    generate_settings_tasks,
    plan_flags_task,
    plan_settings_task,
)

__all__ = [
    "FAMILY",
    "FLAGS_FAMILY",
    "generate_flags_tasks",
    "generate_settings_tasks",
    "plan_flags_task",
    "plan_settings_task",
]
