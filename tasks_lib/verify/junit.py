"""Per-test outcomes and failure messages from a pytest JUnit XML report (xunit1 family, which
names each test's file), keyed by pytest's own node ids.

Parsed on the host; the report comes from untrusted code's process, so it is size-capped and every
id it yields is only ever compared against the task's expected ids.
"""

from __future__ import annotations

import dataclasses
import re
import xml.etree.ElementTree as ElementTree
from collections.abc import Mapping
from typing import Literal

from tasks_lib.errors import ReportError

Outcome = Literal["passed", "failed", "error", "skipped", "missing"]

MAX_REPORT_BYTES = 32 * 1024 * 1024
MESSAGE_CHARS = 300
# When pytest reports one test twice (a failing call and a failing teardown), the worse wins.
_RANK: dict[str, int] = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}

NODEID_PROPERTY = "rollyard_nodeid"
NODEID_PLUGIN = f"""\
# JUnit's name and classname are a lossy rewrite of the node id (a test inherited from a base class
# in another module gets that module's file): each test case carries the id itself.
def pytest_collection_modifyitems(items):
    for item in items:
        item.user_properties.append(({NODEID_PROPERTY!r}, item.nodeid))
"""
"""A pytest plugin module that records each test's node id as a JUnit property, so report ids
are the ids plain pytest prints (`--collect-only -q`), whatever characters a parametrization puts
in them. The hardened run loads it inline; a task's Harbor test.sh loads it with `-p`."""


@dataclasses.dataclass(frozen=True, slots=True)
class JUnitReport:
    """What one report says about each test."""

    outcomes: Mapping[str, Outcome]
    """Test id (`tests/test_x.py::test_y`, `...::Class::test_y`) -> outcome."""
    messages: Mapping[str, str]
    """Test id -> first line of its failure or error message (failing tests only), with memory
    addresses masked so two runs of the same failure read the same."""


def _test_id(case: ElementTree.Element) -> str | None:
    node_ids = {
        prop.get("value") or ""
        for prop in case.iterfind("properties/property")
        if prop.get("name") == NODEID_PROPERTY
    }
    if len(node_ids) > 1:
        # Code under test added a second id to its own case: it names no test (which can only
        # make an expected test missing, never passed).
        return None
    if node_ids:
        return node_ids.pop() or None
    # A report written without the plugin: rebuild the id from JUnit's name and classname.
    name = case.get("name")
    if not name:
        return None
    file = case.get("file")
    classname = case.get("classname", "")
    if not file:
        # xunit2 has no file attribute: rebuild it from the dotted module path.
        parts = classname.split(".")
        class_parts = [part for part in parts if part[:1].isupper()]
        module_parts = parts[: len(parts) - len(class_parts)]
        file = "/".join(module_parts) + ".py"
        return "::".join([file, *class_parts, name])
    module = file[:-3].replace("/", ".") if file.endswith(".py") else file
    inner = classname[len(module) + 1 :] if classname.startswith(module + ".") else ""
    return "::".join([file, *([part for part in inner.split(".") if part]), name])


def _normalize(message: str) -> str:
    first = message.strip().splitlines()[0] if message.strip() else ""
    # Addresses and ids differ from run to run; they must not make two runs look different.
    first = re.sub(r"0x[0-9a-fA-F]+", "0x?", first)
    return first[:MESSAGE_CHARS]


def parse_junit(data: bytes) -> JUnitReport:
    """The outcome (and failure message) of every test in a report; `ReportError` when `data` is
    not a JUnit document or is over the size cap."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report is {len(data)} bytes, over the {MAX_REPORT_BYTES} byte cap")
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as error:
        raise ReportError(f"report is not XML: {error}") from error
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(f"report root is <{root.tag}>, not <testsuites>")
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
    return JUnitReport(outcomes, messages)
