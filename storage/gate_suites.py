"""The iteration gate's GX suites as persisted in the store's GX project: the expectations rollyard
keeps there, written from the gate settings, with a user's edits and additions kept.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from storage.gx_project import ITERATION_SUITE_PREFIX

SuiteName = Literal["batch", "episodes", "drift", "groups"]
"""The iteration gate's GX suites (`iteration.<name>` in the store's GX project): row counts;
per-episode columns (when there are rows); reward drift (when there is a reference); GRPO
groups (when a group has two scored samples)."""
ROLLYARD_META = "rollyard_check"
"""Meta key naming a rollyard expectation in a suite; `rollyard_default` holds the arguments
rollyard last wrote, so an expectation a user edited with GX's API is told apart and kept."""


@dataclasses.dataclass(frozen=True, slots=True)
class Check:
    """One expectation with the name and threshold text it is reported under."""

    name: str
    expected: str
    suite: SuiteName
    expectation: Any


def synced_suite(context: Any, suite_name: str, checks: Sequence[Check]) -> Any:
    """The persisted suite `iteration.<suite_name>`, with rollyard's expectations written from
    the settings, except those a user edited with GX's API (kept as edited); expectations a
    user added are kept and run too."""
    import great_expectations as gx
    from great_expectations.exceptions.exceptions import DataContextError

    name = f"{ITERATION_SUITE_PREFIX}{suite_name}"
    try:
        suite = context.suites.get(name)
    except DataContextError:
        suite = context.suites.add(gx.ExpectationSuite(name=name))
    stored = {
        (e.meta or {}).get(ROLLYARD_META): e
        for e in suite.expectations
        if (e.meta or {}).get(ROLLYARD_META)
    }
    changed = False
    for check in checks:
        wanted = _arguments(check.expectation)
        existing = stored.get(check.name)
        if existing is not None:
            current = _arguments(existing)
            if current == wanted or current != existing.meta.get("rollyard_default"):
                continue  # up to date, or edited by a user: theirs wins
            suite.delete_expectation(existing)
        expectation = check.expectation  # made fresh by `storage.gates` for this evaluation
        expectation.meta = {ROLLYARD_META: check.name, "rollyard_default": wanted}
        suite.add_expectation(expectation)
        changed = True
    if changed:
        suite.save()
    return suite


def _arguments(expectation: Any) -> dict[str, Any]:
    """An expectation's arguments as JSON values (comparable after a round trip to disk)."""
    kwargs = expectation.configuration.kwargs
    return dict(json.loads(json.dumps({k: v for k, v in kwargs.items() if k != "batch_id"})))


def described(
    config: Any, checks: Mapping[str, Check], parameters: Mapping[str, float]
) -> tuple[str, str]:
    """The name a result is reported under and what it expected: rollyard's name and text for
    its own unedited expectations, else the expectation type and its arguments (a result holds
    its arguments with the suite parameters filled in)."""
    meta = config.meta or {}
    name = meta.get(ROLLYARD_META)
    arguments = {k: v for k, v in config.kwargs.items() if k != "batch_id"}
    default = {
        key: parameters.get(value["$PARAMETER"], value)
        if isinstance(value, dict) and "$PARAMETER" in value
        else value
        for key, value in (meta.get("rollyard_default") or {}).items()
    }
    if name in checks and arguments == default:
        return str(name), checks[str(name)].expected
    shown = ", ".join(f"{k}={v}" for k, v in arguments.items())
    if name:
        return str(name), f"{config.type}({shown}) (edited in the suite)"
    column = arguments.get("column")
    return f"{config.type}" + (f"[{column}]" if column else ""), f"{config.type}({shown})"
