"""A Gymnasium environment over one rollyard task and a sandbox, with text actions and observations.

Registered as `rollyard/Task-v0` when this module is imported (so is it by `import training`):

    import gymnasium as gym
    import training.gym_env  # or gym.make("training.gym_env:rollyard/Task-v0", ...)
    env = gym.make("rollyard/Task-v0", task_dir="tasks/calc")

An action is the JSON form of a tool call (`{"tool": "run_command", "command": "pytest -q"}`,
see `training.actions.action_to_json`); the observation is the text the tool returned. Both are
any Unicode text (`UnicodeText`). The reward is 0 until the episode ends — by `submit`
(terminated) or the step budget (truncated) — when the verifier scores the workspace. A verifier
that fails (raises, or reports an infrastructure status) has no reward to give: `step` raises
`EnvInfrastructureError` instead of scoring it 0. Text that is not a valid action is answered
with an observation saying what to send, so any Gymnasium agent (random ones included) can
drive it.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium import spaces

from rollyard.status import INFRASTRUCTURE_STATUSES, EpisodeStatus
from sandboxes import Sandbox, open_sandbox
from tasks_lib.format.loader import load_task
from tasks_lib.format.model import Task
from training.actions import Action, Submit, action_from_json, cap_text
from training.episode import EpisodeConfig, Verifier, apply_action, verify_agent_sandbox
from training.errors import (
    ActionParseError,
    EnvInfrastructureError,
    EnvLifecycleError,
    TrainingSettingsError,
)

ENV_ID = "rollyard/Task-v0"
SAMPLE_CHARSET = string.printable
"""Characters `sample()` draws text from; the spaces themselves hold any Unicode text."""
MAX_ACTION_CHARS = 20_000


class UnicodeText(spaces.Text):
    """A Gymnasium text space holding any Unicode string of `min_length` to `max_length`
    characters (a string that encodes as UTF-8: no lone surrogates). Gymnasium's `Text` holds
    only the characters of a finite charset; task instructions, file contents and command output
    hold any. Samples are drawn from `SAMPLE_CHARSET`."""

    def __init__(self, max_length: int, *, min_length: int = 1, seed: int | None = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    def contains(self, x: Any) -> bool:
        if not isinstance(x, str) or not self.min_length <= len(x) <= self.max_length:
            return False
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return False
        return True

    def __repr__(self) -> str:
        return f"UnicodeText({self.min_length}, {self.max_length})"


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
        self.observation_space = UnicodeText(self._observation_max_chars, min_length=0)
        self.action_space = UnicodeText(MAX_ACTION_CHARS, min_length=1)
        self._step_count = 0
        self._needs_reset = True
        self._closed = False

    def _open(self) -> Sandbox:
        if self._sandbox is None:
            self._sandbox = open_sandbox(self.task.snapshot_dir, limits=self.task.limits)
        return self._sandbox

    def _observation(self, text: str) -> str:
        # Text from a sandbox may hold lone surrogates (undecodable bytes kept as escapes).
        text = text.encode("utf-8", "replace").decode("utf-8")
        capped, _ = cap_text(text, self._observation_max_chars)
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
            except Exception as error:  # a crash is an infrastructure failure, never a 0
                status, detail = EpisodeStatus.VERIFIER_ERROR, f"{type(error).__name__}: {error}"
            else:
                status, detail = EpisodeStatus(verdict.status), verdict.detail
            info["status"] = str(status)
            if status in INFRASTRUCTURE_STATUSES:
                info["error"] = detail
                raise EnvInfrastructureError(
                    f"task {self.task.id}: the episode ended in {status} ({detail or 'no detail'}"
                    "): an infrastructure failure, not a score; call reset() and run it again, "
                    "or leave the episode out",
                    str(status),
                    self._observation(text),
                    info,
                )
            reward = float(verdict.reward or 0.0)
        return self._observation(text), reward, terminated, truncated, info

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._owns_sandbox and self._sandbox is not None:
            self._sandbox.close()
        self._sandbox = None
        super().close()


def make_task_env(
    task_dir: str | Path,
    *,
    config: EpisodeConfig | None = None,
    verifier: Verifier | None = None,
) -> RollyardEnv:
    """The environment of the task in `task_dir` (a Harbor task directory): the entry point of
    `gymnasium.make("rollyard/Task-v0", task_dir=...)`. A directory that is not a valid task
    raises the loader's error naming what is wrong."""
    return RollyardEnv(load_task(task_dir), config=config, verifier=verifier)


if ENV_ID not in gym.registry:
    # The environment truncates itself at `EpisodeConfig.max_steps`, so no TimeLimit wrapper.
    gym.register(ENV_ID, entry_point="training.gym_env:make_task_env")
