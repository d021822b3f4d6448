"""The verifier: scores a candidate against a task in a fresh sandbox it alone controls.

The sandbox starts from the pristine snapshot; the candidate's changes are applied with protected
paths dropped (so test files come back as they were), hidden tests are added, and pytest runs with
plugin autoload off, no cache provider and no bytecode. Per-test outcomes come from a JUnit report
written under a directory whose name is drawn per run; every expected test must appear as passed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import secrets
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from sandboxes import WORKSPACE_MOUNT, ExecResult, Sandbox, SandboxError, open_sandbox
from tasks_lib.candidate import CandidateChanges
from tasks_lib.guard import Flag, GuardedChanges, GuardPolicy, guard_changes
from tasks_lib.junit import Outcome, ReportError, parse_junit
from tasks_lib.model import VERIFIER_DIR, Task

Status = Literal["ok", "timeout", "oom", "infra_error", "verifier_error", "task_error"]
SCORED_STATUSES = ("ok", "timeout", "oom")
"""Statuses whose reward is a judgement of the candidate; the others carry no reward at all."""

# pytest exit codes (pytest.ExitCode): 0 all passed, 1 some failed, 2 interrupted (e.g. collection
# errors), 3 internal error, 4 usage error, 5 no tests collected.
EXIT_OK, EXIT_FAILED, EXIT_INTERRUPTED, EXIT_INTERNAL, EXIT_USAGE, EXIT_NO_TESTS = range(6)

VERIFY_ENV = {
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1",
    "PYTHONDONTWRITEBYTECODE": "1",
    "PYTHONHASHSEED": "0",
}

# pytest starts from a -c program, not from argv, so code under test finds no report path in
# sys.argv; `-P` keeps the current directory off sys.path until pytest itself is imported, so a
# workspace file cannot stand in for pytest.
_RUNNER = (
    "import sys, pytest\nsys.path.insert(0, {workspace!r})\nsys.exit(int(pytest.main({args!r})))\n"
)
_INI = "[pytest]\njunit_family = xunit1\njunit_logging = no\n"


@dataclasses.dataclass(frozen=True, slots=True)
class VerifyResult:
    """The verdict on one candidate. `reward` is None unless `status` is scored (`ok`,
    `timeout`, `oom`): an infra or verifier failure is never a reward of 0."""

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
            "status": self.status,
            "tests": dict(self.tests),
            "flags": [flag.to_json() for flag in self.flags],
            "detail": self.detail,
            "duration_s": round(self.duration_s, 3),
            "snapshot_digest": self.snapshot_digest,
        }


def verify(
    task: Task,
    candidate: CandidateChanges | None = None,
    *,
    policy: GuardPolicy | None = None,
    timeout_s: float | None = None,
    backend: str = "bwrap",
) -> VerifyResult:
    """Score `candidate` (changes to `task`'s workspace; None = untouched) in a fresh sandbox."""
    started = time.monotonic()
    policy = policy or GuardPolicy()
    if task.verifier != "tests":
        from tasks_lib.verifiers.run import kind_policy

        policy = kind_policy(policy)
    candidate = candidate if candidate is not None else CandidateChanges.empty()
    guarded = guard_changes(
        candidate, task.snapshot_dir, task_protected=task.protected, policy=policy
    )
    run = _Run(task, guarded, policy, timeout_s or task.verify_timeout_s, started)
    if task.verifier != "tests":
        from tasks_lib.verifiers.run import verify_declared

        return verify_declared(task, guarded, run, backend)
    try:
        with open_sandbox(task.snapshot_dir, backend=backend, limits=task.limits) as sandbox:
            run.digest = sandbox.snapshot_digest
            _apply(sandbox, guarded)
            if task.has_rollyard_table:
                return run.pytest(sandbox)
            return run.harbor_script(sandbox)
    except SandboxError as error:
        return run.result(
            "infra_error", None, {}, f"sandbox failed: {type(error).__name__}: {error}"
        )
    except OSError as error:
        return run.result("task_error", None, {}, f"cannot read task files: {error}")


def _apply(sandbox: Sandbox, guarded: GuardedChanges) -> None:
    for path, data in guarded.files.items():
        sandbox.write_file(path, data)
    if guarded.deleted:
        result = sandbox.execute(["rm", "-f", "--", *guarded.deleted], timeout_s=30)
        if not result.ok:
            raise _SetupFailure(f"could not apply deletions: {result.stderr.strip()[:200]}")


class _SetupFailure(SandboxError):
    """Preparing the verification workspace failed (an infra failure, not the candidate's)."""


def _install_tree(sandbox: Sandbox, source: Path, dest_prefix: str) -> None:
    for dirpath, _dirnames, filenames in os.walk(source):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(source).as_posix()
            sandbox.write_file(f"{dest_prefix}{rel}", full.read_bytes())


class _Run:
    def __init__(
        self,
        task: Task,
        guarded: GuardedChanges,
        policy: GuardPolicy,
        timeout_s: float,
        started: float,
    ) -> None:
        self.task = task
        self.guarded = guarded
        self.policy = policy
        self.timeout_s = timeout_s
        self.started = started
        self.flags: list[Flag] = list(guarded.flags)
        self.digest = ""
        self.report_dir = f"{VERIFIER_DIR}/{secrets.token_hex(12)}"

    def flag(self, rule: str, path: str, detail: str) -> None:
        flag = self.policy.flag(rule, path, detail)
        if flag is not None:
            self.flags.append(flag)

    def result(
        self,
        status: Status,
        reward: float | None,
        tests: Mapping[str, Outcome],
        detail: str,
        partial_credit: float | None = None,
    ) -> VerifyResult:
        if (
            reward is not None
            and self.policy.zero_on_tamper
            and any(flag.severity == "tamper" for flag in self.flags)
        ):
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
        )

    # -- rollyard tasks: hardened pytest, JUnit outcomes ----------------------------------------

    def pytest(self, sandbox: Sandbox) -> VerifyResult:
        task = self.task
        if task.hidden_dir is not None:
            _install_tree(sandbox, task.hidden_dir, "")
        report = f"{WORKSPACE_MOUNT}/{self.report_dir}/junit.xml"
        ini = f"{self.report_dir}/pytest.ini"
        sandbox.write_file(ini, _INI)
        args = [
            *task.test_paths,
            "-c",
            f"{WORKSPACE_MOUNT}/{ini}",
            "--rootdir",
            WORKSPACE_MOUNT,
            "--confcutdir",
            WORKSPACE_MOUNT,
            "-p",
            "no:cacheprovider",
            "-p",
            "no:stepwise",
            "--continue-on-collection-errors",
            "--junitxml",
            report,
            "-q",
            "--no-header",
            "-rN",
        ]
        program = _RUNNER.format(workspace=WORKSPACE_MOUNT, args=args)
        executed = sandbox.execute(
            ["python", "-B", "-s", "-P", "-c", program], timeout_s=self.timeout_s, env=VERIFY_ENV
        )
        expected = task.expected_tests
        if executed.timed_out:
            return self._limit("timeout", executed, expected)
        if executed.oom_killed:
            return self._limit("oom", executed, expected)
        try:
            raw = sandbox.read_file(f"{self.report_dir}/junit.xml")
        except (SandboxError, OSError):
            raw = None
        if raw is None:
            return self._no_report(executed, expected)
        try:
            outcomes = parse_junit(raw)
        except ReportError as error:
            self.flag(
                "missing_report", f"{self.report_dir}/junit.xml", f"unreadable report: {error}"
            )
            unread: dict[str, Outcome] = {test_id: "missing" for test_id in expected}
            return self.result("ok", 0.0, unread, f"report unreadable: {error}", 0.0)
        if executed.exit_code in (EXIT_INTERNAL, EXIT_USAGE) and not self._tampered():
            return self.result(
                "verifier_error",
                None,
                {},
                f"pytest exit {executed.exit_code}: {_tail(executed)}",
            )
        tests: dict[str, Outcome] = {
            test_id: outcomes.get(test_id, "missing") for test_id in expected
        }
        self._consistency(executed, outcomes, tests)
        passed = sum(outcome == "passed" for outcome in tests.values())
        partial = passed / len(expected) if expected else 0.0
        reward = 1.0 if expected and passed == len(expected) else 0.0
        return self.result(
            "ok",
            reward,
            tests,
            f"{passed}/{len(expected)} expected tests passed (pytest exit {executed.exit_code})",
            partial,
        )

    def _tampered(self) -> bool:
        return any(flag.severity == "tamper" for flag in self.flags)

    def _limit(
        self, status: Status, executed: ExecResult, expected: tuple[str, ...]
    ) -> VerifyResult:
        tests: dict[str, Outcome] = {test_id: "missing" for test_id in expected}
        what = "wall-clock limit" if status == "timeout" else "memory limit"
        return self.result(
            status,
            0.0,
            tests,
            f"the test run hit the {what} after {executed.duration_s:.1f}s",
            0.0,
        )

    def _no_report(self, executed: ExecResult, expected: tuple[str, ...]) -> VerifyResult:
        tests: dict[str, Outcome] = {test_id: "missing" for test_id in expected}
        # pytest writes its report even on collection errors; only a process that died (or was
        # made to exit) before the session ended leaves none.
        if executed.exit_code == EXIT_OK:
            self.flag("report_mismatch", "-", "pytest exited 0 without writing its report")
        else:
            self.flag("missing_report", "-", f"no report; pytest exit {executed.exit_code}")
        return self.result("ok", 0.0, tests, f"no test report: {_tail(executed)}", 0.0)

    def _consistency(
        self, executed: ExecResult, outcomes: Mapping[str, Outcome], tests: Mapping[str, Outcome]
    ) -> None:
        bad = sum(outcome in ("failed", "error") for outcome in outcomes.values())
        if executed.exit_code == EXIT_OK and bad:
            self.flag("report_mismatch", "-", f"pytest exited 0 but the report has {bad} failures")
        elif executed.exit_code == EXIT_FAILED and not bad:
            self.flag("report_mismatch", "-", "pytest reported failures the report does not hold")
        missing = [test_id for test_id, outcome in tests.items() if outcome == "missing"]
        if missing:
            self.flag(
                "missing_tests", missing[0], f"{len(missing)} expected test(s) not in the report"
            )
        visible = (*self.task.fail_to_pass, *self.task.pass_to_pass)
        hidden = self.task.hidden_tests
        if (
            visible
            and hidden
            and all(tests[test_id] == "passed" for test_id in visible)
            and any(tests[test_id] != "passed" for test_id in hidden)
        ):
            failing = sum(tests[test_id] != "passed" for test_id in hidden)
            self.flag(
                "visible_pass_hidden_fail",
                "-",
                f"all {len(visible)} visible tests pass, {failing}/{len(hidden)} hidden fail",
            )

    # -- plain Harbor tasks: run tests/test.sh, read reward.txt ---------------------------------

    def harbor_script(self, sandbox: Sandbox) -> VerifyResult:
        task = self.task
        tests_prefix = f"{self.report_dir}/tests/"
        _install_tree(sandbox, task.tests_dir, tests_prefix)
        logs = f"{WORKSPACE_MOUNT}/{self.report_dir}/logs/verifier"
        sandbox.write_file(f"{self.report_dir}/logs/verifier/.keep", b"")
        script = (task.tests_dir / "test.sh").read_text(encoding="utf-8", errors="replace")
        # The script was written for an image where tests sit at /tests, logs at /logs and the
        # workspace at the Dockerfile's WORKDIR; here all of them live under the workspace.
        script = script.replace("/logs/verifier", logs)
        script = re.sub(
            r"(?<![\w./-])/tests\b", f"{WORKSPACE_MOUNT}/{tests_prefix}".rstrip("/"), script
        )
        workdir = _dockerfile_workdir(task.path / "environment" / "Dockerfile")
        if workdir and workdir not in ("/", WORKSPACE_MOUNT):
            script = re.sub(rf"(?<![\w./-]){re.escape(workdir)}\b", WORKSPACE_MOUNT, script)
        sandbox.write_file(f"{self.report_dir}/run.sh", script)
        executed = sandbox.execute(
            ["bash", f"{self.report_dir}/run.sh"], timeout_s=self.timeout_s, env=VERIFY_ENV
        )
        if executed.timed_out:
            return self._limit("timeout", executed, ())
        if executed.oom_killed:
            return self._limit("oom", executed, ())
        try:
            text = sandbox.read_file(f"{self.report_dir}/logs/verifier/reward.txt").decode().strip()
            reward = float(text)
        except (SandboxError, OSError, UnicodeDecodeError, ValueError) as error:
            return self.result(
                "verifier_error",
                None,
                {},
                f"tests/test.sh wrote no readable reward.txt ({type(error).__name__}); "
                f"exit {executed.exit_code}: {_tail(executed)}",
            )
        if not 0.0 <= reward <= 1.0:
            return self.result(
                "verifier_error", None, {}, f"reward.txt holds {reward}, outside [0, 1]"
            )
        return self.result("ok", reward, {}, f"reward.txt = {text}", reward)


def _dockerfile_workdir(dockerfile: Path) -> str | None:
    try:
        lines = dockerfile.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    workdir = None
    for line in lines:
        match = re.match(r"\s*WORKDIR\s+(\S+)", line, flags=re.IGNORECASE)
        if match:
            workdir = match.group(1).rstrip("/") or "/"
    return workdir


def _tail(executed: ExecResult) -> str:
    text = (executed.stderr.strip() or executed.stdout.strip()).splitlines()
    return text[-1][:300] if text else "(no output)"
