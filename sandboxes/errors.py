"""The sandbox exception tree: catch `SandboxError` for everything, or a subclass for one cause.

Every exception passes all its arguments to `super().__init__` so it pickles across Dask and
Prefect process boundaries unchanged.
"""

from __future__ import annotations


class SandboxError(Exception):
    """Base of every error raised by `sandboxes`."""


class SandboxUnavailableError(SandboxError):
    """The host lacks something the backend needs (bubblewrap, user namespaces, overlayfs,
    cgroups, root). The message names what is missing and how to install or enable it; rollyard
    never falls back to running a command unsandboxed."""


class SandboxClosedError(SandboxError):
    """An operation was attempted on a sandbox after `close()`."""


class SandboxSetupError(SandboxError):
    """Creating, resetting or tearing down a sandbox failed on the host (an infra failure, never
    the command's fault)."""


class SnapshotError(SandboxError):
    """The snapshot directory is missing, unreadable, or holds something a snapshot cannot
    (device files, sockets, links that leave it)."""


class WorkspacePathError(SandboxError, ValueError):
    """A path given to read_file/write_file is absolute outside the workspace, or resolves
    (through `..` or symlinks) to a place outside it."""


class InvalidLimitsError(SandboxError, ValueError):
    """A `Limits` field has a value that cannot be enforced (negative, zero, wrong type)."""
