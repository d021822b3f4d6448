"""What a task's `[rollyard.artifact]` and `[rollyard.rules]` tables declare, and their validation.

    [rollyard]
    verifier = "artifact"            # "tests" (default) | "artifact" | "rules"

    [rollyard.artifact]
    command = "python analysis.py"   # run in a fresh sandbox once per variant (optional)
    timeout_s = 60
    variants_dir = "tests/variants"  # NAME/overlay/ (written over the workspace), NAME/expected/
    variants = ["visible", "hidden-1"]

    [[rollyard.artifact.outputs]]
    path = "answer.csv"              # workspace path the command writes
    format = "csv"                   # csv | parquet | json | text
    compare = "table"                # table | number | set | json | exact
    key = ["region"]                 # table rows matched by these columns (order-insensitive)
    abs_tol = 0.01
    rel_tol = 1e-6

    [rollyard.rules]
    overlay_dir = "tests/overlay"    # hidden files written over the workspace before the checks

    [[rollyard.rules.checks]]
    name = "service_answers"
    kind = "service"                 # file_exists | file_contains | parses | command | service
    start = "sh run.sh"
    port = 8123
    http_get = "/health"
    expect_status = 200
    expect_contains = "ok"

References and checks live in the task directory, never in the workspace: the agent cannot see or
change them.
"""

from __future__ import annotations

import dataclasses
import math
import re
from pathlib import Path
from typing import Any

from tasks_lib.format.issues import IssueSink, relative_inside

ARTIFACT_FORMATS = ("csv", "parquet", "json", "text")
COMPARE_MODES = ("table", "number", "set", "json", "exact")
COMPARE_FORMATS = {
    "table": ("csv", "parquet", "json"),
    "number": ("json", "text", "csv"),
    "set": ("json", "text", "csv", "parquet"),
    "json": ("json",),
    "exact": ("text", "json", "csv"),
}
RULE_KINDS = ("file_exists", "file_contains", "parses", "command", "service")
PARSE_FORMATS = ("json", "toml", "csv")
DEFAULT_VARIANTS_DIR = "tests/variants"
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

ARTIFACT_FIELDS = ("command", "timeout_s", "variants_dir", "variants", "outputs")
OUTPUT_FIELDS = (
    "path", "format", "compare", "abs_tol", "rel_tol", "ordered", "key", "columns", "field",
)  # fmt: skip
RULES_FIELDS = ("overlay_dir", "checks")
CHECK_FIELDS = {
    "name": "check name (letters, digits, . _ -)",
    "kind": "one of " + ", ".join(RULE_KINDS),
    "hidden": "true when the instruction does not reveal what the check expects",
    "timeout_s": "seconds the check may take",
    "path": "workspace path of the file checked",
    "text": "text the file must contain",
    "pattern": "regular expression the file must match",
    "format": "json | toml | csv",
    "run": "shell command run in the workspace",
    "exit_code": "exit code the command must return (default 0)",
    "stdout_contains": "text the command's output must contain",
    "start": "shell command that starts the service (run in the background)",
    "port": "TCP port on 127.0.0.1 inside the sandbox",
    "http_get": "path of an HTTP GET request, e.g. /health",
    "send": "raw text sent over the socket (instead of http_get)",
    "expect_status": "HTTP status the answer must have",
    "expect_contains": "text the answer must contain",
}
CHECK_NEEDS = {
    "file_exists": ("path",),
    "file_contains": ("path",),
    "parses": ("path", "format"),
    "command": ("run",),
    "service": ("start", "port"),
}


@dataclasses.dataclass(frozen=True, slots=True)
class OutputSpec:
    """One artifact the candidate must produce and how it is compared with its reference."""

    path: str
    format: str
    compare: str
    abs_tol: float = 0.0
    rel_tol: float = 0.0
    ordered: bool = False
    """Rows (table) or items (json lists) must come in the reference's order."""
    key: tuple[str, ...] = ()
    """Table columns that identify a row; unordered tables are matched on them."""
    columns: tuple[str, ...] = ()
    """Table columns compared (default: every column of the reference)."""
    field: str | None = None
    """Dotted key of a JSON document whose value is compared (number, set)."""


@dataclasses.dataclass(frozen=True, slots=True)
class VariantSpec:
    """One data variant: files written over the workspace, and the references they produce."""

    name: str
    overlay_dir: Path | None
    expected_dir: Path

    @property
    def hidden(self) -> bool:
        """A variant with its own data: the agent never sees it."""
        return self.overlay_dir is not None


@dataclasses.dataclass(frozen=True, slots=True)
class ArtifactSpec:
    command: str | None
    timeout_s: float
    outputs: tuple[OutputSpec, ...]
    variants: tuple[VariantSpec, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class RuleCheck:
    """One declarative check over the final state of the workspace."""

    name: str
    kind: str
    hidden: bool = False
    timeout_s: float = 30.0
    path: str | None = None
    text: str | None = None
    pattern: str | None = None
    format: str | None = None
    run: str | None = None
    exit_code: int = 0
    stdout_contains: str | None = None
    start: str | None = None
    port: int | None = None
    http_get: str | None = None
    send: str | None = None
    expect_status: int | None = None
    expect_contains: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RulesSpec:
    checks: tuple[RuleCheck, ...]
    overlay_dir: Path | None


class _Table:
    """Reads typed fields of one TOML table, reporting each problem under its dotted name."""

    def __init__(self, sink: IssueSink, table: dict[str, Any], where: str) -> None:
        self.sink, self.table, self.where = sink, table, where

    def bad(self, key: str, message: str, fix: str) -> None:
        self.sink.add("task.toml", f"{self.where}.{key}", self.table.get(key), message, fix)

    def unknown(self, known: tuple[str, ...] | dict[str, str]) -> None:
        for key in self.table:
            if key not in known:
                self.bad(key, "is not a known field", f"remove it or use one of {', '.join(known)}")

    def text(
        self, key: str, *, required: bool = False, choices: tuple[str, ...] = ()
    ) -> str | None:
        if key not in self.table:
            if required:
                self.sink.add("task.toml", f"{self.where}.{key}", _Missing(), "is required",
                              f"add {key} = \"...\"" + (f" (one of {', '.join(choices)})" if choices else ""))  # fmt: skip
            return None
        value = self.table[key]
        if not isinstance(value, str) or not value.strip():
            self.bad(key, "must be a non-empty string", f'write {key} = "..."')
            return None
        if choices and value not in choices:
            self.bad(key, "is not a known value", f"use one of {', '.join(choices)}")
            return None
        return value

    def path(self, key: str, *, required: bool = False) -> str | None:
        value = self.text(key, required=required)
        if value is not None and not relative_inside(value):
            self.bad(
                key, "must be a relative path that stays inside", "use a relative path without '..'"
            )
            return None
        return value

    def number(self, key: str, default: float, *, positive: bool = False) -> float:
        if key not in self.table:
            return default
        value = self.table[key]
        if (
            isinstance(value, bool)
            or not isinstance(value, int | float)
            or not math.isfinite(value)
        ):
            self.bad(key, "must be a number", "write a finite number")
            return default
        if value < 0 or (positive and value == 0):
            self.bad(
                key,
                "must be positive" if positive else "must not be negative",
                "write a larger number",
            )
            return default
        return float(value)

    def integer(self, key: str, *, low: int, high: int) -> int | None:
        if key not in self.table:
            return None
        value = self.table[key]
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            self.bad(key, f"must be an integer from {low} to {high}", f"write e.g. {key} = {low}")
            return None
        return value

    def flag(self, key: str) -> bool:
        value = self.table.get(key, False)
        if not isinstance(value, bool):
            self.bad(key, "must be true or false", f"write {key} = true")
            return False
        return value

    def strings(self, key: str) -> tuple[str, ...]:
        value = self.table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
            self.bad(key, "must be a list of non-empty strings", f'write {key} = ["a", "b"]')
            return ()
        if len(set(value)) != len(value):
            self.bad(key, "lists a value twice", "remove duplicates")
        return tuple(value)


class _Missing:
    def __repr__(self) -> str:
        return "-"


def _subtable(
    sink: IssueSink, rollyard: dict[str, Any], key: str, example: str
) -> dict[str, Any] | None:
    value = rollyard.get(key)
    if value is None:
        sink.add("task.toml", f"rollyard.{key}", _Missing(), "is required by this verifier",
                 f"add a [rollyard.{key}] table, e.g. {example}")  # fmt: skip
        return None
    if not isinstance(value, dict):
        sink.add(
            "task.toml", f"rollyard.{key}", value, "must be a table", f"write [rollyard.{key}]"
        )
        return None
    return value


def parse_artifact(sink: IssueSink, root: Path, rollyard: dict[str, Any]) -> ArtifactSpec | None:
    raw = _subtable(sink, rollyard, "artifact", '[[rollyard.artifact.outputs]] path = "answer.csv"')
    if raw is None:
        return None
    table = _Table(sink, raw, "rollyard.artifact")
    table.unknown(ARTIFACT_FIELDS)
    command = table.text("command")
    timeout_s = table.number("timeout_s", 60.0, positive=True)
    variants_dir = table.path("variants_dir") or DEFAULT_VARIANTS_DIR
    names = table.strings("variants") if "variants" in raw else ("visible",)
    variants: list[VariantSpec] = []
    for index, name in enumerate(names):
        where = f"rollyard.artifact.variants[{index}]"
        if not NAME_PATTERN.match(name):
            sink.add(
                "task.toml",
                where,
                name,
                "is not a valid variant name",
                "use letters, digits, . _ -",
            )
            continue
        base = root / variants_dir / name
        expected = base / "expected"
        overlay = base / "overlay"
        if not expected.is_dir():
            sink.add("task.toml", where, name, f"{variants_dir}/{name}/expected/ does not exist",
                     f"create it with the reference artifacts of variant {name!r}")  # fmt: skip
        if overlay.exists() and not overlay.is_dir():
            sink.add(
                f"{variants_dir}/{name}/overlay",
                "-",
                "-",
                "is not a directory",
                "make it a directory",
            )
        variants.append(VariantSpec(name, overlay if overlay.is_dir() else None, expected))
    if not names:
        table.bad("variants", "lists no variant", 'list at least one, e.g. variants = ["visible"]')
    if any(v.hidden for v in variants) and command is None:
        table.bad("command", "is missing but variants have overlays",
                  "add the command that produces the outputs, so each variant's data is used")  # fmt: skip
    outputs: list[OutputSpec] = []
    raw_outputs = raw.get("outputs", [])
    if (
        not isinstance(raw_outputs, list)
        or not raw_outputs
        or not all(isinstance(o, dict) for o in raw_outputs)
    ):
        table.bad("outputs", "must list at least one output table",
                  'add [[rollyard.artifact.outputs]] with path, format and compare')  # fmt: skip
        raw_outputs = []
    for index, item in enumerate(raw_outputs):
        output = _output(sink, item, f"rollyard.artifact.outputs[{index}]")
        if output is None:
            continue
        outputs.append(output)
        for variant in variants:
            if variant.expected_dir.is_dir() and not (variant.expected_dir / output.path).is_file():
                sink.add("task.toml", f"rollyard.artifact.outputs[{index}].path", output.path,
                         f"has no reference for variant {variant.name!r}",
                         f"write {variants_dir}/{variant.name}/expected/{output.path}")  # fmt: skip
    if len({o.path for o in outputs}) != len(outputs):
        table.bad("outputs", "names one path twice", "list each output once")
    return ArtifactSpec(command, timeout_s, tuple(outputs), tuple(variants))


def _output(sink: IssueSink, raw: dict[str, Any], where: str) -> OutputSpec | None:
    table = _Table(sink, raw, where)
    table.unknown(OUTPUT_FIELDS)
    path = table.path("path", required=True)
    fmt = table.text("format", required=True, choices=ARTIFACT_FORMATS)
    compare = table.text("compare", required=True, choices=COMPARE_MODES)
    if fmt and compare and fmt not in COMPARE_FORMATS[compare]:
        table.bad("format", f"cannot be compared as {compare!r}",
                  f"use one of {', '.join(COMPARE_FORMATS[compare])} for compare = {compare!r}")  # fmt: skip
        return None
    output = OutputSpec(
        path=path or "", format=fmt or "", compare=compare or "",
        abs_tol=table.number("abs_tol", 0.0), rel_tol=table.number("rel_tol", 0.0),
        ordered=table.flag("ordered"), key=table.strings("key"), columns=table.strings("columns"),
        field=table.text("field"),
    )  # fmt: skip
    if output.key and output.columns and not set(output.key) <= set(output.columns):
        table.bad("key", "names columns missing from columns", "add the key columns to columns")
    if path is None or fmt is None or compare is None:
        return None
    return output


def parse_rules(sink: IssueSink, root: Path, rollyard: dict[str, Any]) -> RulesSpec | None:
    raw = _subtable(
        sink, rollyard, "rules", '[[rollyard.rules.checks]] name = "x" kind = "command"'
    )
    if raw is None:
        return None
    table = _Table(sink, raw, "rollyard.rules")
    table.unknown(RULES_FIELDS)
    overlay_rel = table.path("overlay_dir")
    overlay = None
    if overlay_rel is not None:
        if (root / overlay_rel).is_dir():
            overlay = root / overlay_rel
        else:
            table.bad(
                "overlay_dir", "is not a directory of the task", "create it or remove the field"
            )
    raw_checks = raw.get("checks", [])
    if (
        not isinstance(raw_checks, list)
        or not raw_checks
        or not all(isinstance(c, dict) for c in raw_checks)
    ):
        table.bad("checks", "must list at least one check table",
                  'add [[rollyard.rules.checks]] with name and kind')  # fmt: skip
        raw_checks = []
    checks: list[RuleCheck] = []
    for index, item in enumerate(raw_checks):
        check = _check(sink, item, f"rollyard.rules.checks[{index}]")
        if check is not None:
            checks.append(check)
    names = [c.name for c in checks]
    if len(set(names)) != len(names):
        table.bad("checks", "names a check twice", "give every check its own name")
    return RulesSpec(tuple(checks), overlay)


def _check(sink: IssueSink, raw: dict[str, Any], where: str) -> RuleCheck | None:
    table = _Table(sink, raw, where)
    table.unknown(CHECK_FIELDS)
    name = table.text("name", required=True)
    if name is not None and not NAME_PATTERN.match(name):
        table.bad("name", "is not a valid check name", "use letters, digits, . _ -")
        name = None
    kind = table.text("kind", required=True, choices=RULE_KINDS)
    values: dict[str, Any] = {
        "hidden": table.flag("hidden"),
        "timeout_s": table.number("timeout_s", 30.0, positive=True),
        "path": table.path("path"),
        "format": table.text("format", choices=PARSE_FORMATS),
        "exit_code": table.integer("exit_code", low=0, high=255) or 0,
        "port": table.integer("port", low=1, high=65535),
        "expect_status": table.integer("expect_status", low=100, high=599),
    }
    for key in (
        "text",
        "pattern",
        "run",
        "stdout_contains",
        "start",
        "http_get",
        "send",
        "expect_contains",
    ):
        values[key] = table.text(key)
    if values["pattern"] is not None:
        try:
            re.compile(values["pattern"])
        except re.error as error:
            table.bad("pattern", f"is not a regular expression ({error})", "fix the pattern")
    if kind is None or name is None:
        return None
    for needed in CHECK_NEEDS[kind]:
        if values[needed] is None and needed not in table.table:
            sink.add("task.toml", f"{where}.{needed}", _Missing(), f"is required by kind {kind!r}",
                     f"add {needed} ({CHECK_FIELDS[needed]})")  # fmt: skip
            return None
    if kind == "file_contains" and values["text"] is None and values["pattern"] is None:
        table.bad(
            "text",
            "kind 'file_contains' needs text or pattern",
            'add text = "..." or pattern = "..."',
        )
        return None
    if kind == "service":
        if (values["http_get"] is None) == (values["send"] is None):
            table.bad("http_get", "a service check needs exactly one of http_get and send",
                      'write http_get = "/health" (HTTP) or send = "PING\\n" (raw socket)')  # fmt: skip
            return None
        if values["http_get"] is not None and not values["http_get"].startswith("/"):
            table.bad("http_get", "must start with '/'", 'write e.g. http_get = "/health"')
            return None
    return RuleCheck(name=name, kind=kind, **values)
