"""Fault recovery for episodes, and the fault injection that proves it.

An episode whose sandbox crashes, hangs or is OOM-killed by the host, or whose policy's model
server stops answering (an *infra* failure, status `infra_error`), is run again in a fresh sandbox: by default its recorded action prefix is replayed
first (`replay`), so the policy continues where it was instead of starting over (`restart`).
Attempts are recorded in the episode key. An episode that keeps failing ends as `infra_error`,
which the trainer masks: infra failures are never a reward of 0.

`FaultPlan` injects real faults at configurable rates, deterministically per episode attempt:
`sandbox_kill` SIGKILLs every process of the sandbox mid-command, `hang` makes a command run far
past its limit, `oom` runs a memory hog into the sandbox's memory limit, `worker_kill` kills the
whole worker process (Dask reschedules the shard elsewhere).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import threading
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from rollyard.status import EpisodeStatus
from sandboxes import (
    ExecResult,
    Sandbox,
    SandboxCrashedError,
    SandboxError,
    SandboxPool,
    WorkspaceDiff,
)
from tasks_lib.format.environment import task_image
from tasks_lib.format.model import Task
from training.actions import History
from training.episode import EpisodeConfig, run_episode
from training.errors import TrainingSettingsError
from training.policy import Decision, Policy
from training.trajectory import EpisodeKey, Step, Trajectory

FaultKind = Literal["sandbox_kill", "hang", "oom", "worker_kill"]
FAULT_KINDS: tuple[FaultKind, ...] = ("sandbox_kill", "hang", "oom", "worker_kill")


@dataclasses.dataclass(frozen=True, slots=True)
class RecoveryPolicy:
    max_attempts: int = 3
    """Attempts per episode, the first included."""
    mode: Literal["replay", "restart"] = "replay"
    """`replay`: re-apply the recorded actions of the failed attempt in a fresh sandbox, then
    let the policy continue. `restart`: start the episode over."""

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise TrainingSettingsError(f"max_attempts must be >= 1, got {self.max_attempts}")
        if self.mode not in ("replay", "restart"):
            raise TrainingSettingsError(f"mode must be 'replay' or 'restart', got {self.mode!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class FaultPlan:
    """Rates (0..1) of injected faults per episode attempt, decided by hashing the episode id,
    the attempt and `seed`, so a rerun injects the same faults."""

    sandbox_kill: float = 0.0
    hang: float = 0.0
    oom: float = 0.0
    worker_kill: float = 0.0
    seed: int = 0
    marker_dir: str | None = None
    """Where a worker kill leaves a marker, so the rescheduled shard does not die again (a real
    lost worker does not follow its work to the next machine). Required for `worker_kill`."""

    def __post_init__(self) -> None:
        for kind in FAULT_KINDS:
            rate = getattr(self, kind)
            if not 0.0 <= rate <= 1.0:
                raise TrainingSettingsError(f"fault rate {kind} must be within [0, 1], got {rate}")
        if self.worker_kill and not self.marker_dir:
            raise TrainingSettingsError(
                "worker_kill faults need marker_dir (a directory all workers see)"
            )

    @property
    def total_rate(self) -> float:
        return sum(float(getattr(self, kind)) for kind in FAULT_KINDS)

    def fault_for(self, episode_id: str, attempt: int) -> FaultKind | None:
        digest = hashlib.sha256(f"{self.seed}/{episode_id}/{attempt}".encode()).digest()
        draw = int.from_bytes(digest[:8], "big") / 2**64
        edge = 0.0
        for kind in FAULT_KINDS:
            edge += getattr(self, kind)
            if draw < edge:
                return kind
        return None


_KILLED_COMMAND_S = 30
"""How long the command a `sandbox_kill` fault kills would run (it never gets that far)."""


class FaultySandbox(Sandbox):
    """A real sandbox with one fault injected into its `fault_at_command`-th command."""

    def __init__(
        self,
        inner: Sandbox,
        fault: FaultKind,
        *,
        fault_at_command: int = 1,
        on_worker_kill: Path | None = None,
    ) -> None:
        super().__init__(inner.snapshot, inner.snapshot_digest, inner.limits)
        self.inner = inner
        self.fault = fault
        self.backend_name = inner.backend_name
        self._commands = 0
        self._fault_at = fault_at_command
        self._marker = on_worker_kill

    def execute(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        self._check_open("execute")
        self._commands += 1
        if self._commands != self._fault_at:
            return self.inner.execute(command, timeout_s=timeout_s, stdin=stdin, env=env)
        if self.fault == "worker_kill":
            if self._marker is not None:
                self._marker.parent.mkdir(parents=True, exist_ok=True)
                self._marker.touch()
            os.kill(os.getpid(), signal.SIGKILL)  # the whole worker process, as a lost machine
        if self.fault == "sandbox_kill":
            stop = threading.Event()
            killer = threading.Thread(target=self._kill_inner_when_running, args=(stop,))
            killer.start()
            crashed = "every process of the sandbox was SIGKILLed mid-command"
            try:
                self.inner.execute(f"sleep {_KILLED_COMMAND_S}", timeout_s=10)
            except SandboxError as error:
                raise SandboxCrashedError(crashed) from error
            finally:
                stop.set()
                killer.join()  # the kill must be over before the pool closes the sandbox
            raise SandboxCrashedError(crashed)
        if self.fault == "hang":
            result = self.inner.execute("sleep 3600", timeout_s=min(timeout_s or 1.0, 1.0))
            raise SandboxCrashedError(
                f"the sandbox hung: no answer within its limit (timed_out={result.timed_out})"
            )
        # oom: a hog runs into the sandbox's memory limit and the kernel kills it
        hog = f"python -c 'b = bytearray({(self.limits.memory_mb + 64) << 20})'"
        result = self.inner.execute(hog, timeout_s=30)
        raise SandboxCrashedError(
            f"the sandbox was OOM-killed by its memory limit (oom_killed={result.oom_killed})"
        )

    def _kill_inner_when_running(self, stop: threading.Event) -> None:
        """Kill every process of the sandbox once its command runs, or never if it ends first.

        The kill waits for the command itself (a `sleep` in the sandbox's cgroup) rather than
        for a fixed delay: on a loaded host a delay lands anywhere, before the command joined
        the cgroup (killing nothing, so the command runs to its timeout) or while the backend
        starts or tears it down (racing the backend's own kill of the group)."""
        cgroup = getattr(self.inner, "_cgroup", None)
        if cgroup is None:
            return
        marker = f"sleep {_KILLED_COMMAND_S}".encode()
        while not stop.is_set():
            for pid in cgroup.pids():
                try:
                    command_line = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ")
                except OSError:
                    continue
                if command_line.strip() == marker:
                    cgroup.kill_all()
                    return
            stop.wait(0.005)

    def read_file(self, path: str) -> bytes:
        return self.inner.read_file(path)

    def write_file(self, path: str, data: str | bytes) -> None:
        self.inner.write_file(path, data)

    def diff(self) -> WorkspaceDiff:
        return self.inner.diff()

    def reset(self) -> None:
        self.inner.reset()

    def _close(self) -> None:
        pass  # the inner sandbox belongs to the pool


class ReplayPolicy(Policy):
    """Replays recorded decisions, then hands over to the live policy."""

    def __init__(self, prefix: Sequence[Decision], live: Policy) -> None:
        self.prefix = tuple(prefix)
        self.live = live
        self._position = 0

    @property
    def version(self) -> str:
        return self.live.version

    def seed(self, seed: int) -> None:
        self._position = 0
        self.live.seed(seed)

    def act(self, history: History) -> Decision:
        if self._position < len(self.prefix):
            self._position += 1
            return self.prefix[self._position - 1]
        return self.live.act(history)


def replayable_prefix(trajectory: Trajectory) -> list[Decision]:
    """The decisions whose every action completed before the infra failure, one per turn.

    A chat reply whose tool calls were not all carried out is left out: its unanswered calls
    would make the next prompt malformed, so the live policy decides that turn again."""
    turns: dict[int, list[Step]] = {}
    for step in trajectory.steps:
        turns.setdefault(step.turn_index, []).append(step)
    prefix = []
    for steps in turns.values():
        first = steps[0]
        if first.reply_message is not None:
            calls = json.loads(first.reply_message).get("tool_calls") or [None]
            if len(steps) < len(calls):
                break
        call_ids = tuple(s.call_id for s in steps if s.call_id is not None)
        prefix.append(
            Decision(
                tuple(s.action for s in steps),
                first.logprob,
                first.record,
                call_ids if len(call_ids) == len(steps) else (),
            )
        )
    return prefix


def run_episode_with_recovery(
    task: Task,
    policy: Policy,
    pool: SandboxPool,
    *,
    key: EpisodeKey,
    config: EpisodeConfig,
    recovery: RecoveryPolicy = RecoveryPolicy(),
    faults: FaultPlan | None = None,
) -> Trajectory:
    """Run an episode; on an infra failure, rebuild the sandbox and replay (or restart)."""
    prefix: list[Decision] = []
    trajectory: Trajectory | None = None
    for attempt in range(recovery.max_attempts):
        attempt_key = dataclasses.replace(key, attempt=attempt)
        fault = faults.fault_for(attempt_key.episode_id(task.id), attempt) if faults else None
        acting: Policy = ReplayPolicy(prefix, policy) if prefix else policy
        sandbox = pool.take(task.snapshot_dir, limits=task.limits, image=task_image(task))
        broken = True
        try:
            target: Sandbox = sandbox
            if fault is not None:
                marker = None
                if faults is not None and faults.marker_dir and fault == "worker_kill":
                    marker = Path(faults.marker_dir) / attempt_key.episode_id(task.id)
                    if marker.exists():
                        fault = None  # this attempt's worker already died once
                if fault is not None:
                    target = FaultySandbox(sandbox, fault, on_worker_kill=marker)
            trajectory = run_episode(task, acting, target, key=attempt_key, config=config)
            broken = trajectory.status is EpisodeStatus.INFRA_ERROR
        finally:
            pool.give_back(sandbox, broken=broken)
        if trajectory.status is not EpisodeStatus.INFRA_ERROR:
            return trajectory
        if recovery.mode == "replay":
            prefix = replayable_prefix(trajectory)  # replayed steps are recorded again
    assert trajectory is not None
    return trajectory
