"""Tasks: load and validate Harbor task directories, generate the built-in demo family, and verify
candidates in a fresh sandbox behind a reward guard.

    from tasks_lib import CandidateChanges, load_task, verify
    task = load_task("tasks/demo-0-0000")
    with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
        ...  # the agent works here
        result = verify(task, CandidateChanges.from_sandbox(sandbox))
"""

from tasks_lib.candidate import CandidateChanges
from tasks_lib.errors import (
    CandidateError,
    GenerationError,
    TaskError,
    TaskNotFoundError,
    TaskValidationError,
    ValidationIssue,
)
from tasks_lib.families.demo import generate_demo_tasks
from tasks_lib.guard import RULES, Flag, GuardPolicy
from tasks_lib.loader import load_task, validate_task
from tasks_lib.model import Task
from tasks_lib.oracle import CheckResult, SolutionError, check_task, checkout, solution_changes
from tasks_lib.verify import VerifyResult, verify

__all__ = [
    "RULES",
    "CandidateChanges",
    "CandidateError",
    "CheckResult",
    "Flag",
    "GenerationError",
    "GuardPolicy",
    "SolutionError",
    "Task",
    "TaskError",
    "TaskNotFoundError",
    "TaskValidationError",
    "ValidationIssue",
    "VerifyResult",
    "check_task",
    "checkout",
    "generate_demo_tasks",
    "load_task",
    "solution_changes",
    "validate_task",
    "verify",
]
