"""Tasks along their data path: the task format, the verifier, the sources of tasks, curation.

    format/   the Harbor task directory: model, loader (validation), verifier-kind tables, path
              globs, the task-directory finder
    verify/   scores a candidate in a fresh sandbox: guard, one dispatch per verifier kind, the
              hardened pytest run, the oracle check
    sources/  where tasks come from: families (generators), synthesis from real projects,
              SWE-bench import, and the authoring kit whose writer every source writes through
    curate/   admits tasks into the library: validity, flakiness, duplicates, contamination
    errors.py every exception of the package, under `TaskError`

Each part imports only the parts listed above it (and `errors`), and only their public names.

    from tasks_lib import CandidateChanges, load_task, verify
    task = load_task("tasks/demo-0-0000")
    with open_task_sandbox(task) as sandbox:  # its own image on docker when it brings one
        ...  # the agent works here
        result = verify(task, CandidateChanges.from_sandbox(sandbox))
"""

from tasks_lib.errors import (
    CandidateError,
    GenerationError,
    SolutionError,
    TaskError,
    TaskNotFoundError,
    TaskRefusedError,
    TaskValidationError,
    ValidationIssue,
)
from tasks_lib.format import (
    Task,
    find_task_dirs,
    load_task,
    open_task_sandbox,
    task_image,
    validate_task,
)
from tasks_lib.sources.families.demo import generate_demo_tasks
from tasks_lib.verify import (
    RULES,
    CandidateChanges,
    CheckResult,
    Flag,
    GuardPolicy,
    VerifyResult,
    check_task,
    checkout,
    solution_changes,
    verify,
)

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
    "TaskRefusedError",
    "TaskValidationError",
    "ValidationIssue",
    "VerifyResult",
    "check_task",
    "checkout",
    "find_task_dirs",
    "generate_demo_tasks",
    "load_task",
    "open_task_sandbox",
    "solution_changes",
    "task_image",
    "validate_task",
    "verify",
]
