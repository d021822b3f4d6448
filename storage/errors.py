"""The exceptions of the trajectory store, as one tree: catch `StoreError` for any of them, or a
subclass for the case you handle.

Every exception passes all its arguments to `super().__init__` so it survives pickling across Dask
and Prefect process boundaries.
"""

from __future__ import annotations


class StoreError(Exception):
    """Base class of every error raised by `storage`."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class StoreNotFoundError(StoreError):
    """The store root (or one of its tables) does not exist where it was looked for."""


class SchemaMismatchError(StoreError):
    """Data or an existing table does not match the schema this version of rollyard defines."""


class RecordError(StoreError):
    """A record handed to the store is invalid (missing field, wrong type, duplicate id, ...)."""


class CorruptFileError(StoreError):
    """A Parquet file the store reads is unreadable; the message names the file."""


class CommitError(StoreError):
    """A commit could not be completed (for example after exhausting conflict retries)."""


class CheckpointNotFoundError(StoreError):
    """No checkpoint is recorded for the requested (run_id, policy_version)."""


class QueryError(StoreError):
    """A SQL or named query failed; the message carries DuckDB's first line."""
