"""Per-test outcomes from a pytest JUnit XML report (xunit1 family, which names each test's file).

Parsed on the host; the report comes from untrusted code's process, so it is size-capped and every
id it yields is only ever compared against the task's expected ids.
"""

from __future__ import annotations

import xml.etree.ElementTree as ElementTree
from typing import Literal

Outcome = Literal["passed", "failed", "error", "skipped", "missing"]

MAX_REPORT_BYTES = 32 * 1024 * 1024
# When pytest reports one test twice (a failing call and a failing teardown), the worse wins.
_RANK: dict[str, int] = {"passed": 0, "skipped": 1, "failed": 2, "error": 3}


class ReportError(ValueError):
    """The report is not a pytest JUnit XML document."""


def _test_id(case: ElementTree.Element) -> str | None:
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


def parse_junit(data: bytes) -> dict[str, Outcome]:
    """Test id (`tests/test_x.py::test_y`, `...::Class::test_y`) -> outcome."""
    if len(data) > MAX_REPORT_BYTES:
        raise ReportError(f"report is {len(data)} bytes, over the {MAX_REPORT_BYTES} byte cap")
    try:
        root = ElementTree.fromstring(data)
    except ElementTree.ParseError as error:
        raise ReportError(f"report is not XML: {error}") from error
    if root.tag not in ("testsuites", "testsuite"):
        raise ReportError(f"report root is <{root.tag}>, not <testsuites>")
    outcomes: dict[str, Outcome] = {}
    for case in root.iter("testcase"):
        test_id = _test_id(case)
        if test_id is None:
            continue
        outcome: Outcome = "passed"
        for child in case:
            if child.tag in ("failure",):
                outcome = "failed" if _RANK[outcome] < _RANK["failed"] else outcome
            elif child.tag == "error":
                outcome = "error"
            elif child.tag == "skipped" and outcome == "passed":
                outcome = "skipped"
        previous = outcomes.get(test_id)
        if previous is None or _RANK[outcome] > _RANK[previous]:
            outcomes[test_id] = outcome
    return outcomes
