"""The task format: a Harbor task directory, its task.toml read by Harbor's task model, and
rollyard's `[metadata.rollyard]` table in it.

model.py     the loaded `Task` and the protected-path groups
harbor.py    Harbor's task model (environment, agent, verifier, network), field for field
runnable.py  where a task runs faithfully (bwrap, or its own image), and the refusals of the rest
loader.py    load and validate a task directory (every problem names file, field, value, fix)
layout.py    the directory's files: instruction.md and task.toml within bounds, the workspace
fields.py    the `[metadata.rollyard]` fields and the limits from Harbor's sections
node_ids.py  the test ids a task lists (pytest node ids checked against its test files, unittest ids)
repository.py  a repository task's environment table and its layered image (base -> env -> instance)
issues.py    the issue collector every reader reports to
environment.py  where a task runs: bwrap over its workspace, or its own image on docker
spec.py    the `[rollyard.artifact]` and `[rollyard.rules]` tables of those verifier kinds
globs.py   path globs for protected paths
finder.py  the one rule for what counts as a task directory
"""

from tasks_lib.format.environment import open_task_sandbox, task_image
from tasks_lib.format.finder import find_task_dirs, is_task_dir, tasks_in
from tasks_lib.format.loader import load_task, validate_task
from tasks_lib.format.model import Task, VerifierKind

__all__ = [
    "Task",
    "VerifierKind",
    "find_task_dirs",
    "is_task_dir",
    "load_task",
    "open_task_sandbox",
    "task_image",
    "tasks_in",
    "validate_task",
]
