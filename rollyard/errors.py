"""The root of every rollyard error and the command line's exit codes.

Each package keeps its own tree in its own `errors` module (`SandboxError`, `TaskError`,
`StoreError`, `TrainingError`, `FlowError`), all under `RollyardError`, so a caller catches at the
level it cares about. Every argument goes to `super().__init__` so an error pickles across Dask
and Prefect processes unchanged.

Exit codes of the `rollyard` command: `EXIT_CODE_MEANINGS`, which `rollyard --help` and the
README's CLI reference print.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_DAMAGED = 4
EXIT_INTERRUPTED = 130

EXIT_CODE_MEANINGS: tuple[tuple[int, str], ...] = (
    (EXIT_OK, "success"),
    (
        EXIT_FAILED,
        "the command ran and failed: a gate stopped a run, a check or lint found problems, "
        "nothing could be imported",
    ),
    (EXIT_USAGE, "bad input: a malformed argument, spec, task, candidate or settings file"),
    (
        EXIT_UNAVAILABLE,
        "something rollyard needs is missing or unreachable: a store, a Prefect server, Dask "
        "workers, a sandbox backend; or the verifier could not score (infra or verifier error)",
    ),
    (
        EXIT_DAMAGED,
        "the store or a task is damaged or in a state the command refuses: a task the verifier "
        "judged broken, import rows that failed, a checkpoint that does not fit",
    ),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)
"""Every exit code of the `rollyard` command and what it means, in order."""


class RollyardError(Exception):
    """Base class of every error rollyard raises on purpose.

    `exit_code` is what the command line exits with when this error reaches it; subclasses set
    the class attribute (see the table in this module's docstring)."""

    exit_code: int = EXIT_FAILED


def exit_code_for(error: BaseException) -> int:
    """The command line's exit code for an error: its class's `exit_code`, 1 for anything else."""
    if isinstance(error, RollyardError):
        return error.exit_code
    return EXIT_FAILED


class OutPathError(RollyardError, ValueError):
    """A path a command was told to write (`--out`) is one it must not write: a link, a
    directory, a device or FIFO, a non-empty directory (`rollyard.out_paths`)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class SettingsError(RollyardError, ValueError):
    """An environment variable holds a value its setting cannot take (`rollyard.settings`)."""

    exit_code = EXIT_USAGE
