"""The flows exception tree: catch `FlowError` for everything the flows and the CLI raise.

Each class sets the `rollyard` command's exit code (the table in `rollyard.errors`). Every
exception passes all its arguments to `super().__init__` so it pickles across Dask and Prefect
process boundaries unchanged.
"""

from __future__ import annotations

from rollyard.errors import EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE, RollyardError


class FlowError(RollyardError):
    """Base of every error raised by `flows`."""


class CliError(FlowError):
    """A one-line error for the user from a command; the CLI prints it and exits with
    `exit_code` (1 unless the command says otherwise, from the table in `rollyard.errors`)."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message, exit_code)
        self.message = message
        self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class FlowSettingsError(FlowError, ValueError):
    """A flow's settings hold a value it cannot run with (an unknown mode, a count below 1)."""

    exit_code = EXIT_USAGE


class PrefectServerError(FlowError):
    """The local Prefect API server rollyard starts did not come up (it exited, or did not
    answer in time); the message names its log file."""

    exit_code = EXIT_UNAVAILABLE


class NoWorkersError(FlowError):
    """The Dask cluster had no worker for longer than the settings allow, with shards queued."""

    exit_code = EXIT_UNAVAILABLE


class GateStoppedRun(FlowError):
    """A quality gate failed and the settings say to stop training. What the run committed
    stays in the store (quarantined); `--resume` continues it."""


class ShardDeadlineError(FlowError):
    """A shard ran past its deadline again after its worker had been restarted for it
    `HUNG_SHARD_RESTARTS` times, or its worker could be neither restarted nor removed; what was
    committed stays (rerun with `--resume`)."""
