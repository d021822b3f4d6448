"""Find task directories: a path holding a `task.toml` is a task, a directory of such paths stands
for every task directly in it. The one place that decides what counts as a task directory."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from tasks_lib.errors import TaskNotFoundError

TASK_FILE = "task.toml"


def is_task_dir(path: str | Path) -> bool:
    """Whether `path` is a task directory (it holds a `task.toml`)."""
    return (Path(path) / TASK_FILE).is_file()


def tasks_in(directory: str | Path) -> list[Path]:
    """The task directories directly under `directory`, sorted by name (empty when none)."""
    root = Path(directory)
    if not root.is_dir():
        return []
    return sorted(child for child in root.iterdir() if is_task_dir(child))


def find_task_dirs(paths: Iterable[str | Path], *, strict: bool = True) -> list[Path]:
    """The task directories `paths` name: a task directory stands for itself, a directory of
    tasks for every task directly in it (sorted), in the order the paths are given.

    With `strict`, a path that is neither raises `TaskNotFoundError` naming it; without, it is
    passed through as it is, so the caller's loader reports what is wrong with it."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if is_task_dir(path):
            found.append(path)
            continue
        children = tasks_in(path)
        if children:
            found += children
        elif strict:
            raise TaskNotFoundError(
                f"{path}: neither a task directory (with {TASK_FILE}) nor a directory of tasks; "
                "pass a task directory or a directory holding task directories"
            )
        else:
            found.append(path)
    return found
