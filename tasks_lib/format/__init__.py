"""The task format: a Harbor task directory and rollyard's `[rollyard]` table in its task.toml.

model.py   the loaded `Task` and the protected-path groups
loader.py  load and validate a task directory (every problem names file, field, value, fix)
spec.py    the `[rollyard.artifact]` and `[rollyard.rules]` tables of those verifier kinds
globs.py   path globs for protected paths
finder.py  the one rule for what counts as a task directory
"""

from tasks_lib.format.finder import find_task_dirs, is_task_dir, tasks_in
from tasks_lib.format.loader import load_task, validate_task
from tasks_lib.format.model import Task, VerifierKind

__all__ = [
    "Task",
    "VerifierKind",
    "find_task_dirs",
    "is_task_dir",
    "load_task",
    "tasks_in",
    "validate_task",
]
