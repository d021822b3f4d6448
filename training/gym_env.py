"""A Gymnasium environment over one rollyard task and a sandbox, with text actions and observations.

An action is the JSON form of a tool call (`{"tool": "run_command", "command": "pytest -q"}`,
see `training.actions.action_to_json`); the observation is the text the tool returned. The
reward is 0 until the episode ends — by `submit` (terminated) or the step budget (truncated) —
when the verifier scores the workspace. Text that is not a valid action is answered with an
observation saying what to send, so any Gymnasium agent (random ones included) can drive it.
"""

from __future__ import annotations

import string
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from rollyard.status import EpisodeStatus
from sandboxes import Sandbox, SandboxError, open_sandbox
from tasks_lib.format.model import Task
from training.actions import Action, Submit, action_from_json, cap_text
from training.episode import EpisodeConfig, Verifier, apply_action, verify_agent_sandbox
from training.errors import ActionParseError, EnvLifecycleError, TrainingSettingsError

TEXT_CHARSET = string.printable
"""Characters of both spaces: printable ASCII and whitespace. Other characters in command output
are replaced by `?` so every observation lies in the observation space."""
MAX_ACTION_CHARS = 20_000


def _to_charset(text: str) -> str:
    if text.isascii() and text.isprintable():
        return text
    allowed = set(TEXT_CHARSET)
    return "".join(char if char in allowed else "?" for char in text)


class RollyardEnv(gym.Env[str, str]):
    """One task as a Gymnasium environment.

    The sandbox is opened on the first `reset()` over the task's snapshot (or pass one: the
    environment then does not close it). `reset(seed=...)` returns the instruction; seeding has
    nothing to randomize in the task itself but is honoured for Gymnasium's RNG contract.
    """

    metadata: dict[str, Any] = {"render_modes": []}  # noqa: RUF012 - Gymnasium's class attribute

    def __init__(
        self,
        task: Task,
        *,
        sandbox: Sandbox | None = None,
        config: EpisodeConfig | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.task = task
        self.config = config or EpisodeConfig()
        if self.config.max_steps < 2:
            raise TrainingSettingsError(
                f"EpisodeConfig.max_steps={self.config.max_steps}: a Gymnasium episode needs at "
                "least 2 steps (1 would truncate every episode at its first action)"
            )
        self.verifier = verifier or verify_agent_sandbox
        self._sandbox = sandbox
        self._owns_sandbox = sandbox is None
        self._observation_max_chars = (
            max(self.config.observation_max_bytes, len(task.instruction)) + 64
        )
        self.observation_space = spaces.Text(
            max_length=self._observation_max_chars,
            min_length=0,
            charset=TEXT_CHARSET,
        )
        self.action_space = spaces.Text(
            max_length=MAX_ACTION_CHARS, min_length=1, charset=TEXT_CHARSET
        )
        self._step_count = 0
        self._needs_reset = True
        self._closed = False

    def _open(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = open_sandbox(self.task.snapshot_dir, limits=self.task.limits)
        return self._sandbox

    def _observation(self, text: str) -> str:
        capped, _ = cap_text(_to_charset(text), self._observation_max_chars)
        return capped

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        if self._closed:
            raise EnvLifecycleError(
                "Cannot call reset() on a closed RollyardEnv; create a new environment"
            )
        super().reset(seed=seed)
        self._open().reset()
        self._step_count = 0
        self._needs_reset = False
        return self._observation(self.task.instruction), {"task_id": self.task.id, "step": 0}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._closed:
            raise EnvLifecycleError("Cannot call step() on a closed RollyardEnv; create a new one")
        if self._needs_reset:
            raise EnvLifecycleError(
                "Cannot call step() before reset() (or after the episode ended); call reset()"
            )
        sandbox = self._open()
        self._step_count += 1
        info: dict[str, Any] = {"task_id": self.task.id, "step": self._step_count}
        parsed: Action | None
        exit_code: int | None
        try:
            parsed = action_from_json(action)
        except ActionParseError as error:
            text, exit_code, parsed = f"invalid action: {error}", 2, None
        else:
            observation, _ = apply_action(
                sandbox,
                parsed,
                timeout_s=self.config.step_timeout_s,
                max_bytes=self.config.observation_max_bytes,
            )
            text, exit_code = observation.text, observation.exit_code
        info["exit_code"] = exit_code
        terminated = isinstance(parsed, Submit)
        truncated = not terminated and self._step_count >= self.config.max_steps
        reward = 0.0
        if terminated or truncated:
            self._needs_reset = True
            try:
                verdict = self.verifier(self.task, sandbox)
            except (
                SandboxError,
                Exception,
            ) as error:  # a crash is reported, never scored 0 silently
                info["status"] = str(EpisodeStatus.VERIFIER_ERROR)
                info["error"] = f"{type(error).__name__}: {error}"
            else:
                reward = float(verdict.reward or 0.0)
                info["status"] = str(verdict.status)
        return self._observation(text), reward, terminated, truncated, info

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_sandbox and self._sandbox is not None:
            self._sandbox.close()
        self._sandbox = None
        super().close()
