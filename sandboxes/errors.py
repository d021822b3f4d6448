"""The sandbox exception tree: catch `SandboxError` for everything, or a subclass for one cause.

`SandboxError` sits under `rollyard.errors.RollyardError`; each class sets the `rollyard`
command's exit code (the table in `rollyard.errors`). Every exception passes all its arguments
to `super().__init__` so it pickles across Dask and Prefect process boundaries unchanged.
"""

from __future__ import annotations

from rollyard.errors import EXIT_UNAVAILABLE, EXIT_USAGE, RollyardError


class SandboxError(RollyardError):
    """Base of every error raised by `sandboxes`."""


class SandboxUnavailableError(SandboxError):
    """The host lacks something the backend needs (bubblewrap, user namespaces, overlayfs,
    cgroups, root). The message names what is missing and how to install or enable it; rollyard
    never falls back to running a command unsandboxed."""

    exit_code = EXIT_UNAVAILABLE


class UnknownBackendError(SandboxError, ValueError):
    """A sandbox backend name that is none of `sandboxes.BACKENDS`, or a backend asked for what
    it does not do (an image on bwrap)."""

    exit_code = EXIT_USAGE


class SandboxClosedError(SandboxError):
    """An operation was attempted on a sandbox after `close()`."""


class SandboxSetupError(SandboxError):
    """Creating, resetting or tearing down a sandbox failed on the host (an infra failure, never
    the command's fault)."""

    exit_code = EXIT_UNAVAILABLE


class SandboxCrashedError(SandboxError):
    """The sandbox's processes died from outside the command (killed, OOM-killed by the host,
    hung past recovery): an infra failure of this attempt, never the command's fault."""

    exit_code = EXIT_UNAVAILABLE


class SnapshotError(SandboxError):
    """The snapshot directory is missing, unreadable, or holds something a snapshot cannot
    (device files, sockets, links that leave it)."""

    exit_code = EXIT_USAGE


class WorkspacePathError(SandboxError, ValueError):
    """A path given to read_file/write_file is absolute outside the workspace, or resolves
    (through `..` or symlinks) to a place outside it."""

    exit_code = EXIT_USAGE


class InvalidLimitsError(SandboxError, ValueError):
    """A `Limits` field has a value that cannot be enforced (negative, zero, wrong type)."""

    exit_code = EXIT_USAGE
