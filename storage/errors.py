"""The exceptions of the trajectory store, as one tree under `rollyard.errors.RollyardError`:
catch `StoreError` for any of them, or a subclass for the case you handle.

Each class's `exit_code` is what the `rollyard` command exits with when it reaches it (the table
in `rollyard.errors`). Every exception passes all its arguments to `super().__init__` so it
survives pickling across Dask and Prefect process boundaries.
"""

from __future__ import annotations

from rollyard.errors import EXIT_DAMAGED, EXIT_FAILED, EXIT_UNAVAILABLE, EXIT_USAGE, RollyardError


class StoreError(RollyardError):
    """Base class of every error raised by `storage`."""

    exit_code = EXIT_FAILED

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class StoreNotFoundError(StoreError):
    """The store root (or one of its tables) does not exist where it was looked for."""

    exit_code = EXIT_UNAVAILABLE


class SchemaMismatchError(StoreError):
    """Data or an existing table does not match the schema this version of rollyard defines."""

    exit_code = EXIT_DAMAGED


class RecordError(StoreError):
    """A record handed to the store is invalid (missing field, wrong type, duplicate id, ...)."""

    exit_code = EXIT_USAGE


class CorruptFileError(StoreError):
    """A file the store reads (Parquet data, a checkpoint blob) is unreadable or does not match
    its recorded digest; the message names the file."""

    exit_code = EXIT_DAMAGED


class CommitError(StoreError):
    """A commit could not be completed (for example after exhausting conflict retries); replaying
    it is safe."""

    exit_code = EXIT_FAILED


class CheckpointNotFoundError(StoreError):
    """No checkpoint is recorded for the requested (run_id, policy_version)."""

    exit_code = EXIT_UNAVAILABLE


class QueryError(StoreError):
    """A SQL or named query failed; the message carries DuckDB's first line."""

    exit_code = EXIT_USAGE


class GateSettingsError(StoreError, ValueError):
    """A gate setting (argument or `ROLLYARD_GATE_*` variable) has a value that cannot work."""

    exit_code = EXIT_USAGE
