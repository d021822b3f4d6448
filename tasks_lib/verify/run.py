"""The verifier's front door: `verify` guards a candidate, opens a run context and hands it to the
verifier of the task's kind; every kind starts from the pristine snapshot in a fresh sandbox it
alone controls, and a sandbox or task failure becomes a status, never a reward of 0.

    tests     verify/pytest.py    hardened pytest, per-test outcomes from JUnit
    harbor    verify/harbor.py    a plain Harbor task's tests/test.sh and its reward.txt
    artifact  verify/artifact.py  outputs compared with references, per data variant
    rules     verify/rules.py     declarative checks over the final state
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rollyard.status import EpisodeStatus
from sandboxes import Sandbox, SandboxError
from tasks_lib.errors import CandidateBoundsError
from tasks_lib.format.model import Task, VerifierKind
from tasks_lib.verify.artifact import verify_artifacts
from tasks_lib.verify.candidate import CandidateChanges
from tasks_lib.verify.context import VerifyResult, VerifyRun
from tasks_lib.verify.guard import RULES, Flag, GuardPolicy
from tasks_lib.verify.harbor import verify_harbor_script
from tasks_lib.verify.pytest import verify_tests
from tasks_lib.verify.rules import verify_rules

VERIFIERS: dict[VerifierKind, Callable[[VerifyRun], VerifyResult]] = {
    "tests": verify_tests,
    "harbor": verify_harbor_script,
    "artifact": verify_artifacts,
    "rules": verify_rules,
}
"""The verifier of each kind (`Task.verifier_kind`)."""


def verify(
    task: Task,
    candidate: CandidateChanges | None = None,
    *,
    policy: GuardPolicy | None = None,
    timeout_s: float | None = None,
    backend: str = "bwrap",
) -> VerifyResult:
    """Score `candidate` (changes to `task`'s workspace; None = untouched) in a fresh sandbox."""
    run = VerifyRun.start(task, candidate, policy=policy, timeout_s=timeout_s, backend=backend)
    try:
        return VERIFIERS[task.verifier_kind](run)
    except SandboxError as error:
        return run.result(
            EpisodeStatus.INFRA_ERROR,
            None,
            {},
            f"sandbox failed: {type(error).__name__}: {error}",
        )
    except OSError as error:
        return run.result(EpisodeStatus.TASK_ERROR, None, {}, f"cannot read task files: {error}")


def verify_sandbox(
    task: Task, sandbox: Sandbox, *, policy: GuardPolicy | None = None, backend: str = "bwrap"
) -> VerifyResult:
    """Score what an agent left in `sandbox`. A candidate beyond the verifier's bounds (too
    many bytes or files, a hostile path) is not run: it scores 0 with an `oversized_candidate`
    flag, an attempt that failed, not a verifier that broke."""
    started = time.monotonic()
    try:
        candidate = CandidateChanges.from_sandbox(sandbox)
    except CandidateBoundsError as error:
        return rejected_candidate(task, str(error), duration_s=time.monotonic() - started)
    return verify(task, candidate, policy=policy, backend=backend)


def rejected_candidate(task: Task, reason: str, *, duration_s: float = 0.0) -> VerifyResult:
    """The verdict on a candidate refused before it ran: reward 0, every expected test missing."""
    return VerifyResult(
        task_id=task.id,
        task_version=task.version,
        status=EpisodeStatus.OK,
        reward=0.0,
        partial_credit=0.0,
        tests=dict.fromkeys(task.expected_tests, "missing"),
        flags=(Flag("oversized_candidate", RULES["oversized_candidate"][0], "", reason),),
        detail=reason,
        duration_s=duration_s,
    )
