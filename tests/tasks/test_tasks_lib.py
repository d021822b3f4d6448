"""Loader validation, the demo family's determinism and oracle checks, verifier statuses, the
candidate APIs and the CLI, on real bwrap sandboxes."""

from __future__ import annotations

import ast
import dataclasses
import filecmp
import json
import shutil
import tomllib
from pathlib import Path

import pytest
import tomli_w

from flows.cli import main as cli_main
from sandboxes import open_sandbox
from tasks_lib import (
    CandidateChanges,
    GuardPolicy,
    TaskNotFoundError,
    TaskValidationError,
    check_task,
    find_task_dirs,
    generate_demo_tasks,
    load_task,
    solution_changes,
    validate_task,
    verify,
)
from tasks_lib.format import is_task_dir, tasks_in
from tasks_lib.format.globs import glob_matches
from tasks_lib.sources.families.demo.generate import plan_demo_task
from tasks_lib.sources.families.demo.mutate import OPERATORS


@pytest.fixture(scope="module")
def demo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("demo")
    generate_demo_tasks(out, 10, seed=11)
    return out


@pytest.fixture()
def task_copy(demo_dir: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(demo_dir / "demo-11-0000", tmp_path / "task"))


def _edit_toml(task_dir: Path, **rollyard: object) -> None:
    doc = tomllib.loads((task_dir / "task.toml").read_text())
    doc["metadata"]["rollyard"].update(rollyard)
    (task_dir / "task.toml").write_bytes(tomli_w.dumps(doc).encode())


# -- loader -----------------------------------------------------------------------------------


def test_demo_task_loads_with_its_fields(demo_dir: Path) -> None:
    task = load_task(demo_dir / "demo-11-0000")
    assert task.id == "demo-11-0000" and task.version == "1"
    assert task.snapshot_dir.name == "workspace" and task.fail_to_pass and task.hidden_tests
    assert "python -m pytest tests" in task.instruction
    assert not (task.snapshot_dir / "solution").exists()
    assert not any(path.name.startswith("test_hidden") for path in task.snapshot_dir.rglob("*"))


def test_validation_names_file_field_value_and_fix(task_copy: Path) -> None:
    _edit_toml(
        task_copy, difficulty="brutal", fail_to_pass=["tests/test_nope.py::test_x"], colour=1
    )
    (task_copy / "instruction.md").unlink()
    issues = validate_task(task_copy)
    text = [str(issue) for issue in issues]
    assert any(i.file == "instruction.md" for i in issues), text
    difficulty = next(i for i in issues if i.field == "rollyard.difficulty")
    assert difficulty.value == "'brutal'" and "easy" in difficulty.fix
    missing = next(i for i in issues if i.field == "rollyard.fail_to_pass[0]")
    assert "tests/test_nope.py" in missing.message
    assert any(i.field == "rollyard.colour" and "remove it" in i.fix for i in issues)
    with pytest.raises(TaskValidationError) as raised:
        load_task(task_copy)
    assert "rollyard.difficulty" in str(raised.value)


def test_validation_rejects_history_and_bad_limits(task_copy: Path) -> None:
    (task_copy / "environment/workspace/.git").mkdir()
    _edit_toml(task_copy, limits={"memory_mb": -5, "cpu_speed": 3}, test_command="make test")
    fields = {issue.field: issue for issue in validate_task(task_copy)}
    assert "rollyard.limits.memory_mb" in fields and "rollyard.limits.cpu_speed" in fields
    assert "rollyard.test_command" in fields
    assert any(issue.file.endswith("/.git") for issue in validate_task(task_copy))


def test_unknown_test_name_is_reported(task_copy: Path) -> None:
    task = load_task(task_copy)
    wrong = task.fail_to_pass[0].split("::")[0] + "::test_does_not_exist"
    _edit_toml(task_copy, pass_to_pass=[wrong])
    issue = next(i for i in validate_task(task_copy) if i.field == "rollyard.pass_to_pass[0]")
    assert "test_does_not_exist" in issue.message


def test_plain_harbor_task_loads_and_scores_from_reward_txt(
    task_copy: Path, tmp_path: Path
) -> None:
    doc = tomllib.loads((task_copy / "task.toml").read_text())
    del doc["metadata"]["rollyard"]
    # A plain Harbor task says which network it needs; Harbor's default (public) is refused.
    doc["environment"]["network_mode"] = "no-network"
    (task_copy / "task.toml").write_bytes(tomli_w.dumps(doc).encode())
    task = load_task(task_copy)
    assert not task.has_rollyard_table and task.id == "task"
    assert task.verify_timeout_s == 120.0 and task.limits.memory_mb == 1024
    assert verify(task).reward == 0.0
    solved = verify(task, solution_changes(task))
    assert (solved.status, solved.reward) == ("ok", 1.0), solved.detail
    # A test.sh that writes no reward is the verifier's failure, never a 0.
    (task_copy / "tests/test.sh").write_text("#!/bin/bash\nexit 0\n")
    broken = verify(load_task(task_copy))
    assert broken.status == "verifier_error" and broken.reward is None


def test_glob_semantics() -> None:
    assert glob_matches("conftest.py", "a/b/conftest.py")
    assert glob_matches("tests/**", "tests/x/test_a.py")
    assert not glob_matches("tests/**", "pkg/tests.py")
    assert glob_matches("*.dist-info", "evil-1.0.dist-info/entry_points.txt")
    assert glob_matches("__pycache__", "pkg/__pycache__/m.cpython-311.pyc")


# -- the demo family --------------------------------------------------------------------------


def test_demo_generation_is_deterministic_and_prefix_stable(demo_dir: Path, tmp_path: Path) -> None:
    generate_demo_tasks(tmp_path / "again", 3, seed=11)
    for name in ("demo-11-0000", "demo-11-0002"):
        comparison = filecmp.dircmp(demo_dir / name, tmp_path / "again" / name)
        assert not comparison.diff_files and not comparison.left_only and not comparison.right_only
    other = generate_demo_tasks(tmp_path / "other", 1, seed=12)[0]
    assert (other / "task.toml").read_text() != (demo_dir / "demo-11-0000/task.toml").read_text()


def test_demo_family_varies_operators_bug_counts_and_projects() -> None:
    plans = [plan_demo_task(seed=21, index=index) for index in range(40)]
    assert len({plan.signature for plan in plans}) == 40
    operators = {m.operator for plan in plans for m in plan.mutations}
    assert len(operators) >= 6, operators
    assert {len(plan.mutations) for plan in plans} >= {1, 2, 3}
    assert len({plan.package for plan in plans}) >= 5


@pytest.mark.slow
def test_two_hundred_demo_tasks_are_distinct() -> None:
    plans = [plan_demo_task(seed=0, index=index) for index in range(200)]
    assert len({plan.signature for plan in plans}) >= 195
    assert set(OPERATORS) == {m.operator for plan in plans for m in plan.mutations}


def test_generated_demo_tasks_pass_the_oracle_check(demo_dir: Path) -> None:
    for task_dir in sorted(demo_dir.iterdir()):
        result = check_task(load_task(task_dir))
        assert result.ok, (task_dir.name, result.problems)


# -- honest solutions and candidate APIs ------------------------------------------------------


def _reformatted_solution(task_dir: Path) -> CandidateChanges:
    """An honest alternative fix: the reference fix, rewritten in another layout, plus a new
    helper module and a changed README."""
    task = load_task(task_dir)
    fixed = solution_changes(task)
    files = {
        path: (ast.unparse(ast.parse(data)) + "\n").encode() if path.endswith(".py") else data
        for path, data in fixed.files.items()
    }
    files["notes_helper.py"] = b'"""Scratch helper written while fixing."""\n\nDEBUG = False\n'
    files["README.md"] = b"Fixed the failing functions.\n"
    return CandidateChanges(files=files)


def test_honest_alternative_fixes_score_one_without_flags(demo_dir: Path) -> None:
    for name in ("demo-11-0001", "demo-11-0002"):
        result = verify(load_task(demo_dir / name), _reformatted_solution(demo_dir / name))
        assert (result.reward, result.flags) == (1.0, ()), result.to_json()


def test_candidate_from_agent_sandbox(demo_dir: Path) -> None:
    task = load_task(demo_dir / "demo-11-0003")
    patch = (task.solution_dir / "fix.patch").read_bytes()
    with open_sandbox(task.snapshot_dir, limits=task.limits) as agent:
        agent.write_file("fix.patch", patch)
        assert agent.execute("patch -p1 < fix.patch && rm fix.patch").ok
        changes = CandidateChanges.from_sandbox(agent)
    result = verify(task, changes)
    assert result.reward == 1.0 and result.partial_credit == 1.0


def test_candidate_from_directory_sees_edits_and_deletions(demo_dir: Path, tmp_path: Path) -> None:
    task = load_task(demo_dir / "demo-11-0000")
    workspace = Path(shutil.copytree(task.snapshot_dir, tmp_path / "ws"))
    (workspace / "pyproject.toml").unlink()
    (workspace / "new.txt").write_text("x")
    changes = CandidateChanges.from_directory(workspace, task.snapshot_dir)
    assert changes.deleted == ("pyproject.toml",) and set(changes.files) == {"new.txt"}


def test_finder_takes_a_task_or_a_directory_of_tasks(demo_dir: Path, tmp_path: Path) -> None:
    one = demo_dir / "demo-11-0000"
    every = tasks_in(demo_dir)
    assert len(every) == 10 and all(is_task_dir(path) for path in every)
    assert every == sorted(every)
    assert find_task_dirs([one, demo_dir]) == [one, *every]
    nowhere = tmp_path / "nowhere"
    with pytest.raises(TaskNotFoundError, match="neither a task directory"):
        find_task_dirs([nowhere])
    # Without strict, a bad path is passed on for the loader to report what is wrong with it.
    assert find_task_dirs([nowhere], strict=False) == [nowhere]
    assert tasks_in(nowhere) == []


# -- statuses ---------------------------------------------------------------------------------


def test_timeout_is_a_status_with_reward_zero(demo_dir: Path) -> None:
    task = load_task(demo_dir / "demo-11-0000")
    package = next(p.name for p in task.snapshot_dir.iterdir() if (p / "__init__.py").exists())
    loop = CandidateChanges(files={f"{package}/__init__.py": b"for _ in iter(int, 1):\n    pass\n"})
    result = verify(task, loop, timeout_s=3)
    assert (result.status, result.reward) == ("timeout", 0.0)
    assert result.limit == "wall_time" and result.scored


def test_memory_limit_is_a_timeout_with_reward_zero_naming_the_limit(demo_dir: Path) -> None:
    task = load_task(demo_dir / "demo-11-0000")
    task = dataclasses.replace(task, limits=task.limits.replace(memory_mb=128))
    package = next(p.name for p in task.snapshot_dir.iterdir() if (p / "__init__.py").exists())
    hog = CandidateChanges(files={f"{package}/__init__.py": b"_hog = bytearray(400 * 2**20)\n"})
    result = verify(task, hog)
    assert (result.status, result.reward, result.limit) == ("timeout", 0.0, "memory")
    assert "memory limit" in result.detail and result.to_json()["limit"] == "memory"


def test_infra_failure_is_a_status_never_a_zero(task_copy: Path) -> None:
    task = load_task(task_copy)
    shutil.rmtree(task.snapshot_dir)
    result = verify(task)
    assert result.status in ("infra_error", "task_error") and result.reward is None


def test_policy_can_turn_a_rule_off_or_keep_reward(demo_dir: Path) -> None:
    task = load_task(demo_dir / "demo-11-0000")
    changes = CandidateChanges(files={**solution_changes(task).files, "conftest.py": b"\n"})
    assert verify(task, changes).reward == 0.0
    lenient = verify(task, changes, policy=GuardPolicy(zero_on_tamper=False))
    assert lenient.reward == 1.0 and lenient.tampered
    off = verify(task, changes, policy=GuardPolicy(severities={"conftest_change": "off"}))
    assert off.reward == 1.0 and off.flags == ()
    with pytest.raises(ValueError, match="unknown rule"):
        GuardPolicy(severities={"nope": "off"})


# -- command line -----------------------------------------------------------------------------


def test_cli_demo_validate_checkout_verify(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert (
        cli_main(["tasks", "demo", "--out", str(tmp_path / "t"), "--count", "2", "--seed", "4"])
        == 0
    )
    capsys.readouterr()
    assert cli_main(["tasks", "validate", str(tmp_path / "t")]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [line["ok"] for line in lines] == [True, True] and lines[0]["task_id"] == "demo-4-0000"
    task = tmp_path / "t" / "demo-4-0000"
    assert cli_main(["tasks", "checkout", str(task), str(tmp_path / "ws"), "--solved"]) == 0
    capsys.readouterr()
    assert cli_main(["verify", str(task), str(tmp_path / "ws")]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["reward"] == 1.0 and out["status"] == "ok" and out["flags"] == []
    (tmp_path / "bad").mkdir()
    assert cli_main(["tasks", "validate", str(tmp_path / "bad")]) == 1
    out = json.loads(capsys.readouterr().out)
    assert out["ok"] is False and any("instruction.md" in error for error in out["errors"])
