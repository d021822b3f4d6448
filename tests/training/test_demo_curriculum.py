"""The demo family's difficulty knob, which the demo's training curriculum is built from."""

from __future__ import annotations

import filecmp
from collections import Counter
from pathlib import Path

import pytest

from tasks_lib import check_task, generate_demo_tasks, load_task
from tasks_lib.errors import GenerationError
from tasks_lib.sources.families.demo.generate import plan_demo_task


def test_easy_tasks_hold_one_directly_tested_bug_in_a_small_function() -> None:
    for index in range(12):
        plan = plan_demo_task(seed=5, index=index, difficulty="easy")
        assert plan.difficulty == "easy" and len(plan.mutations) == 1 and len(plan.modules) == 2
        (bug,) = plan.mutations
        # every failing visible test is a test of the buggy function itself
        assert all(
            test.split("::")[1].startswith(f"test_{bug.function}_") for test in plan.fail_to_pass
        )


def test_levels_size_the_tasks_and_a_mix_is_drawn_per_index() -> None:
    assert {len(plan_demo_task(1, i, difficulty="medium").mutations) for i in range(6)} == {2}
    assert {len(plan_demo_task(1, i, difficulty="hard").mutations) for i in range(6)} == {3}
    with pytest.raises(GenerationError, match="unknown demo difficulty"):
        plan_demo_task(1, 0, difficulty="brutal")


def test_curriculum_is_deterministic_valid_and_recorded(tmp_path: Path) -> None:
    mix = {"easy": 3.0, "medium": 1.0}
    paths = generate_demo_tasks(tmp_path / "a", 4, seed=2, difficulty=mix)
    again = generate_demo_tasks(tmp_path / "b", 2, seed=2, difficulty=mix)
    for first, second in zip(paths, again, strict=False):
        comparison = filecmp.dircmp(first, second)
        assert not comparison.diff_files and not comparison.left_only
    levels = Counter(load_task(path).difficulty for path in paths)
    assert set(levels) <= {"easy", "medium"}
    for path in paths[:1]:
        result = check_task(load_task(path))  # the solution scores 1, the untouched workspace 0
        assert result.ok, result.problems
