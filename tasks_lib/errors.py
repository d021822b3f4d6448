"""The task-library exception tree: catch `TaskError` for everything, or a subclass for one cause.

    RollyardError
    ├── TaskError                       any task-library failure (exit 1)
    │   ├── TaskNotFoundError           a task path does not exist (exit 3)
    │   ├── TaskValidationError         a task directory breaks the format (exit 2)
    │   ├── CandidateError              a candidate cannot be read as changes (exit 2)
    │   │   └── CandidateBoundsError    a candidate beyond the verifier's bounds (exit 2)
    │   ├── GenerationError             a source could not produce the tasks asked for (exit 1)
    │   ├── SolutionError               a task's solution/solve.sh is missing or fails (exit 4)
    │   ├── ReportError                 a JUnit report does not parse (exit 1)
    │   ├── ArtifactError               an artifact cannot be read as its format (exit 2)
    │   ├── ScaffoldError               a family cannot be scaffolded (exit 2)
    │   ├── RowError                    a SWE-bench row cannot be imported (exit 2)
    │   ├── CurationSettingsError       a curation setting cannot work (exit 2)
    │   └── CurationError               curation cannot start (exit 2)
    └── SandboxError (sandboxes)
        ├── VerifierSetupError          preparing the verifier's sandbox failed (exit 3)
        └── ProbeError                  the verifier's service probe did not report (exit 3)

The last two are infrastructure failures of the verifier's own sandbox, not the task's or the
candidate's fault, so they stay under `SandboxError`: the verifier turns them into the
`infra_error` status. Exit codes follow the table in `rollyard.errors`.

Every exception passes all its arguments to `super().__init__` so it pickles across Dask and
Prefect process boundaries unchanged.
"""

from __future__ import annotations

import dataclasses

from rollyard.errors import (
    EXIT_DAMAGED,
    EXIT_FAILED,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    RollyardError,
)
from sandboxes import SandboxError


@dataclasses.dataclass(frozen=True, slots=True)
class ValidationIssue:
    """One problem found in a task directory: where it is, what is wrong, and how to fix it."""

    file: str
    """Path relative to the task directory (`task.toml`, `tests/test.sh`, ...)."""
    field: str
    """Dotted field name inside the file (`rollyard.fail_to_pass[2]`), or `-` for the file itself."""
    value: str
    """The offending value as written (repr, shortened), or `-` when it is missing."""
    message: str
    """What is wrong."""
    fix: str
    """What to do about it."""

    def __str__(self) -> str:
        return f"{self.file}: {self.field} = {self.value}: {self.message}; {self.fix}"


class TaskError(RollyardError):
    """Base of every error raised by `tasks_lib`."""

    exit_code = EXIT_FAILED


class TaskNotFoundError(TaskError, FileNotFoundError):
    """The task path does not exist or is not a directory."""

    exit_code = EXIT_UNAVAILABLE


class TaskValidationError(TaskError, ValueError):
    """A task directory breaks the Harbor layout or the `[rollyard]` schema."""

    exit_code = EXIT_USAGE

    def __init__(self, task_path: str, issues: tuple[ValidationIssue, ...]) -> None:
        super().__init__(task_path, issues)
        self.task_path = task_path
        self.issues = issues

    def __str__(self) -> str:
        lines = [f"invalid task {self.task_path} ({len(self.issues)} problem(s)):"]
        lines += [f"  {issue}" for issue in self.issues]
        return "\n".join(lines)


class TaskRefusedError(TaskValidationError):
    """The task asks for what no backend here gives faithfully (network, GPUs, a registry image,
    compose services): it is refused, never run and scored. Its issues say why."""

    def __str__(self) -> str:
        lines = [f"refused task {self.task_path} ({len(self.issues)} reason(s)):"]
        lines += [f"  {issue}" for issue in self.issues]
        return "\n".join(lines)


class CandidateError(TaskError, ValueError):
    """A candidate (a directory or an agent's sandbox) cannot be read as changes to a workspace."""

    exit_code = EXIT_USAGE


class CandidateBoundsError(CandidateError):
    """A candidate is beyond the verifier's bounds (bytes, files, hostile paths); it is not run,
    and an agent's such candidate scores as a failed attempt."""


class GenerationError(TaskError):
    """A task source could not produce the requested tasks (for example too few distinct bugs
    for the requested count, or a project whose suite does not pass)."""


class SolutionError(TaskError):
    """The task's `solution/solve.sh` is missing or failed."""

    exit_code = EXIT_DAMAGED


class ReportError(TaskError, ValueError):
    """A test report is not a pytest JUnit XML document (or is over the size cap)."""


class ArtifactError(TaskError, ValueError):
    """An artifact cannot be read as its declared format."""

    exit_code = EXIT_USAGE


class ScaffoldError(TaskError, ValueError):
    """The family cannot be scaffolded (bad name, the directory exists)."""

    exit_code = EXIT_USAGE


class RowError(TaskError, ValueError):
    """One SWE-bench instance row cannot be imported; the message says which field and what to
    do."""

    exit_code = EXIT_USAGE


class CurationSettingsError(TaskError, ValueError):
    """A curation setting has a value that cannot work; the message names it."""

    exit_code = EXIT_USAGE


class CurationError(TaskError):
    """Curation cannot start (for example an evaluation task that does not load)."""

    exit_code = EXIT_USAGE


class VerifierSetupError(SandboxError):
    """Preparing the verification workspace failed (an infra failure, not the candidate's)."""

    exit_code = EXIT_UNAVAILABLE


class ProbeError(SandboxError):
    """The verifier's own service probe did not report: an infra failure, not the candidate's."""

    exit_code = EXIT_UNAVAILABLE
