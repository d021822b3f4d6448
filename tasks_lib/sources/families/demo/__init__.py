"""The built-in demo family: bug-fix tasks over generated small Python packages."""

from tasks_lib.sources.families.demo.generate import FAMILY, generate_demo_tasks, plan_demo_task

__all__ = ["FAMILY", "generate_demo_tasks", "plan_demo_task"]
