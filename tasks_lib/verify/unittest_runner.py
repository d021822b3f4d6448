"""The hardened run of a unittest-based suite (`python -m unittest`, Django's `tests/runtests.py`)
inside a sandbox, with per-test outcomes keyed by the ids SWE-bench writes: `test_name
(module.Class)`.

Outcomes are not read from the runner's log, which the code under test can print into: a `-c`
program records them from `unittest.TestResult`'s own hooks, runs the runner in the same process
(the expected tests as its labels) and writes them to a file under a directory drawn per run.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import shlex
from collections.abc import Mapping, Sequence
from typing import cast

from sandboxes import WORKSPACE_MOUNT, ExecResult, Sandbox, SandboxError
from tasks_lib.format.model import VERIFIER_DIR
from tasks_lib.verify.context import limit_of
from tasks_lib.verify.junit import MAX_REPORT_BYTES, MESSAGE_CHARS, JUnitReport, Outcome

UNITTEST_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
REPORT_NAME = "unittest.json"

# Worse outcomes win when a test is reported twice (a failing subtest, then its test). Run with
# `-P`: the workspace joins sys.path only after the stdlib modules the recorder uses are imported.
_RECORDER = r"""
import os, runpy, sys, unittest
from json import dump as _dump
_outcomes, _messages = {}, {}
_rank = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}
def _id(test):
    test = getattr(test, "test_case", test)
    name = getattr(test, "_testMethodName", None)
    if name is None:
        return str(test)
    owner = type(test)
    return "%s (%s.%s)" % (name, owner.__module__, owner.__qualname__)
def _note(test, outcome, err=None):
    key = _id(test)
    if _rank[outcome] >= _rank.get(_outcomes.get(key), -1):
        _outcomes[key] = outcome
        if err is not None:
            _messages[key] = ("%s: %s" % (err[0].__name__, err[1])).splitlines()[0][:300]
_base = unittest.TestResult
for _name, _outcome in (("addSuccess", "passed"), ("addFailure", "failed"),
                        ("addError", "error"), ("addSkip", "skipped"),
                        ("addExpectedFailure", "passed"), ("addUnexpectedSuccess", "failed")):
    def _hook(original, outcome):
        def method(self, test, *args):
            err = args[0] if args and isinstance(args[0], tuple) else None
            _note(test, outcome, err)
            return original(self, test, *args)
        return method
    setattr(_base, _name, _hook(getattr(_base, _name), _outcome))
_add_subtest = _base.addSubTest
def _subtest(self, test, subtest, err):
    if err is not None:
        _note(test, "failed" if issubclass(err[0], test.failureException) else "error", err)
    return _add_subtest(self, test, subtest, err)
_base.addSubTest = _subtest
_code = 1
try:
    if _MODULE:
        sys.path.insert(0, _WORKSPACE)
        sys.argv = [_MODULE, *_ARGS]
        runpy.run_module(_MODULE, run_name="__main__", alter_sys=True)
    else:
        sys.path.insert(0, os.path.dirname(os.path.abspath(_SCRIPT)))
        sys.argv = [_SCRIPT, *_ARGS]
        runpy.run_path(_SCRIPT, run_name="__main__")
    _code = 0
except SystemExit as stop:
    _code = 0 if stop.code in (0, None, False) else 1
finally:
    with open(_REPORT, "w") as handle:
        _dump({"outcomes": _outcomes, "messages": _messages}, handle)
sys.exit(_code)
"""


def labels(test_ids: Sequence[str]) -> list[str]:
    """`test_name (module.Class)` -> `module.Class.test_name`: what unittest and Django load."""
    found = []
    for test_id in test_ids:
        name, _, owner = test_id.partition(" (")
        found.append(f"{owner.rstrip(')')}.{name}")
    return found


def _program(command: str, test_ids: Sequence[str], report: str) -> str:
    argv = shlex.split(command)
    if argv[:1] in (["python"], ["python3"]):
        argv = argv[1:]
    module, script = "", ""
    if argv[:1] == ["-m"]:
        module, rest = argv[1], argv[2:]
    else:
        script, rest = f"{WORKSPACE_MOUNT}/{argv[0].removeprefix('./')}", argv[1:]
    if module == "unittest" and not any(arg in ("-v", "--verbose") for arg in rest):
        rest = [*rest, "-v"]
    constants = {"_MODULE": module, "_SCRIPT": script, "_WORKSPACE": WORKSPACE_MOUNT,
                 "_ARGS": [*rest, *labels(test_ids)], "_REPORT": report}  # fmt: skip
    return "".join(f"{name} = {value!r}\n" for name, value in constants.items()) + _RECORDER


def _parse(raw: bytes) -> JUnitReport:
    if len(raw) > MAX_REPORT_BYTES:
        raise ValueError(f"the report is larger than {MAX_REPORT_BYTES} bytes")
    document = json.loads(raw)
    outcomes_raw, messages_raw = document["outcomes"], document["messages"]
    if not isinstance(outcomes_raw, dict) or not isinstance(messages_raw, dict):
        raise ValueError("outcomes and messages must be objects")
    allowed = ("passed", "failed", "error", "skipped")
    outcomes: dict[str, Outcome] = {}
    for test_id, outcome in outcomes_raw.items():
        if outcome not in allowed:
            raise ValueError(f"unknown outcome {str(outcome)[:40]!r}")
        outcomes[str(test_id)] = cast(Outcome, outcome)
    messages: Mapping[str, str] = {
        str(k): str(v)[:MESSAGE_CHARS] for k, v in messages_raw.items() if k in outcomes
    }
    return JUnitReport(outcomes, messages)


@dataclasses.dataclass(frozen=True, slots=True)
class UnittestRun:
    """One run: the process's result (exit 0 all passed, 1 some did not) and the outcomes it
    recorded, as a pytest run reports them (`verify.pytest.PytestRun` wraps it)."""

    executed: ExecResult
    report: JUnitReport | None
    """None when the run hit a limit, wrote no report, or wrote one that does not parse."""
    unreadable: str = ""


def run_unittest(
    sandbox: Sandbox,
    command: str,
    test_ids: Sequence[str],
    *,
    timeout_s: float,
    report_dir: str | None = None,
) -> UnittestRun:
    """Run the unittest runner `command` over `test_ids` in `sandbox`."""
    report_dir = report_dir or f"{VERIFIER_DIR}/{secrets.token_hex(12)}"
    sandbox.write_file(f"{report_dir}/.keep", "")
    program = _program(command, test_ids, f"{WORKSPACE_MOUNT}/{report_dir}/{REPORT_NAME}")
    executed = sandbox.execute(
        ["python", "-B", "-s", "-P", "-c", program], timeout_s=timeout_s, env=UNITTEST_ENV
    )
    if limit_of(executed) is not None:
        return UnittestRun(executed, None)
    try:
        report = sandbox.read_file_ends(f"{report_dir}/{REPORT_NAME}", max_bytes=MAX_REPORT_BYTES)
    except (SandboxError, OSError):
        return UnittestRun(executed, None)
    if report.truncated:  # the code under test can write it: one over the cap is never read whole
        return UnittestRun(executed, None, f"the report is larger than {MAX_REPORT_BYTES} bytes")
    try:
        return UnittestRun(executed, _parse(report.head))
    except (ValueError, KeyError, TypeError) as error:
        return UnittestRun(executed, None, str(error)[:200])
