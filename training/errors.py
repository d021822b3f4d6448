"""The training exception tree: catch `TrainingError` for everything, or a subclass for one cause.

`TrainingError` sits under `rollyard.errors.RollyardError`; each class sets the `rollyard`
command's exit code (the table in `rollyard.errors`). Every exception passes all its arguments
to `super().__init__` so it pickles across Dask and Prefect process boundaries unchanged.
"""

from __future__ import annotations

from rollyard.errors import EXIT_DAMAGED, EXIT_UNAVAILABLE, EXIT_USAGE, RollyardError


class TrainingError(RollyardError):
    """Base of every error raised by `training`."""


class TrainingSettingsError(TrainingError, ValueError):
    """A training setting or input cannot be used (a count below 1, a rate outside [0, 1], a
    directory without tasks, a run that exists but was not asked to resume)."""

    exit_code = EXIT_USAGE


class PolicyError(TrainingError):
    """A policy could not choose an action (its model failed, or its output could not be used).

    The episode runner turns it into the `policy_error` status; it is never scored as reward 0."""


class PolicyServerError(PolicyError):
    """An OpenAI-compatible endpoint failed after every retry (connection refused, timeouts,
    HTTP 5xx/429), or answered with a body that is not a chat completion."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message, status_code)
        self.message = message
        self.status_code = status_code

    def __str__(self) -> str:
        return self.message


class ActionParseError(TrainingError, ValueError):
    """Text or a tool call could not be read as an action (unknown tool, missing argument)."""

    exit_code = EXIT_USAGE


class TrainerError(TrainingError):
    """The trainer was given something it cannot learn from (a trajectory without the policy
    record the policy needs to recompute log-probabilities, a checkpoint of another shape, policy
    bytes that do not match their version)."""

    exit_code = EXIT_DAMAGED


class EnvLifecycleError(TrainingError, RuntimeError):
    """A Gymnasium environment method was called out of order (step before reset, after close)."""
