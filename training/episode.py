"""The episode runner: a policy acts step by step in a sandbox, then the verifier scores the result.

`run_episode` resets the sandbox to the task snapshot, asks the policy for decisions until it
submits or a budget ends the episode (max steps, per-step and per-episode wall clock, a language
model's format-error budget and context window), carries out every action of each decision in
order (a chat model's parallel tool calls), records every step, and hands the workspace to the
verifier — which never trusts the agent's sandbox: it
rebuilds the candidate from the sandbox's diff in a fresh one. Every way an episode can end has
a status (`rollyard.status.EpisodeStatus`); nothing raises out of it but programming errors,
so one broken episode cannot take down a batch of hundreds on a Dask worker.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from rollyard.status import INFRASTRUCTURE_STATUSES, TRAINABLE_STATUSES, EpisodeStatus
from sandboxes import ExecResult, Sandbox, SandboxError, WorkspacePathError
from tasks_lib.format.model import Task
from training.actions import (
    TRIAL_KEPT,
    TRIAL_REVERTED,
    Action,
    EditFile,
    History,
    InvalidCall,
    Observation,
    ReadFile,
    RunCommand,
    Submit,
    TryEdit,
    action_arguments,
    action_problem,
    cap_text,
    clean_text,
    failing_test_count,
)
from training.errors import ContextExhaustedError, PolicyUnavailableError
from training.policy import ChatRecord, Policy
from training.trajectory import EpisodeKey, Step, Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class EpisodeConfig:
    """Budgets of one episode."""

    max_steps: int = 12
    """Actions before the episode is truncated (a submit ends it earlier, terminated)."""
    step_timeout_s: float = 30.0
    """Wall-clock limit of one command (also bounded by what is left of the episode budget)."""
    episode_timeout_s: float | None = None
    """Wall-clock budget of the acting part of the episode; None uses the task's
    `agent_timeout_s`. Verification has its own budget (the task's `verify_timeout_s`)."""
    observation_max_bytes: int = 6000
    """UTF-8 bytes of observation text kept per step, head and tail with a marker between them
    saying how much was cut (`training.actions.cap_text`); for the policy and the store."""
    max_format_errors: int = 2
    """Replies without a usable tool call a language model may send (each answered with an
    observation saying how to call a tool); the next one ends the episode with the trainable
    `format_error` status, the workspace still verified. Never taken as a silent submit."""
    seed: int = 0
    """Base seed; each episode's sampling seed mixes it with the episode id."""


class VerdictFlag(Protocol):
    """A reward-hack or guard finding of the verifier: which rule, on which path."""

    @property
    def rule(self) -> str: ...
    @property
    def path(self) -> str: ...


class Verdict(Protocol):
    """What the runner reads from a verifier's result; `tasks_lib`'s `VerifyResult` is one.

    `status` is `ok` (or another status the verifier scored, such as `timeout`) with a `reward`,
    or an infrastructure status of `rollyard.status` (`infra_error`, `verifier_error`,
    `task_error`) with no reward."""

    @property
    def status(self) -> str: ...
    @property
    def reward(self) -> float | None: ...
    @property
    def partial_credit(self) -> float | None: ...
    @property
    def tests(self) -> Mapping[str, str]:
        """Expected test id -> outcome (`passed`, `failed`, ...)."""
        ...

    @property
    def flags(self) -> Sequence[VerdictFlag]: ...
    @property
    def metrics(self) -> Mapping[str, float]:
        """Named rewards the verifier wrote (a Harbor task's `reward.json`); empty if none."""
        ...

    @property
    def detail(self) -> str:
        """One line on what happened; the error for a status without a reward."""
        ...


Verifier = Callable[[Task, Sandbox], Verdict]
"""Scores the agent's sandbox after the episode: `(task, agent_sandbox) -> verdict`."""


def verify_agent_sandbox(task: Task, sandbox: Sandbox) -> Verdict:
    """The default verifier: the agent's changes, replayed in a fresh sandbox by `tasks_lib`."""
    from tasks_lib.verify import verify_sandbox

    return verify_sandbox(task, sandbox)


@dataclasses.dataclass(frozen=True, slots=True)
class _Scored:
    """What a verdict adds to the trajectory."""

    status: EpisodeStatus
    error: str | None
    reward: float | None = None
    partial_credit: float | None = None
    passed: bool | None = None
    fixed_fraction: float | None = None
    flags: tuple[str, ...] = ()
    rewards: Mapping[str, float] | None = None


def _read_verdict(
    task: Task, verdict: Verdict, status: EpisodeStatus, error: str | None
) -> _Scored:
    """The trajectory's fields from a verdict on an episode that ended with `status` (`ok` or
    `timeout`): an infrastructure status carries no reward, and a scored status without a reward
    is the verifier's failure, never a reward of 0."""
    if verdict.status in INFRASTRUCTURE_STATUSES:
        detail = verdict.detail or "no detail"
        return _Scored(EpisodeStatus(verdict.status), f"verifier status {verdict.status}: {detail}")
    if verdict.reward is None:
        return _Scored(
            EpisodeStatus.VERIFIER_ERROR,
            f"the verifier scored status {verdict.status!r} without a reward: {verdict.detail}",
        )
    reward = float(verdict.reward)
    fixed_fraction = None
    if task.fail_to_pass:
        fixed = sum(1 for test in task.fail_to_pass if verdict.tests.get(test) == "passed")
        fixed_fraction = fixed / len(task.fail_to_pass)
    return _Scored(
        status,
        error,
        reward=reward,
        partial_credit=verdict.partial_credit,
        passed=reward >= 1.0,
        fixed_fraction=fixed_fraction,
        flags=tuple(f"{flag.rule}:{flag.path}" for flag in verdict.flags),
        rewards=dict(verdict.metrics) or None,
    )


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"[:2000]


def _command_observation(result: ExecResult, max_bytes: int) -> Observation:
    parts = []
    if result.stdout:
        parts.append(result.stdout)
    if result.stderr:
        parts.append(result.stderr)
    if result.timed_out:
        parts.append(f"[command timed out after {result.duration_s:.1f}s and was killed]")
    if result.oom_killed:
        parts.append("[a process of the command was killed: out of memory]")
    parts.append(f"[exit code {result.exit_code}]")
    text, cut = cap_text("\n".join(parts), max_bytes)
    return Observation(text, result.exit_code, cut or result.output_truncated)


def refuse_unusable(action: Action) -> Action:
    """`action`, or an `InvalidCall` saying why it cannot be carried out (`action_problem`): a
    NUL byte or a lone surrogate from a model is its mistake to read about, never a crash."""
    problem = action_problem(action)
    if problem is None:
        return action
    arguments = clean_text(json.dumps(action_arguments(action), ensure_ascii=False))
    return InvalidCall(action.tool, arguments, f"tool call not carried out: {problem}")


def apply_action(
    sandbox: Sandbox, action: Action, *, timeout_s: float, max_bytes: int
) -> tuple[Observation, bool]:
    """Carry out one action in the sandbox; returns the observation and whether it timed out.

    Mistakes of the agent (a missing file, an edit whose text is not there) are observations it
    can learn from; `SandboxError`s other than a bad path propagate: they are infra failures."""
    problem = action_problem(action)
    if problem is not None:  # a caller that skipped `refuse_unusable` (a Gymnasium agent)
        return Observation(f"tool call not carried out: {problem}", None), False
    match action:
        case RunCommand(command=command):
            result = sandbox.execute(command, timeout_s=timeout_s)
            return _command_observation(result, max_bytes), result.timed_out
        case ReadFile(path=path):
            try:
                # Only the head and tail the observation keeps are read: memory bounded by
                # max_bytes, not by the size of what the agent wrote.
                ends = sandbox.read_file_ends(path, max_bytes=max_bytes)
            except (OSError, WorkspacePathError) as error:
                return Observation(f"cannot read {path!r}: {error}", 1), False
            text, cut = cap_text(ends.text(), max_bytes)
            return Observation(text, 0, cut or ends.truncated), False
        case EditFile(path=path, old_text=old_text, new_text=new_text):
            observation, _ = _edit(sandbox, path, old_text, new_text)
            return observation, False
        case TryEdit():
            return _try_edit(sandbox, action, timeout_s=timeout_s, max_bytes=max_bytes)
        case Submit():
            return Observation("submitted", 0), False
        case InvalidCall(error=error):
            text, cut = cap_text(error, max_bytes)
            return Observation(text, None, cut), False


def _edit(
    sandbox: Sandbox, path: str, old_text: str, new_text: str
) -> tuple[Observation, bytes | None]:
    """Replace the one occurrence of `old_text`; returns the observation and, when the edit was
    applied, the file's bytes before it (what a revert writes back)."""
    try:
        before = sandbox.read_file(path)
    except (OSError, WorkspacePathError) as error:
        return Observation(f"cannot edit {path!r}: {error}", 1), None
    content = before.decode("utf-8", errors="replace")
    if not old_text:
        return Observation("old_text is empty; give the exact text to replace", 1), None
    count = content.count(old_text)
    if count != 1:
        reason = "does not occur" if count == 0 else f"occurs {count} times"
        hint = "read the file again" if count == 0 else "include more surrounding lines"
        return Observation(f"edit not applied: old_text {reason} in {path}; {hint}", 1), None
    try:
        sandbox.write_file(path, content.replace(old_text, new_text, 1))
    except WorkspacePathError as error:
        return Observation(f"cannot edit {path!r}: {error}", 1), None
    return Observation(f"edited {path}", 0), before


def _try_edit(
    sandbox: Sandbox, action: TryEdit, *, timeout_s: float, max_bytes: int
) -> tuple[Observation, bool]:
    """Edit, run the tests, keep the edit only if fewer tests fail (`TryEdit`)."""
    edited, before = _edit(sandbox, action.path, action.old_text, action.new_text)
    if before is None:
        return edited, False
    result = sandbox.execute(action.test_command, timeout_s=timeout_s)
    failing = None if result.timed_out else failing_test_count(result.stdout, result.exit_code)
    kept = failing is not None and failing < action.failing_before
    if kept:
        verdict = f"{TRIAL_KEPT}: {action.failing_before} -> {failing} failing tests]"
    else:
        sandbox.write_file(action.path, before)
        shown = "?" if failing is None else str(failing)
        verdict = (
            f"{TRIAL_REVERTED}: {shown} failing tests, not fewer than {action.failing_before}]"
        )
    run = _command_observation(result, max_bytes - len(verdict.encode()) - 1)
    timed_out = result.timed_out
    return Observation(f"{run.text}\n{verdict}", result.exit_code, run.truncated), timed_out


@dataclasses.dataclass(slots=True)
class _Acting:
    """What the acting part of an episode came to, filled in as it goes."""

    status: EpisodeStatus = EpisodeStatus.OK
    error: str | None = None
    terminated: bool = False
    truncated: bool = False
    policy_s: float = 0.0
    sandbox_s: float = 0.0

    def end(
        self,
        status: EpisodeStatus,
        error: str | None = None,
        *,
        terminated: bool = False,
        truncated: bool = False,
    ) -> _Acting:
        self.status, self.error = status, error
        self.terminated, self.truncated = terminated, truncated
        return self


def _act(
    task: Task,
    policy: Policy,
    sandbox: Sandbox,
    config: EpisodeConfig,
    steps: list[Step],
    *,
    budget_s: float,
    start: float,
) -> _Acting:
    """The acting part of an episode: decisions until a submit or a budget ends it, each of a
    decision's actions carried out in order and appended to `steps`."""
    history = History(task.instruction)
    acting = _Acting()
    format_errors = 0
    turn = 0
    while len(steps) < config.max_steps:
        if budget_s - (time.monotonic() - start) <= 0:
            message = f"episode budget of {budget_s:.0f}s ran out after {len(steps)} steps"
            return acting.end(EpisodeStatus.TIMEOUT, message, truncated=True)
        choose_start = time.monotonic()
        try:
            decision = policy.act(history)
        except ContextExhaustedError as failure:
            acting.policy_s += time.monotonic() - choose_start
            return acting.end(EpisodeStatus.CONTEXT_EXHAUSTED, str(failure), truncated=True)
        except PolicyUnavailableError as failure:  # its server, not the policy: run it again
            acting.policy_s += time.monotonic() - choose_start
            return acting.end(EpisodeStatus.INFRA_ERROR, _describe(failure))
        except Exception as failure:  # any policy failure, including its model's bugs
            acting.policy_s += time.monotonic() - choose_start
            return acting.end(EpisodeStatus.POLICY_ERROR, _describe(failure))
        chose_s = time.monotonic() - choose_start
        acting.policy_s += chose_s
        reply = decision.record.raw_message if isinstance(decision.record, ChatRecord) else None
        for position, action in enumerate(decision.actions):
            if len(steps) >= config.max_steps:
                break  # the reply's calls past the step budget are not carried out
            first = position == 0
            action = refuse_unusable(action)
            remaining_s = budget_s - (time.monotonic() - start)
            act_start = time.monotonic()
            try:
                observation, timed_out = apply_action(
                    sandbox,
                    action,
                    timeout_s=max(0.1, min(config.step_timeout_s, remaining_s)),
                    max_bytes=config.observation_max_bytes,
                )
            except SandboxError as failure:
                acting.sandbox_s += time.monotonic() - act_start
                return acting.end(EpisodeStatus.INFRA_ERROR, _describe(failure))
            acted_s = time.monotonic() - act_start
            acting.sandbox_s += acted_s
            call_id = decision.call_ids[position] if decision.call_ids else None
            steps.append(
                Step(
                    index=len(steps),
                    action=action,
                    observation=observation,
                    duration_s=acted_s,
                    policy_s=chose_s if first else 0.0,
                    timed_out=timed_out,
                    logprob=decision.logprob if first else None,
                    record=decision.record if first else None,
                    turn=turn,
                    call_id=call_id,
                    reply_message=reply if first else None,
                )
            )
            history = history.append(
                action, observation, call_id=call_id, reply_message=reply if first else None
            )
            if isinstance(action, Submit):
                return acting.end(EpisodeStatus.OK, terminated=True)
        turn += 1
        if all(isinstance(action, InvalidCall) for action in decision.actions):
            format_errors += 1
            if format_errors > config.max_format_errors:
                message = (
                    f"{format_errors} replies without a usable tool call; the budget is "
                    f"{config.max_format_errors} (EpisodeConfig.max_format_errors)"
                )
                return acting.end(EpisodeStatus.FORMAT_ERROR, message, truncated=True)
    return acting.end(EpisodeStatus.OK, truncated=True)


def run_episode(
    task: Task,
    policy: Policy,
    sandbox: Sandbox,
    *,
    key: EpisodeKey,
    config: EpisodeConfig | None = None,
    verifier: Verifier | None = None,
) -> Trajectory:
    """Run one episode of `policy` on `task` in `sandbox` (open, over the task's snapshot).

    The sandbox is reset first and left as the episode left it (the caller owns it: a pool
    resets and reuses it). Never raises for sandbox, policy or verifier failures: they come back
    as the trajectory's status with the error message."""
    config = config or EpisodeConfig()
    verifier = verifier or verify_agent_sandbox
    episode_id = key.episode_id(task.id)
    seed = key.seed(config.seed, task.id)
    budget_s = config.episode_timeout_s or task.agent_timeout_s
    started_at_s = time.time()
    start = time.monotonic()
    steps: list[Step] = []
    status = EpisodeStatus.OK
    error: str | None = None
    terminated = truncated = False
    sandbox_s = policy_s = verify_s = 0.0
    reward: float | None = None
    partial_credit: float | None = None
    passed: bool | None = None
    fixed_fraction: float | None = None
    flags: tuple[str, ...] = ()
    rewards: Mapping[str, float] | None = None
    identity = policy.identity()
    snapshot_digest = ""

    try:
        snapshot_digest = sandbox.snapshot_digest
        sandbox.reset()
    except SandboxError as failure:
        status, error = EpisodeStatus.INFRA_ERROR, f"reset failed: {_describe(failure)}"

    if status is EpisodeStatus.OK:
        policy.seed(seed)
        acting = _act(task, policy, sandbox, config, steps, budget_s=budget_s, start=start)
        status, error = acting.status, acting.error
        terminated, truncated = acting.terminated, acting.truncated
        policy_s, sandbox_s = acting.policy_s, acting.sandbox_s

    if status in TRAINABLE_STATUSES:
        verify_start = time.monotonic()
        try:
            verdict = verifier(task, sandbox)
            scored = _read_verdict(task, verdict, status, error)
        except Exception as failure:  # a verifier crash is a status, never a reward of 0
            scored = _Scored(EpisodeStatus.VERIFIER_ERROR, _describe(failure))
        status, error = scored.status, scored.error
        reward, partial_credit, passed = scored.reward, scored.partial_credit, scored.passed
        fixed_fraction, flags, rewards = scored.fixed_fraction, scored.flags, scored.rewards
        verify_s = time.monotonic() - verify_start

    return Trajectory(
        episode_id=episode_id,
        group_id=key.group_id(task.id),
        key=key,
        task_id=task.id,
        task_version=task.version,
        instruction=task.instruction,
        snapshot_digest=snapshot_digest,
        sandbox_backend=getattr(sandbox, "backend_name", "unknown"),
        policy_version=identity.version,
        status=status,
        steps=tuple(steps),
        terminated=terminated,
        truncated=truncated,
        reward=reward,
        partial_credit=partial_credit,
        passed=passed,
        fixed_fraction=fixed_fraction,
        flags=flags,
        rewards=rewards,
        error=error,
        seed=seed,
        wall_s=time.monotonic() - start,
        sandbox_s=sandbox_s,
        policy_s=policy_s,
        verify_s=verify_s,
        started_at_s=started_at_s,
        policy=identity,
        task_family=task.family,
    )
