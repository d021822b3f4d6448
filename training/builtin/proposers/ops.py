"""Candidate actions for troubleshooting tasks: a service or job that fails, and criteria to meet.

The proposer reads the instruction's numbered criteria (a command that must complete, a
supervisor that must serve on `host:port` and answer `GET /path` with a status, a job that must
write a file) and turns them into one *check*: a command that runs each criterion in the
sandbox and reports `N failed, M passed` with the output of what failed. Then it works like an
on-call engineer: run the check, list the files, read what the
output points to (files in tracebacks, files named in the output, configuration, files the files
read refer to), and try edits derived from what it read and what the error says, each as one
trial (`TryEdit`) kept only if fewer criteria fail:

- configuration values: a listen address (drop a port glued to the host, another host), a file
  mode (the usual modes), a number (+-1), a flag (flipped);
- a name the error says does not exist (`KeyError: 'x'`, `no such column: x`), replaced in the
  files that use it by each column the data files and schema declare.

It knows the kinds of slips a deployment suffers, not which one a task has. Features say where
an edit lands relative to the last error, what kind of edit it is crossed with what the error
shows, and how a renamed name relates to the data — never which edit is the fix.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterable, Iterator

from training.actions import (
    TRIAL_KEPT,
    History,
    ReadFile,
    RunCommand,
    Submit,
    TryEdit,
    failing_test_count,
)
from training.builtin.edit_history import edit_between
from training.builtin.features import OPS_EVIDENCE_KINDS, Candidate, feature_vector
from training.builtin.proposers.base import (
    STEP_HORIZON,
    Edits,
    backticked,
    digest,
    follow_edits,
    normalize_path,
)

LIST_FILES_COMMAND = "find . -type f -not -path '*/.*' | sort"
SERVICE_WAIT_S = 8.0
"""How long the check waits for a service to answer."""
COMMAND_TIMEOUT_S = 20.0
CONFIG_SUFFIXES = (".toml", ".ini", ".cfg", ".yaml", ".yml", ".env", ".conf", ".json")
CODE_SUFFIXES = (".py", ".sh")
SQL_SUFFIXES = (".sql",)
DATA_SUFFIXES = (".csv", ".tsv")
DOC_SUFFIXES = (".md", ".txt", ".rst")
READABLE_SUFFIXES = (*CONFIG_SUFFIXES, *CODE_SUFFIXES, *SQL_SUFFIXES, *DATA_SUFFIXES, *DOC_SUFFIXES)
FILE_MODES = (
    "0400",
    "0440",
    "0444",
    "0555",
    "0600",
    "0640",
    "0644",
    "0660",
    "0664",
    "0666",
    "0755",
)
HOSTS = ("127.0.0.1", "0.0.0.0", "localhost")
_BOOLS = {"true": "false", "false": "true", "yes": "no", "no": "yes", "on": "off", "off": "on"}

_CRITERION = re.compile(r"^\s*\d+[.)]\s+(.+)$", re.MULTILINE)
_COMMAND = re.compile(r"^(?:python3?|sh|bash|\./|make|node|uv)\b.*|^\S+\.sh\b.*")
_ADDRESS = re.compile(r"^([\w.-]+):(\d{2,5})$")
_GET = re.compile(r"^GET\s+(/\S*)$")
_STATUS = re.compile(r"\banswers?\s+(\d{3})\b")
_WRITES = re.compile(r"\bwrites?\s+`([^`\n]+)`")
_TRACEBACK = re.compile(r'File "(?:/workspace/)?([^"<>]+?)", line (\d+)')
_PATH_LITERAL = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+(?:\.[\w-]+)*\.(?:"
    + "|".join(s.lstrip(".") for s in READABLE_SUFFIXES)
    + r"))\b"
)
_IMPORT = re.compile(r"^\s*(?:from|import)\s+([\w.]+)", re.MULTILINE)
_SETTING = re.compile(r"^(\s*)([\w.-]+)(\s*[=:]\s*)(.+?)\s*$")
_UNKNOWN_NAME = re.compile(
    r"KeyError: '([\w.-]+)'|no such column: ([\w.]+)|has no column named (\w+)"
    r"|column \"?(\w+)\"? does not exist|Unknown column '(\w+)'"
)
_CREATE_TABLE = re.compile(r"CREATE TABLE\s+(?:IF NOT EXISTS\s+)?\w+\s*\((.*?)\)\s*;", re.I | re.S)
_ADD_COLUMN = re.compile(r"ADD COLUMN\s+(\w+)", re.I)
_SQL_CONSTRAINTS = ("primary", "unique", "foreign", "check", "constraint")

EVIDENCE_PATTERNS = {
    "address_error": re.compile(
        r"gaierror|Name or service not known|Cannot assign requested address"
        r"|Address already in use|nodename nor servname"
    ),
    "permission_error": re.compile(
        r"readonly database|read-only|Permission denied|PermissionError|Operation not permitted"
    ),
    "missing_column": re.compile(
        r"no such column|has no column named|column \"?\w+\"? does not exist|Unknown column"
    ),
    "missing_key": re.compile(r"KeyError"),
    "http_error": re.compile(r"\bHTTP [45]\d\d\b"),
    "crash_loop": re.compile(r"restart|giving up|keeps crashing|service exited"),
}

CHECK_SCRIPT = r"""import http.client, json, os, signal, subprocess, sys, tempfile, time
checks = json.loads({spec!r})
failed = 0
def tail(text, lines=40):
    return "\n".join(text.strip().splitlines()[-lines:])
def serve(check):
    log = tempfile.TemporaryFile()
    service = subprocess.Popen(["sh", "-c", check["run"]], stdin=subprocess.DEVNULL, stdout=log,
                               stderr=subprocess.STDOUT, start_new_session=True)
    problems, deadline, answered = [], time.monotonic() + {wait}, False
    while time.monotonic() < deadline and not answered:
        if service.poll() is not None:
            problems.append(f"the service exited with {{service.returncode}} before answering")
            break
        try:
            for path in check["paths"]:
                conn = http.client.HTTPConnection(check["host"], check["port"], timeout=3)
                conn.request("GET", path)
                answer = conn.getresponse()
                body = answer.read(4000).decode("utf-8", "replace")
                if answer.status != check["status"]:
                    problems.append(f"GET {{path}}: HTTP {{answer.status}}, expected {{check['status']}}: {{body[:300]}}")
                for text in check["expect"]:
                    if path == check["paths"][0] and text not in body:
                        problems.append(f"GET {{path}}: the answer lacks {{text}}: {{body[:300]}}")
            answered = True
        except (OSError, http.client.HTTPException) as error:
            time.sleep(0.2)
    if not answered and not problems:
        problems.append(f"nothing answered on {{check['host']}}:{{check['port']}}")
    try:
        os.killpg(service.pid, signal.SIGKILL)
    except OSError:
        pass
    service.wait()
    log.seek(0)
    return problems, log.read().decode("utf-8", "replace")
for check in checks:
    if check["kind"] == "service":
        problems, output = serve(check)
    else:
        try:
            done = subprocess.run(["sh", "-c", check["run"]], capture_output=True, text=True,
                                  timeout={timeout})
            output = done.stdout + done.stderr
            problems = [] if done.returncode == 0 else [f"exit code {{done.returncode}}"]
        except subprocess.TimeoutExpired:
            output, problems = "", ["timed out"]
        if not problems and check["writes"] and not os.path.exists(check["writes"]):
            problems.append(f"{{check['writes']}} was not written")
    if problems:
        failed += 1
        print(f"FAIL {{check['name']}}: " + "; ".join(problems))
        print(tail(output))
    else:
        print(f"PASS {{check['name']}}")
print(f"{{failed}} failed, {{len(checks) - failed}} passed")
sys.exit(1 if failed else 0)
"""


@dataclasses.dataclass(frozen=True, slots=True)
class Criterion:
    """One numbered criterion of the instruction, as the check runs it."""

    name: str
    kind: str
    """`command` (must exit 0, and write `writes` when set) or `service` (must answer)."""
    run: str
    host: str = ""
    port: int = 0
    paths: tuple[str, ...] = ()
    status: int = 200
    expect: tuple[str, ...] = ()
    writes: str = ""


def read_criteria(instruction: str) -> list[Criterion]:
    """The instruction's numbered criteria that name a command to run."""
    if "pytest" in instruction:
        return []
    criteria = []
    for index, match in enumerate(_CRITERION.finditer(instruction)):
        line = match.group(1)
        quoted = backticked(line)
        commands = [q for q in quoted if _COMMAND.match(q)]
        if not commands:
            continue
        addresses = [a for q in quoted if (a := _ADDRESS.match(q))]
        written = _WRITES.search(line)
        if addresses:
            status = _STATUS.search(line)
            criteria.append(
                Criterion(
                    name=f"{index + 1}: {commands[0]} serves",
                    kind="service",
                    run=commands[0],
                    host=addresses[0].group(1),
                    port=int(addresses[0].group(2)),
                    paths=tuple(
                        g.group(1) for q in quoted if (g := _GET.match(q)) and "<" not in q
                    ),
                    status=int(status.group(1)) if status else 200,
                    expect=tuple(q for q in quoted if '": ' in q),
                )
            )
        else:
            criteria.append(
                Criterion(
                    name=f"{index + 1}: {commands[0]}",
                    kind="command",
                    run=commands[0],
                    writes=normalize_path(written.group(1)) if written else "",
                )
            )
    return [c for c in criteria if c.kind != "service" or c.paths]


def applies(instruction: str) -> bool:
    return any(c.kind == "service" for c in read_criteria(instruction))


def check_command(criteria: list[Criterion]) -> str:
    spec = json.dumps([dataclasses.asdict(c) for c in criteria])
    script = CHECK_SCRIPT.format(spec=spec, wait=SERVICE_WAIT_S, timeout=COMMAND_TIMEOUT_S)
    return f"python - <<'CHECK'\n{script}CHECK"


def evidence_of(text: str) -> set[str]:
    found = {kind for kind, pattern in EVIDENCE_PATTERNS.items() if pattern.search(text)}
    return found or {"no_evidence"}


def unknown_names(text: str) -> list[str]:
    names: dict[str, None] = {}
    for match in _UNKNOWN_NAME.finditer(text):
        name = next(g for g in match.groups() if g)
        names[name.rsplit(".", 1)[-1]] = None
    return list(names)


def declared_columns(files: dict[str, str]) -> tuple[set[str], set[str]]:
    """(columns of the data files' headers, columns the SQL files declare)."""
    header: set[str] = set()
    schema: set[str] = set()
    for path, text in files.items():
        if path.endswith(DATA_SUFFIXES):
            first = text.split("\n", 1)[0]
            separator = "\t" if path.endswith(".tsv") else ","
            header.update(
                c.strip() for c in first.split(separator) if re.fullmatch(r"\w+", c.strip())
            )
        elif path.endswith(SQL_SUFFIXES):
            for body in _CREATE_TABLE.findall(text):
                for part in body.split(","):
                    words = part.split()
                    if words and words[0].lower() not in _SQL_CONSTRAINTS:
                        schema.add(words[0].strip('"`'))
            schema.update(_ADD_COLUMN.findall(text))
    return header, schema


# -- the situation ----------------------------------------------------------------------------


@dataclasses.dataclass(slots=True)
class _Situation:
    instruction: str
    check: str
    edits: Edits
    listed: list[str] | None = None
    failed_reads: set[str] = dataclasses.field(default_factory=set)
    failing: int | None = None
    """Criteria failing now: from the last check run or kept trial."""
    failure_text: str = ""
    """Output of the last run that failed on the current files (check or kept trial)."""
    checks_run: bool = False

    @property
    def evidence(self) -> set[str]:
        return evidence_of(self.failure_text) if self.failure_text else {"no_evidence"}

    @property
    def traceback_lines(self) -> set[tuple[str, int]]:
        return {(normalize_path(p), int(n)) for p, n in _TRACEBACK.findall(self.failure_text)}


def _read_situation(history: History, criteria: list[Criterion]) -> _Situation:
    situation = _Situation(
        instruction=history.instruction,
        check=check_command(criteria),
        edits=follow_edits(history),
    )
    for turn in history.turns:
        action, observation = turn.action, turn.observation
        if isinstance(action, RunCommand):
            if action.command == LIST_FILES_COMMAND and observation.exit_code == 0:
                situation.listed = [
                    normalize_path(line) for line in observation.text.splitlines()
                    if line.startswith("./")
                ]  # fmt: skip
            elif action.command == situation.check:
                situation.checks_run = True
                situation.failing = failing_test_count(observation.text, observation.exit_code)
                situation.failure_text = observation.text if observation.exit_code else ""
        elif isinstance(action, ReadFile) and observation.exit_code != 0:
            situation.failed_reads.add(normalize_path(action.path))
        elif (
            isinstance(action, TryEdit)
            and action.test_command == situation.check
            and TRIAL_KEPT in observation.text[-200:]
        ):
            situation.failing = failing_test_count(observation.text, observation.exit_code)
            situation.failure_text = observation.text if situation.failing else ""
    return situation


# -- reading ----------------------------------------------------------------------------------


def _known_paths(situation: _Situation) -> dict[str, set[str]]:
    """Files worth reading, each with where it was seen: named by the instruction (not as an
    output it asks for), a traceback, the failing output, or a file already read (a path or a
    module it imports); configuration and SQL files the listing shows."""
    seen: dict[str, set[str]] = {}

    def add(path: str, source: str) -> None:
        path = normalize_path(path)
        if path.endswith(READABLE_SUFFIXES) and not path.startswith(("/", "..")):
            seen.setdefault(path, set()).add(source)

    for quoted in backticked(situation.instruction):
        for match in _PATH_LITERAL.finditer(quoted):
            add(match.group(1), "instruction")
    for path, _ in situation.traceback_lines:
        add(path, "traceback")
    packages = {p.split("/", 1)[0] for p in [*seen, *situation.edits.files] if "/" in p}
    for text in situation.edits.files.values():
        for match in _PATH_LITERAL.finditer(text):
            add(match.group(1), "referenced")
        for module in _IMPORT.findall(text):
            if module.split(".", 1)[0] in packages:
                add(module.replace(".", "/") + ".py", "referenced")
    if situation.listed is not None:
        listed = set(situation.listed)
        seen = {p: s for p, s in seen.items() if p in listed}
        for path in situation.listed:
            if path.endswith((*CONFIG_SUFFIXES, *SQL_SUFFIXES)):
                add(path, "listed")
    for path in _named_in_failure(situation, seen):
        seen[path].add("output")
    # what the criteria ask to be written is the system's output, not a cause
    outputs = {normalize_path(p) for p in _WRITES.findall(situation.instruction)}
    return {p: s for p, s in seen.items() if p not in outputs}


def _named_in_failure(situation: _Situation, paths: Iterable[str]) -> set[str]:
    """Known files the failing output names, by path or by file name."""
    text = situation.failure_text
    if not text:
        return set()
    named = set()
    for path in paths:
        name = path.rsplit("/", 1)[-1]
        if path in text or re.search(rf"(?<![\w.-]){re.escape(name)}(?![\w-])", text):
            named.add(path)
    return named


def _read_kind(path: str) -> str:
    for kind, suffixes in (
        ("config", CONFIG_SUFFIXES),
        ("code", CODE_SUFFIXES),
        ("sql", SQL_SUFFIXES),
        ("data", DATA_SUFFIXES),
        ("doc", DOC_SUFFIXES),
    ):
        if path.endswith(suffixes):
            return kind
    return ""


def _read_candidates(situation: _Situation, base: dict[str, float]) -> Iterator[Candidate]:
    traceback_paths = {p for p, _ in situation.traceback_lines}
    evidence = situation.evidence
    for path, sources in sorted(_known_paths(situation).items()):
        if path in situation.edits.files or path in situation.failed_reads:
            continue
        kind = _read_kind(path)
        features = {
            **{f"ops_read_{kind}_given_{e}": 1.0 for e in evidence if kind},
            **base,
            "ops_is_read": 1.0,
            "ops_read_in_traceback": float(path in traceback_paths),
            "ops_read_named_in_output": float("output" in sources),
            "ops_read_named_in_instruction": float("instruction" in sources),
            "ops_read_referenced_by_read_file": float("referenced" in sources),
            "ops_read_config": float(path.endswith(CONFIG_SUFFIXES)),
            "ops_read_code": float(path.endswith(CODE_SUFFIXES)),
            "ops_read_sql": float(path.endswith(SQL_SUFFIXES)),
            "ops_read_data": float(path.endswith(DATA_SUFFIXES)),
            "ops_read_doc": float(path.endswith(DOC_SUFFIXES)),
        }
        yield Candidate(ReadFile(path), feature_vector(features), f"read {path}")


# -- edits ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Edit:
    kind: str
    path: str
    line_number: int
    old_line: str
    new_line: str
    description: str
    extra: dict[str, float]


def _unquoted(value: str) -> tuple[str, str]:
    """(the value without quotes, the quote character)."""
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1], value[0]
    return value, ""


def _config_edits(path: str, text: str) -> Iterator[_Edit]:
    for index, line in enumerate(text.split("\n")):
        stripped = line.strip()
        if not stripped or stripped.startswith(("#", ";", "[", "//")):
            continue
        match = _SETTING.match(line)
        if match is None:
            continue
        indent, key, separator, raw = match.groups()
        raw = raw.split(" #", 1)[0].rstrip().rstrip(",")
        value, quote = _unquoted(raw)
        prefix = f"{indent}{key}{separator}"

        def setting(new: str, prefix: str = prefix, quote: str = quote) -> str:
            return f"{prefix}{quote}{new}{quote}"

        number = index + 1
        address = _ADDRESS.match(value)
        if address or value in HOSTS:
            host = address.group(1) if address else value
            if address:
                yield _Edit("config_address", path, number, line, setting(host),
                            f"{key}: drop the port", {"ops_address_drops_port": 1.0})  # fmt: skip
            for other in HOSTS:
                if other != host:
                    yield _Edit("config_address", path, number, line, setting(other),
                                f"{key}: {value}->{other}", {})  # fmt: skip
        elif re.fullmatch(r"0[0-7]{3}", value) or (
            re.fullmatch(r"[0-7]{3,4}", value) and re.search(r"mode|perm|umask", key, re.I)
        ):
            for mode in FILE_MODES:
                if int(mode, 8) != int(value, 8):
                    writable = float(bool(int(mode, 8) & 0o200))
                    yield _Edit("config_mode", path, number, line, setting(mode),
                                f"{key}: {value}->{mode}", {"ops_mode_owner_writable": writable})  # fmt: skip
        elif re.fullmatch(r"\d+", value):
            for moved in (int(value) + 1, int(value) - 1):
                if moved >= 0:
                    yield _Edit("config_number", path, number, line, setting(str(moved)),
                                f"{key}: {value}->{moved}", {})  # fmt: skip
        elif value.lower() in _BOOLS:
            flipped = _BOOLS[value.lower()]
            if value.istitle():
                flipped = flipped.title()
            yield _Edit("config_bool", path, number, line, setting(flipped),
                        f"{key}: {value}->{flipped}", {})  # fmt: skip


def _rename_edits(situation: _Situation) -> Iterator[_Edit]:
    names = unknown_names(situation.failure_text)
    if not names:
        return
    header, schema = declared_columns(situation.edits.files)
    columns = sorted(header | schema)
    for path, text in sorted(situation.edits.files.items()):
        if path.endswith(SQL_SUFFIXES):
            kind = "rename_in_sql"
        elif path.endswith(CODE_SUFFIXES):
            kind = "rename_in_code"
        else:
            continue
        for name in names:
            pattern = re.compile(rf"(?<![\w.]){re.escape(name)}(?!\w)")
            for index, line in enumerate(text.split("\n")):
                if not pattern.search(line):
                    continue
                for column in columns:
                    if column == name:
                        continue
                    shared = set(name.lower().split("_")) & set(column.lower().split("_"))
                    yield _Edit(
                        kind, path, index + 1, line, pattern.sub(column, line),
                        f"{name}->{column}",
                        {
                            "ops_rename_name_in_error": 1.0,
                            "ops_rename_name_not_in_data": float(name not in header | schema),
                            "ops_rename_to_data_column": float(column in header),
                            "ops_rename_shares_word": float(bool(shared)),
                        },
                    )  # fmt: skip


def _edit_candidates(situation: _Situation, base: dict[str, float]) -> Iterator[Candidate]:
    failing = situation.failing
    if not failing:
        return
    edits: list[_Edit] = []
    for path, text in sorted(situation.edits.files.items()):
        if path.endswith(CONFIG_SUFFIXES):
            edits.extend(_config_edits(path, text))
    edits.extend(_rename_edits(situation))
    traceback_lines = situation.traceback_lines
    in_failure = {p for p, _ in traceback_lines} | _named_in_failure(
        situation, situation.edits.files
    )
    evidence = situation.evidence
    seen: set[tuple[str, str]] = set()
    for edit in edits:
        current = situation.edits.files[edit.path]
        lines = current.split("\n")
        target = "\n".join(
            [*lines[: edit.line_number - 1], edit.new_line, *lines[edit.line_number :]]
        )
        if target == current or (edit.path, target) in seen:
            continue
        if (edit.path, digest(target)) in situation.edits.tried:
            continue  # a reverted trial fails again: the proposer keeps track of its own
        seen.add((edit.path, target))
        change = edit_between(edit.path, current, target)
        if change is None:
            continue
        features = {
            **base,
            **edit.extra,
            "ops_is_try_edit": 1.0,
            "ops_edit_in_traceback_file": float(edit.path in in_failure),
            "ops_edit_line_in_traceback": float((edit.path, edit.line_number) in traceback_lines),
            "ops_edit_line_tried_before": float(
                (edit.path, edit.old_line) in situation.edits.tried_lines
            ),
            f"ops_edit_{edit.kind}": 1.0,
            **{f"ops_{edit.kind}_given_{e}": 1.0 for e in evidence},
        }
        action = TryEdit(change.path, change.old_text, change.new_text, situation.check, failing)
        label = f"try {edit.path}:{edit.line_number} {edit.kind} {edit.description}"
        yield Candidate(action, feature_vector(features), label)


# -- proposing --------------------------------------------------------------------------------


def propose(history: History) -> list[Candidate]:
    """Every action worth considering after `history` on a troubleshooting task, with features.

    Deterministic; never empty; once the check passes, submitting is all that is left."""
    criteria = read_criteria(history.instruction)
    situation = _read_situation(history, criteria)
    evidence = situation.evidence
    base = {
        **{f"ops_evidence_{e}": 1.0 for e in evidence if e in OPS_EVIDENCE_KINDS},
        "ops_checks_run": float(situation.checks_run),
        "ops_listed": float(situation.listed is not None),
        "ops_step_fraction": min(history.step_count / STEP_HORIZON, 1.0),
        "ops_trials_reverted_scaled": min(situation.edits.reverted / 4.0, 1.0),
    }
    submit = Candidate(
        Submit(),
        feature_vector(
            {
                **base,
                "ops_is_submit": 1.0,
                "ops_submit_checks_failing": float(situation.failing != 0),
                "ops_submit_before_any_trial": float(situation.edits.trials == 0),
            }
        ),
        "submit",
    )
    if situation.failing == 0:
        return [submit]
    candidates = []
    if not situation.checks_run and criteria:
        candidates.append(
            Candidate(
                RunCommand(situation.check),
                feature_vector({**base, "ops_is_check": 1.0, "ops_check_never_run": 1.0}),
                "run the check",
            )
        )
    if situation.listed is None:
        candidates.append(
            Candidate(
                RunCommand(LIST_FILES_COMMAND),
                feature_vector({**base, "ops_is_list_files": 1.0}),
                "list files",
            )
        )
    candidates.extend(_read_candidates(situation, base))
    candidates.extend(_edit_candidates(situation, base))
    if situation.edits.trials:
        candidates.append(submit)
    return candidates or [submit]
