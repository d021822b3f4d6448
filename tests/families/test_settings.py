"""The settings family (sized for tiny language models) and its flags vocabulary: valid,
oracle-checked; only the instructed value passes; editing the tests or another constant gains
nothing."""

from __future__ import annotations

from pathlib import Path

import pytest

from tasks_lib import CandidateChanges, load_task, validate_task, verify
from tasks_lib.sources.families.settings import (
    generate_flags_tasks,
    generate_settings_tasks,
    plan_flags_task,
    plan_settings_task,
)
from tasks_lib.sources.families.settings.generate import FLAGS, SettingsTaskPlan
from tasks_lib.verify.oracle import check_task


@pytest.fixture(scope="module")
def settings_task_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return generate_settings_tasks(tmp_path_factory.mktemp("settings"), 2, seed=0)


@pytest.fixture(scope="module")
def flags_task_dirs(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    return generate_flags_tasks(tmp_path_factory.mktemp("flags"), 2, seed=0)


def _settings_file(plan_index: int, **values: int | bool) -> dict[str, bytes]:
    return _file_of(plan_settings_task(0, plan_index), **values)


def _file_of(plan: SettingsTaskPlan, **values: int | bool) -> dict[str, bytes]:
    lines = [f'"""Settings of {plan.package}."""', ""]
    for name, value in plan.values:
        lines.append(f"{name} = {values.get(name, value)}")
    return {f"{plan.package}/settings.py": ("\n".join(lines) + "\n").encode()}


def test_every_task_validates_and_passes_the_oracle_check(
    settings_task_dirs: list[Path], flags_task_dirs: list[Path]
) -> None:
    for task_dir in settings_task_dirs + flags_task_dirs:
        assert validate_task(task_dir) == ()
        result = check_task(load_task(task_dir))
        assert result.ok, result.problems


def test_the_prompt_names_everything_a_fix_needs_in_few_words(
    settings_task_dirs: list[Path],
) -> None:
    plan = plan_settings_task(0, 0)
    instruction = load_task(settings_task_dirs[0]).instruction
    for needed in (plan.target, f"{plan.package}/settings.py", str(plan.right_value)):
        assert needed in instruction
    assert len(instruction.split()) < 40


def test_hack_editing_the_tests_scores_0(settings_task_dirs: list[Path]) -> None:
    task = load_task(settings_task_dirs[0])
    plan = plan_settings_task(0, 0)
    forged = f"def test_{plan.target.lower()}():\n    assert True\n".encode()
    result = verify(task, CandidateChanges(files={"tests/test_settings.py": forged}))
    assert result.reward == 0.0


def test_a_wrong_value_or_another_constant_scores_0(settings_task_dirs: list[Path]) -> None:
    task = load_task(settings_task_dirs[0])
    plan = plan_settings_task(0, 0)
    wrong = _settings_file(0, **{plan.target: plan.right_value + 1})
    assert verify(task, CandidateChanges(files=wrong)).reward == 0.0
    other = next(name for name, _ in plan.values if name != plan.target)
    both = _settings_file(0, **{other: 0})
    assert verify(task, CandidateChanges(files=both)).reward == 0.0
    right = _settings_file(0)
    assert verify(task, CandidateChanges(files=right)).reward == 1.0


def test_a_flags_task_passes_only_with_the_instructed_flag_flipped(
    flags_task_dirs: list[Path],
) -> None:
    task = load_task(flags_task_dirs[0])
    plan = plan_flags_task(0, 0)
    assert task.instruction.startswith(
        f"Set `{plan.target}` in `app/settings.py` to {plan.right_value}."
    )
    # the one value the instruction states is the one asked for
    assert str(plan.wrong_value) not in task.instruction
    assert (task.snapshot_dir / "app/settings.py").read_text() == _file_of(
        plan, **{plan.target: plan.wrong_value}
    )["app/settings.py"].decode()
    assert verify(task, CandidateChanges(files=_file_of(plan))).reward == 1.0
    other = next(name for name, _ in plan.values if name != plan.target)
    flipped_other = _file_of(plan, **{other: not dict(plan.values)[other]})
    assert verify(task, CandidateChanges(files=flipped_other)).reward == 0.0


def test_flags_tasks_draw_every_flag_and_both_values_as_targets() -> None:
    plans = [plan_flags_task(0, index) for index in range(200)]
    assert {p.target for p in plans} == set(FLAGS)
    assert {p.right_value for p in plans} == {True, False}
    assert all(p.wrong_value is (not p.right_value) for p in plans)
    assert len({(p.values, p.target) for p in plans}) > 150
