"""Generated tasks of the two families beyond bug fixing, shared by the tests of this package."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks_lib import load_task
from tasks_lib.format.model import Task
from tasks_lib.sources.families.data_analysis import generate_data_analysis_tasks
from tasks_lib.sources.families.ops import generate_ops_tasks


@pytest.fixture(scope="session")
def data_task_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One data-analysis task per question template (seed 0 covers all four in eight)."""
    paths = generate_data_analysis_tasks(tmp_path_factory.mktemp("data"), 8, seed=0)
    by_question: dict[str, Path] = {}
    for path in paths:
        question = load_task(path).artifact
        assert question is not None
        text = (path / "task.toml").read_text()
        name = text.split('question = "', 1)[1].split('"', 1)[0]
        by_question.setdefault(name, path)
    assert len(by_question) == 4, sorted(by_question)
    return [by_question[name] for name in sorted(by_question)]


@pytest.fixture(scope="session")
def ops_task_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """Four ops tasks: one per scenario."""
    return generate_ops_tasks(tmp_path_factory.mktemp("ops"), 4, seed=0)


def task_of(paths: list[Path], marker: str) -> Task:
    """The task whose task.toml mentions `marker` (a question or a scenario name)."""
    for path in paths:
        if marker in (path / "task.toml").read_text():
            return load_task(path)
    raise AssertionError(f"no task with {marker!r}")
