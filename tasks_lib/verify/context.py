"""The run context every verifier kind works through (`VerifyRun`) and the verdict it returns
(`VerifyResult`): the guarded candidate, a fresh sandbox over the pristine snapshot, the flags, the
time budget, and the rule that only a scored status carries a reward."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Literal

from rollyard.status import TRAINABLE_STATUSES, EpisodeStatus
from sandboxes import ExecResult, Sandbox
from tasks_lib.errors import VerifierSetupError
from tasks_lib.format.environment import open_task_sandbox
from tasks_lib.format.model import VERIFIER_DIR, Task
from tasks_lib.verify.candidate import CandidateChanges
from tasks_lib.verify.guard import Flag, GuardedChanges, GuardPolicy, guard_changes, policy_for_kind
from tasks_lib.verify.junit import Outcome

Status = EpisodeStatus
"""A verdict's status: the episode statuses (`rollyard.status`); a verifier never returns
`policy_error`."""
SCORED_STATUSES: frozenset[EpisodeStatus] = TRAINABLE_STATUSES
"""Statuses whose reward is a judgement of the candidate; the others carry no reward at all."""
Limit = Literal["wall_time", "memory"]
"""Which budget a candidate's run used up: both end as the `timeout` status with reward 0 (the
candidate's doing), told apart by `VerifyResult.limit`."""

LIMIT_NAMES: dict[Limit, str] = {"wall_time": "wall-clock", "memory": "memory"}
"""How a detail line names each limit (`the test run hit the memory limit`)."""

COMMAND_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
"""Environment of every command the verifier runs for a candidate."""


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyResult:
    """The verdict on one candidate. `reward` is None unless `status` is scored (`ok`,
    `timeout`): an infra or verifier failure is never a reward of 0."""

    task_id: str
    task_version: str
    status: Status
    reward: float | None
    partial_credit: float | None
    """Fraction of expected tests that passed (kept even when a tamper flag zeroes the reward)."""
    tests: Mapping[str, Outcome]
    """Expected test id -> outcome (`passed`, `failed`, `error`, `skipped`, `missing`)."""
    flags: tuple[Flag, ...]
    detail: str
    """One line on what happened; the error for a non-ok status."""
    duration_s: float
    snapshot_digest: str = ""
    limit: Limit | None = None
    """For a `timeout`: the limit the candidate's run hit (`wall_time` or `memory`)."""
    metrics: Mapping[str, float] = dataclasses.field(default_factory=dict)
    """Named rewards a Harbor verifier wrote (`reward.json`, or `reward` from reward.txt);
    `reward` is the primary one (see `verify/harbor.py`)."""

    @property
    def scored(self) -> bool:
        return self.status in SCORED_STATUSES

    @property
    def tampered(self) -> bool:
        return any(flag.severity == "tamper" for flag in self.flags)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id,
            "task_version": self.task_version,
            "reward": self.reward,
            "partial_credit": self.partial_credit,
            "status": str(self.status),
            "limit": self.limit,
            "tests": dict(self.tests),
            "flags": [flag.to_json() for flag in self.flags],
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
            "snapshot_digest": self.snapshot_digest,
            "metrics": dict(self.metrics),
        }


def limit_of(executed: ExecResult) -> Limit | None:
    """The limit a command ran into, or None."""
    if executed.timed_out:
        return "wall_time"
    if executed.oom_killed:
        return "memory"
    return None


def output_tail(executed: ExecResult) -> str:
    """The last line a command printed (stderr first), for a one-line detail."""
    text = (executed.stderr.strip() or executed.stdout.strip()).splitlines()
    return text[-1][:300] if text else "(no output)"


def install_tree(sandbox: Sandbox, source: Path, dest_prefix: str) -> None:
    """Write every file under the host directory `source` into the sandbox at `dest_prefix`."""
    for dirpath, _dirnames, filenames in os.walk(source):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(source).as_posix()
            sandbox.write_file(f"{dest_prefix}{rel}", full.read_bytes())


class VerifyRun:
    """One verification in progress: the task, what survived the guard, the flags so far, the
    time budget, and the directory (named per run) the verifier owns inside the workspace.
    Every verifier kind works through it; curation's reordered runs use it too."""

    def __init__(
        self,
        task: Task,
        guarded: GuardedChanges,
        policy: GuardPolicy,
        *,
        timeout_s: float,
        backend: str,
        started: float,
    ) -> None:
        self.task = task
        self.guarded = guarded
        self.policy = policy
        self.timeout_s = timeout_s
        self.backend = backend
        self.started = started
        self.flags: list[Flag] = list(guarded.flags)
        self.digest = ""
        self.report_dir = f"{VERIFIER_DIR}/{secrets.token_hex(12)}"
        """Workspace-relative directory of this run's ini, report and scripts."""

    @classmethod
    def start(
        cls,
        task: Task,
        candidate: CandidateChanges | None = None,
        *,
        policy: GuardPolicy | None = None,
        timeout_s: float | None = None,
        backend: str = "bwrap",
    ) -> VerifyRun:
        """Guard `candidate` (None = untouched) under the policy for the task's verifier kind."""
        started = time.monotonic()
        policy = policy_for_kind(policy or GuardPolicy(), task.verifier_kind)
        guarded = guard_changes(
            candidate if candidate is not None else CandidateChanges.empty(),
            task.snapshot_dir,
            task_protected=task.protected,
            policy=policy,
        )
        return cls(
            task,
            guarded,
            policy,
            timeout_s=timeout_s or task.verify_timeout_s,
            backend=backend,
            started=started,
        )

    @contextlib.contextmanager
    def sandbox(self) -> Iterator[Sandbox]:
        """A fresh sandbox over the pristine snapshot with the guarded changes applied."""
        task = self.task
        with open_task_sandbox(task, self.backend, verifier=True) as sandbox:
            self.digest = sandbox.snapshot_digest
            for path, data in self.guarded.files.items():
                sandbox.write_file(path, data)
            if self.guarded.deleted:
                result = sandbox.execute(["rm", "-f", "--", *self.guarded.deleted], timeout_s=30)
                if not result.ok:
                    raise VerifierSetupError(
                        f"could not apply deletions: {result.stderr.strip()[:200]}"
                    )
            yield sandbox

    def remaining_s(self) -> float:
        return self.timeout_s - (time.monotonic() - self.started)

    def flag(self, rule: str, path: str, detail: str) -> None:
        flag = self.policy.flag(rule, path, detail)
        if flag is not None:
            self.flags.append(flag)

    @property
    def tampered(self) -> bool:
        return any(flag.severity == "tamper" for flag in self.flags)

    def result(
        self,
        status: Status,
        reward: float | None,
        tests: Mapping[str, Outcome],
        detail: str,
        partial_credit: float | None = None,
        *,
        limit: Limit | None = None,
        metrics: Mapping[str, float] | None = None,
    ) -> VerifyResult:
        """The verdict; a tamper flag zeroes a reward when the policy says so."""
        if reward is not None and self.policy.zero_on_tamper and self.tampered:
            reward = 0.0
        return VerifyResult(
            task_id=self.task.id,
            task_version=self.task.version,
            status=status,
            reward=reward,
            partial_credit=partial_credit,
            tests=dict(tests),
            flags=tuple(self.flags),
            detail=detail,
            duration_s=time.monotonic() - self.started,
            snapshot_digest=self.digest,
            limit=limit,
            metrics=dict(metrics or {}),
        )

    def limit_result(
        self, limit: Limit, executed: ExecResult, expected: tuple[str, ...]
    ) -> VerifyResult:
        """Reward 0 for a test run that used up a budget: every expected test is missing."""
        tests: dict[str, Outcome] = {test_id: "missing" for test_id in expected}
        return self.result(
            EpisodeStatus.TIMEOUT,
            0.0,
            tests,
            f"the test run hit the {LIMIT_NAMES[limit]} limit after {executed.duration_s:.1f}s",
            0.0,
            limit=limit,
        )


def finish_checks(
    run: VerifyRun,
    tests: dict[str, Outcome],
    problems: list[str],
    limit: Limit | None,
    hidden: set[str],
) -> VerifyResult:
    """The verdict of a run of named checks (artifact outputs, rules): reward 1 when every one
    passes; a check run that used up a budget is a `timeout` with reward 0."""
    passed = sum(outcome == "passed" for outcome in tests.values())
    partial = passed / len(tests) if tests else 0.0
    visible = [t for t in tests if t not in hidden]
    if (
        hidden and visible
        and all(tests[t] == "passed" for t in visible)
        and any(tests[t] != "passed" for t in hidden)
    ):  # fmt: skip
        failing = sum(tests[t] != "passed" for t in hidden)
        run.flag("visible_pass_hidden_fail", "-",
                 f"all {len(visible)} visible checks pass, {failing}/{len(hidden)} hidden fail")  # fmt: skip
    summary = f"{passed}/{len(tests)} checks passed"
    if problems:
        summary += ": " + "; ".join(problems[:4])
    if limit is not None:
        return run.result(EpisodeStatus.TIMEOUT, 0.0, tests, summary, partial, limit=limit)
    reward = 1.0 if tests and passed == len(tests) else 0.0
    return run.result(EpisodeStatus.OK, reward, tests, summary, partial)
