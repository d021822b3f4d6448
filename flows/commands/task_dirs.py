"""Task directories named on the command line, for every command that takes several."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path


def task_dirs(paths: list[Path]) -> Iterator[Path]:
    """Task directories named on the command line; a directory of tasks stands for all of them."""
    for path in paths:
        if path.is_dir() and not (path / "task.toml").exists():
            children = sorted(child.parent for child in path.glob("*/task.toml"))
            if children:
                yield from children
                continue
        yield path
