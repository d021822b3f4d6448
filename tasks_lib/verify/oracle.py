"""The oracle side of a task: its reference solution as candidate changes, a checkout of the
agent's starting workspace, and the check that the solution scores 1 and the untouched workspace 0.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any

from sandboxes import SandboxError
from tasks_lib.errors import SolutionError, TaskError
from tasks_lib.format.environment import open_task_sandbox
from tasks_lib.format.model import VERIFIER_DIR, Task
from tasks_lib.verify.candidate import CandidateChanges
from tasks_lib.verify.context import VerifyResult
from tasks_lib.verify.guard import GuardPolicy
from tasks_lib.verify.harbor import harbor_script
from tasks_lib.verify.run import verify

SOLUTION_MOUNT = f"{VERIFIER_DIR}/solution"


def solution_changes(task: Task, *, backend: str = "bwrap") -> CandidateChanges:
    """Run the task's `solution/solve.sh` in a sandbox over the snapshot and return its changes.

    The script runs sandboxed because a task directory is third-party content like any other.
    """
    script = task.solution_dir / "solve.sh"
    if not script.is_file():
        raise SolutionError(
            f"{script} is missing; add a solve.sh that applies the reference solution"
        )
    with open_task_sandbox(task, backend) as sandbox:
        for dirpath, _dirnames, filenames in os.walk(task.solution_dir):
            for name in filenames:
                full = Path(dirpath) / name
                rel = full.relative_to(task.solution_dir).as_posix()
                sandbox.write_file(f"{SOLUTION_MOUNT}/{rel}", full.read_bytes())
        command = ["bash", f"{SOLUTION_MOUNT}/solve.sh"]
        env = None
        if task.verifier_kind == "harbor":
            # Written for Harbor's image: /solution, the WORKDIR; `[solution].env` applies.
            text = (task.solution_dir / "solve.sh").read_text(encoding="utf-8", errors="replace")
            sandbox.write_file(f"{SOLUTION_MOUNT}/.run.sh", harbor_script(task, text, VERIFIER_DIR))
            command = ["bash", f"{SOLUTION_MOUNT}/.run.sh"]
            env = {**task.harbor.environment.env, **task.harbor.solution_env}
        result = sandbox.execute(command, timeout_s=task.verify_timeout_s, env=env)
        if not result.ok:
            raise SolutionError(
                f"{script} failed (exit {result.exit_code}, timed out {result.timed_out}): "
                f"{(result.stderr or result.stdout).strip()[-300:]}"
            )
        sandbox.execute(["rm", "-rf", VERIFIER_DIR], timeout_s=30)
        return CandidateChanges.from_sandbox(sandbox)


def apply_changes(changes: CandidateChanges, dest: Path) -> None:
    """Write `changes` into the directory `dest` (links are not applied)."""
    for path in changes.deleted:
        target = dest / path
        if target.is_file() or target.is_symlink():
            target.unlink()
    for path, data in changes.files.items():
        target = dest / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)


def checkout(task: Task, dest: str | Path, *, solved: bool = False) -> Path:
    """Copy the workspace the agent starts from to `dest` (which must not exist); with `solved`,
    with the reference solution applied."""
    destination = Path(dest)
    if destination.exists():
        raise TaskError(f"{destination} already exists; choose a new directory")
    changes = solution_changes(task) if solved else None
    partial = destination.with_name(destination.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    shutil.copytree(task.snapshot_dir, partial, symlinks=True)
    if changes is not None:
        apply_changes(changes, partial)
    partial.rename(destination)
    return destination


@dataclasses.dataclass(frozen=True, slots=True)
class CheckResult:
    """Oracle check of one task: the solution must score 1, the untouched workspace 0."""

    task_id: str
    ok: bool
    problems: tuple[str, ...]
    solution: VerifyResult | None
    untouched: VerifyResult | None

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "ok": self.ok,
            "problems": list(self.problems),
            "solution": self.solution.to_json() if self.solution else None,
            "untouched": self.untouched.to_json() if self.untouched else None,
        }


def check_task(task: Task, *, policy: GuardPolicy | None = None) -> CheckResult:
    """Oracle check: the reference solution scores 1 with no tamper flag, the untouched workspace
    scores 0, every fail_to_pass test fails and every pass_to_pass test passes before the fix."""
    problems: list[str] = []
    try:
        changes = solution_changes(task)
    except (SolutionError, SandboxError) as error:
        return CheckResult(task.id, False, (f"solution: {error}",), None, None)
    solved = verify(task, changes, policy=policy)
    untouched = verify(task, CandidateChanges.empty(), policy=policy)
    if solved.reward != 1.0:
        failing = [test_id for test_id, outcome in solved.tests.items() if outcome != "passed"]
        problems.append(
            f"solution scores {solved.reward} (status {solved.status}: {solved.detail}); "
            f"not passing: {failing[:5]}"
        )
    if solved.tampered:
        problems.append(f"solution raises tamper flags: {[f.rule for f in solved.flags]}")
    if untouched.reward != 0.0:
        problems.append(
            f"untouched workspace scores {untouched.reward} (status {untouched.status}: "
            f"{untouched.detail}); the task is solved before any change"
        )
    if untouched.status == "ok":
        for test_id in task.fail_to_pass:
            if untouched.tests.get(test_id) == "passed":
                problems.append(f"fail_to_pass test {test_id} passes before the fix")
        for test_id in task.pass_to_pass:
            if untouched.tests.get(test_id) != "passed":
                problems.append(
                    f"pass_to_pass test {test_id} is {untouched.tests.get(test_id)} before the fix"
                )
    return CheckResult(task.id, not problems, tuple(problems), solved, untouched)
