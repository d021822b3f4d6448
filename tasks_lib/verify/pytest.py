"""The one hardened pytest run, and the verifier of `tests` tasks built on it (a task whose suite
is unittest-based runs through `verify/unittest_runner.py` and is scored the same way).

`run_pytest` is how rollyard runs a test suite inside a sandbox, for the verifier, for curation's
reordered runs and for synthesis alike: plugin autoload off, no cache provider, no bytecode, the
ini and the JUnit report under a directory whose name is drawn per run, per-test outcomes (and
failure messages) from the report. `verify_tests` adds the hidden tests, then requires every
expected test to appear as passed and flags a report that disagrees with pytest's exit status.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections.abc import Mapping, Sequence

from rollyard.status import EpisodeStatus
from sandboxes import WORKSPACE_MOUNT, ExecResult, Sandbox, SandboxError
from tasks_lib.errors import ReportError
from tasks_lib.format.model import VERIFIER_DIR
from tasks_lib.verify.context import (
    Limit,
    VerifyResult,
    VerifyRun,
    install_tree,
    limit_of,
    output_tail,
)
from tasks_lib.verify.junit import (
    MAX_REPORT_BYTES,
    NODEID_PLUGIN,
    JUnitReport,
    Outcome,
    parse_junit,
)

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
RUNNER_PROGRAM = (
    "import sys, types, pytest\n"
    "nodeids = types.ModuleType('rollyard_nodeids')\n"
    "exec({plugin!r}, nodeids.__dict__)\n"
    "sys.path.insert(0, {workspace!r})\n"
    "sys.exit(int(pytest.main({args!r}, plugins=[nodeids])))\n"
)
PYTEST_INI = "[pytest]\njunit_family = xunit1\njunit_logging = no\n"


@dataclasses.dataclass(frozen=True, slots=True)
class PytestRun:
    """One hardened pytest run: the process's result and what its report says."""

    executed: ExecResult
    report: JUnitReport | None
    """None when the run hit a limit, wrote no report, or wrote one that does not parse."""
    unreadable: str = ""
    """Why the report pytest wrote does not parse (empty when it parsed or was never written)."""

    @property
    def limit(self) -> Limit | None:
        return limit_of(self.executed)

    @property
    def outcomes(self) -> Mapping[str, Outcome]:
        return self.report.outcomes if self.report is not None else {}

    @property
    def broken(self) -> str:
        """Why the run gave no usable report (empty when it did)."""
        if self.report is not None:
            return ""
        if self.limit is not None:
            return "timed out" if self.limit == "wall_time" else "ran out of memory"
        if self.unreadable:
            return f"unreadable report: {self.unreadable}"
        tail = (self.executed.stderr or self.executed.stdout).strip()[-300:]
        return f"no report (pytest exit {self.executed.exit_code}): {tail}"


def run_pytest(
    sandbox: Sandbox,
    test_args: Sequence[str],
    *,
    timeout_s: float,
    report_dir: str | None = None,
) -> PytestRun:
    """Run pytest over `test_args` (paths or node ids, in the order given) in `sandbox` with the
    hardened options. `report_dir` is the workspace-relative directory for the ini and the
    report (drawn per run when None)."""
    report_dir = report_dir or f"{VERIFIER_DIR}/{secrets.token_hex(12)}"
    ini = f"{report_dir}/pytest.ini"
    sandbox.write_file(ini, PYTEST_INI)
    args = [
        *test_args,
        "-c", f"{WORKSPACE_MOUNT}/{ini}",
        "--rootdir", WORKSPACE_MOUNT,
        "--confcutdir", WORKSPACE_MOUNT,
        "-p", "no:cacheprovider",
        "-p", "no:stepwise",
        "--continue-on-collection-errors",
        "--junitxml", f"{WORKSPACE_MOUNT}/{report_dir}/junit.xml",
        "-q", "--no-header", "-rN",
    ]  # fmt: skip
    program = RUNNER_PROGRAM.format(plugin=NODEID_PLUGIN, workspace=WORKSPACE_MOUNT, args=args)
    executed = sandbox.execute(
        ["python", "-B", "-s", "-P", "-c", program], timeout_s=timeout_s, env=VERIFY_ENV
    )
    if limit_of(executed) is not None:
        return PytestRun(executed, None)
    try:
        report = sandbox.read_file_ends(f"{report_dir}/junit.xml", max_bytes=MAX_REPORT_BYTES)
    except (SandboxError, OSError):
        return PytestRun(executed, None)
    if report.truncated:  # the code under test can write it: one over the cap is never read whole
        cap = f"report is {report.size_bytes} bytes, over the {MAX_REPORT_BYTES} byte cap"
        return PytestRun(executed, None, cap)
    try:
        return PytestRun(executed, parse_junit(report.head))
    except ReportError as error:
        return PytestRun(executed, None, str(error))


def run_task_tests(run: VerifyRun, sandbox: Sandbox, test_args: Sequence[str]) -> PytestRun:
    """The task's hidden tests written into `sandbox` (from `run.sandbox()`), then the hardened
    run over `test_args` within the run's budget, reporting into the run's directory. A task
    whose runner is unittest runs its `test_command` over `test_args` as test ids (its expected
    tests when none are given)."""
    if run.task.hidden_dir is not None:
        install_tree(sandbox, run.task.hidden_dir, "")
    if run.task.test_runner == "unittest":
        from tasks_lib.verify.unittest_runner import run_unittest

        ran = run_unittest(sandbox, run.task.test_command, test_args or run.task.expected_tests,
                           timeout_s=run.timeout_s, report_dir=run.report_dir)  # fmt: skip
        return PytestRun(ran.executed, ran.report, ran.unreadable)
    return run_pytest(sandbox, test_args, timeout_s=run.timeout_s, report_dir=run.report_dir)


def verify_tests(run: VerifyRun) -> VerifyResult:
    """Score the candidate with the task's pytest suite (visible and hidden tests)."""
    with run.sandbox() as sandbox:
        return _score(run, run_task_tests(run, sandbox, run.task.test_paths))


def _score(run: VerifyRun, pytest_run: PytestRun) -> VerifyResult:
    executed = pytest_run.executed
    expected = run.task.expected_tests
    if pytest_run.limit is not None:
        return run.limit_result(pytest_run.limit, executed, expected)
    missing: dict[str, Outcome] = {test_id: "missing" for test_id in expected}
    if pytest_run.unreadable:
        run.flag(
            "missing_report",
            f"{run.report_dir}/junit.xml",
            f"unreadable report: {pytest_run.unreadable}",
        )
        return run.result(
            EpisodeStatus.OK, 0.0, missing, f"report unreadable: {pytest_run.unreadable}", 0.0
        )
    if pytest_run.report is None:
        # pytest writes its report even on collection errors; only a process that died (or was
        # made to exit) before the session ended leaves none.
        if executed.exit_code == EXIT_OK:
            run.flag("report_mismatch", "-", "pytest exited 0 without writing its report")
        else:
            run.flag("missing_report", "-", f"no report; pytest exit {executed.exit_code}")
        return run.result(
            EpisodeStatus.OK, 0.0, missing, f"no test report: {output_tail(executed)}", 0.0
        )
    if executed.exit_code in (EXIT_INTERNAL, EXIT_USAGE) and not run.tampered:
        return run.result(
            EpisodeStatus.VERIFIER_ERROR,
            None,
            {},
            f"pytest exit {executed.exit_code}: {output_tail(executed)}",
        )
    outcomes = pytest_run.report.outcomes
    tests: dict[str, Outcome] = {test_id: outcomes.get(test_id, "missing") for test_id in expected}
    _check_consistency(run, executed, outcomes, tests)
    passed = sum(outcome == "passed" for outcome in tests.values())
    partial = passed / len(expected) if expected else 0.0
    reward = 1.0 if expected and passed == len(expected) else 0.0
    return run.result(
        EpisodeStatus.OK,
        reward,
        tests,
        f"{passed}/{len(expected)} expected tests passed (pytest exit {executed.exit_code})",
        partial,
    )


def _check_consistency(
    run: VerifyRun,
    executed: ExecResult,
    outcomes: Mapping[str, Outcome],
    tests: Mapping[str, Outcome],
) -> None:
    bad = sum(outcome in ("failed", "error") for outcome in outcomes.values())
    if executed.exit_code == EXIT_OK and bad:
        run.flag("report_mismatch", "-", f"pytest exited 0 but the report has {bad} failures")
    elif executed.exit_code == EXIT_FAILED and not bad:
        run.flag("report_mismatch", "-", "pytest reported failures the report does not hold")
    missing = [test_id for test_id, outcome in tests.items() if outcome == "missing"]
    if missing:
        run.flag("missing_tests", missing[0], f"{len(missing)} expected test(s) not in the report")
    visible = (*run.task.fail_to_pass, *run.task.pass_to_pass)
    hidden = run.task.hidden_tests
    if (
        visible
        and hidden
        and all(tests[test_id] == "passed" for test_id in visible)
        and any(tests[test_id] != "passed" for test_id in hidden)
    ):
        failing = sum(tests[test_id] != "passed" for test_id in hidden)
        run.flag(
            "visible_pass_hidden_fail",
            "-",
            f"all {len(visible)} visible tests pass, {failing}/{len(hidden)} hidden fail",
        )
