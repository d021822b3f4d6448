"""The task-library exception tree: catch `TaskError` for everything, or a subclass for one cause.

Every exception passes all its arguments to `super().__init__` so it pickles across Dask and
Prefect process boundaries unchanged.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, slots=True)
class ValidationIssue:
    """One problem found in a task directory: where it is, what is wrong, and how to fix it."""

    file: str
    """Path relative to the task directory (`task.toml`, `tests/test.sh`, ...)."""
    field: str
    """Dotted field name inside the file (`rollyard.fail_to_pass[2]`), or `-` for the file itself."""
    value: str
    """The offending value as written (repr, shortened), or `-` when it is missing."""
    message: str
    """What is wrong."""
    fix: str
    """What to do about it."""

    def __str__(self) -> str:
        return f"{self.file}: {self.field} = {self.value}: {self.message}; {self.fix}"


class TaskError(Exception):
    """Base of every error raised by `tasks_lib`."""


class TaskNotFoundError(TaskError, FileNotFoundError):
    """The task path does not exist or is not a directory."""


class TaskValidationError(TaskError, ValueError):
    """A task directory breaks the Harbor layout or the `[rollyard]` schema."""

    def __init__(self, task_path: str, issues: tuple[ValidationIssue, ...]) -> None:
        super().__init__(task_path, issues)
        self.task_path = task_path
        self.issues = issues

    def __str__(self) -> str:
        lines = [f"invalid task {self.task_path} ({len(self.issues)} problem(s)):"]
        lines += [f"  {issue}" for issue in self.issues]
        return "\n".join(lines)


class CandidateError(TaskError, ValueError):
    """A candidate (a directory or an agent's sandbox) cannot be read as changes to a workspace."""


class GenerationError(TaskError):
    """The demo generator could not produce the requested tasks (for example too few distinct
    bugs for the requested count)."""
