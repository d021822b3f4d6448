"""The training exception tree: catch `TrainingError` for everything, or a subclass for one cause.

`TrainingError` sits under `rollyard.errors.RollyardError`; each class sets the `rollyard`
command's exit code (the table in `rollyard.errors`). Every exception passes all its arguments
to `super().__init__` so it pickles across Dask and Prefect process boundaries unchanged.
"""

from __future__ import annotations

from typing import Any

from rollyard.errors import EXIT_DAMAGED, EXIT_UNAVAILABLE, EXIT_USAGE, RollyardError


class TrainingError(RollyardError):
    """Base of every error raised by `training`."""


class TrainingSettingsError(TrainingError, ValueError):
    """A training setting or input cannot be used (a count below 1, a rate outside [0, 1], a
    directory without tasks, a run that exists but was not asked to resume)."""

    exit_code = EXIT_USAGE


class PolicySpecError(TrainingError, ValueError):
    """A policy spec (`builtin`, `openai:BASE_URL#MODEL`, `hf:DIR`) is malformed, or names a
    model directory that lacks what a chat policy needs."""

    exit_code = EXIT_USAGE


class PolicyError(TrainingError):
    """A policy could not choose an action (its model failed, or its output could not be used).

    The episode runner turns it into the `policy_error` status; it is never scored as reward 0."""


class PolicyServerError(PolicyError):
    """An OpenAI-compatible endpoint rejected a request (HTTP 4xx) or answered with a body that
    is not a chat completion: retrying the same request would not help. Exit 2: the spec or the
    server's settings need fixing (a wrong URL, a key, vLLM's tool-calling flags); exit 3 when
    the answer was a 5xx (the server failed, not the request)."""

    exit_code = EXIT_USAGE

    def __init__(self, message: str, status_code: int | None = None) -> None:
        super().__init__(message, status_code)
        self.message = message
        self.status_code = status_code
        if status_code is not None and status_code >= 500:
            self.exit_code = EXIT_UNAVAILABLE

    def __str__(self) -> str:
        return self.message


class PolicyUnavailableError(PolicyServerError):
    """The model server did not answer: connection refused, timeouts, HTTP 5xx or 429 after every
    retry. The episode runner records an `infra_error`, so the recovery path runs it again."""

    exit_code = EXIT_UNAVAILABLE


class ServedTokensError(PolicyUnavailableError):
    """The server answered a turn whose token record cannot be kept: ids outside the
    tokenizer's range or the int32 column, logprobs that are not finite and <= 0, or ids and
    logprobs of different lengths. The server's failure: an `infra_error`, run again, never
    stored as `ok` nor trained on."""


class ModelNotServedError(PolicyServerError):
    """The server answers but does not serve the model the spec names."""

    exit_code = EXIT_USAGE


class ContextExhaustedError(PolicyError):
    """The conversation no longer fits the model's context window. The episode runner ends the
    episode with the `context_exhausted` status and still verifies the workspace."""

    def __init__(self, message: str, prompt_tokens: int | None, context_tokens: int | None) -> None:
        super().__init__(message, prompt_tokens, context_tokens)
        self.message = message
        self.prompt_tokens = prompt_tokens
        self.context_tokens = context_tokens

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


class EnvInfrastructureError(TrainingError):
    """A Gymnasium episode ended in an infrastructure failure (the verifier crashed, or returned
    an infrastructure status): the environment, not the agent, failed, so there is no reward to
    give, not even 0. `status` names the failure (`rollyard.status.INFRASTRUCTURE_STATUSES`),
    `observation` and `info` are what `step` would have returned. Reset and run the episode
    again, or leave it out of the batch."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, message: str, status: str, observation: str, info: dict[str, Any]) -> None:
        super().__init__(message, status, observation, info)
        self.message = message
        self.status = status
        self.observation = observation
        self.info = info

    def __str__(self) -> str:
        return self.message


class LanguageModelError(TrainingError):
    """A language model could not be built, loaded or asked to generate."""


class ModelDirError(LanguageModelError, ValueError):
    """A directory is not a usable Hugging Face causal-LM directory (missing config, weights,
    tokenizer or chat template), or its model is not a causal LM."""


class ContextLengthError(LanguageModelError, ValueError):
    """A prompt (plus the tokens asked for) does not fit the model's context window.

    Raised before any token is generated, so nothing is spent on a request that cannot finish."""

    def __init__(self, message: str, prompt_tokens: int, max_context_tokens: int) -> None:
        super().__init__(message, prompt_tokens, max_context_tokens)
        self.message = message
        self.prompt_tokens = prompt_tokens
        self.max_context_tokens = max_context_tokens

    def __str__(self) -> str:
        return self.message


class ServerRequestError(LanguageModelError):
    """A request the small-scale server refuses: answered with `status` and an OpenAI-style error
    body naming `param` (the server's handler turns it into the response; it never reaches a
    user as an exception)."""

    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(status, message, param)
        self.status = status
        self.message = message
        self.param = param
