"""A tiny Harbor task with one injected bug, loaded through `tasks_lib`, for episode tests."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tasks_lib.format.loader import load_task
from tasks_lib.format.model import Task

BUGGY_SOURCE = textwrap.dedent(
    """\
    def clamp(value, low, high):
        if value < low:
            return low
        if value >= high:
            return value
        return value


    def double(x):
        return x * 2
    """
)

TESTS = textwrap.dedent(
    """\
    from calc import clamp, double


    def test_clamp_high():
        assert clamp(9, 0, 5) == 5


    def test_double():
        assert double(3) == 6
    """
)


def write_task(root: Path, source: str = BUGGY_SOURCE) -> Path:
    workspace = root / "environment" / "workspace"
    (workspace / "tests").mkdir(parents=True)
    (workspace / "calc.py").write_text(source)
    (workspace / "tests" / "test_calc.py").write_text(TESTS)
    (root / "environment" / "Dockerfile").write_text(
        "FROM python:3.11-slim\nCOPY workspace /workspace\n"
    )
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text(
        "#!/bin/sh\ncd /workspace && python -m pytest -q tests\n"
    )
    (root / "instruction.md").write_text(
        "The function `clamp` in `calc.py` is wrong. Fix it; run `python -m pytest tests`.\n"
    )
    (root / "task.toml").write_text(
        textwrap.dedent(
            """\
            version = "1.0"

            [rollyard]
            id = "calc-clamp"
            version = "1"
            test_command = "python -m pytest tests"
            fail_to_pass = ["tests/test_calc.py::test_clamp_high"]
            pass_to_pass = ["tests/test_calc.py::test_double"]
            family = "test"

            [rollyard.limits]
            agent_timeout_s = 60
            verify_timeout_s = 60
            """
        )
    )
    return root


@pytest.fixture
def bug_task_dir(tmp_path: Path) -> Path:
    """The directory of the task `bug_task` loads."""
    return write_task(tmp_path / "task")


@pytest.fixture
def bug_task(tmp_path: Path) -> Task:
    return load_task(write_task(tmp_path / "task"))
