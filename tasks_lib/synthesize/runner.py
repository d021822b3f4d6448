"""Run a project's suite in a sandbox exactly as the verifier will (same runner, options and
environment), and read every test's outcome and failure message from the JUnit report."""

from __future__ import annotations

import dataclasses
import re
import secrets
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping

from sandboxes import WORKSPACE_MOUNT, Sandbox, SandboxError
from tasks_lib.junit import _RANK, MAX_REPORT_BYTES, Outcome, _test_id
from tasks_lib.model import VERIFIER_DIR
from tasks_lib.verify import _INI, _RUNNER, VERIFY_ENV

MESSAGE_CHARS = 300


@dataclasses.dataclass(frozen=True, slots=True)
class SuiteRun:
    """Outcome of one run of the suite."""

    outcomes: Mapping[str, Outcome]
    messages: Mapping[str, str]
    """Test id -> first line of its failure or error message (failing tests only)."""
    duration_s: float
    timed_out: bool = False
    broken: str = ""
    """Why the run produced no usable report (empty when it did)."""


def _normalize(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    # Addresses and ids differ from run to run; they must not make two runs look different.
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    return first[:MESSAGE_CHARS]


def parse_report(data: bytes) -> tuple[dict[str, Outcome], dict[str, str]]:
    if len(data) > MAX_REPORT_BYTES:
        raise ValueError(f"report is {len(data)} bytes, over the cap")
    root = ElementTree.fromstring(data)
    outcomes: dict[str, Outcome] = {}
    messages: dict[str, str] = {}
    for case in root.iter("testcase"):
        test_id = _test_id(case)
        if test_id is None:
            continue
        outcome: Outcome = "passed"
        message = ""
        for child in case:
            if child.tag == "failure" and _RANK[outcome] < _RANK["failed"]:
                outcome = "failed"
                message = child.get("message") or (child.text or "")
            elif child.tag == "error":
                outcome = "error"
                message = child.get("message") or (child.text or "")
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        previous = outcomes.get(test_id)
        if previous is None or _RANK[outcome] > _RANK[previous]:
            outcomes[test_id] = outcome
            if message:
                messages[test_id] = _normalize(message)
    return outcomes, messages


def run_suite(sandbox: Sandbox, test_paths: tuple[str, ...], *, timeout_s: float) -> SuiteRun:
    """Run pytest over `test_paths` in `sandbox` with the verifier's hardened options."""
    report_dir = f"{VERIFIER_DIR}/{secrets.token_hex(8)}"
    sandbox.write_file(f"{report_dir}/pytest.ini", _INI)
    report = f"{WORKSPACE_MOUNT}/{report_dir}/junit.xml"
    args = [
        *test_paths,
        "-c", f"{WORKSPACE_MOUNT}/{report_dir}/pytest.ini",
        "--rootdir", WORKSPACE_MOUNT, "--confcutdir", WORKSPACE_MOUNT,
        "-p", "no:cacheprovider", "-p", "no:stepwise",
        "--continue-on-collection-errors", "--junitxml", report, "-q", "--no-header", "-rN",
    ]  # fmt: skip
    program = _RUNNER.format(workspace=WORKSPACE_MOUNT, args=args)
    executed = sandbox.execute(
        ["python", "-B", "-s", "-P", "-c", program], timeout_s=timeout_s, env=VERIFY_ENV
    )
    if executed.timed_out or executed.oom_killed:
        why = "timed out" if executed.timed_out else "ran out of memory"
        return SuiteRun({}, {}, executed.duration_s, timed_out=executed.timed_out, broken=why)
    try:
        outcomes, messages = parse_report(sandbox.read_file(f"{report_dir}/junit.xml"))
    except (SandboxError, OSError, ValueError, ElementTree.ParseError) as error:
        tail = (executed.stderr or executed.stdout).strip()[-300:]
        return SuiteRun({}, {}, executed.duration_s, broken=f"no report ({error}): {tail}")
    return SuiteRun(outcomes, messages, executed.duration_s)
