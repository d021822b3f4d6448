"""What every reader of a task directory reports to: the collector of validation issues (so one run
lists every problem, each naming file, field, value and fix), and the inside-the-task path check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from tasks_lib.errors import ValidationIssue

MISSING = object()
"""The value shown for a field or file that is absent."""


class IssueSink(Protocol):
    """Where a reader of task.toml reports each problem it finds."""

    def add(self, file: str, field: str, value: Any, message: str, fix: str) -> None: ...


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class IssueCollector:
    """Collects issues instead of stopping at the first, so one run lists every problem."""

    def __init__(self) -> None:
        self.issues: list[ValidationIssue] = []

    def add(self, file: str, field: str, value: Any, message: str, fix: str) -> None:
        shown = "-" if value is MISSING else _show(value)
        self.issues.append(ValidationIssue(file, field, shown, message, fix))


def relative_inside(value: str) -> bool:
    """Whether `value` is a non-empty relative path that does not leave its directory."""
    parts = Path(value).parts
    return bool(value) and not Path(value).is_absolute() and ".." not in parts
