"""Candidate actions for the built-in policy, proposed from what the agent has seen, with features.

The proposer reads the history the way a developer skims a failing build: which tests failed and
how many, which functions the failing tests exercise (the calls on pytest's `>` lines, the
`test_<function>` naming convention, the package frames of a traceback), what the failing
assertion looks like (numbers one apart, a bool, `None`, the same items in another order, ...),
and what the files it has read contain. From that it proposes a bounded set of actions: run the
tests, list files, read a file, submit, undo the changes since the last improvement, and edits —
every small mutation (flip a comparison or arithmetic operator, move a constant by one, swap
`and`/`or`, add or drop `not`, use another local variable, add a call the code may have lost,
change what a `return` gives) of the functions the failures point to, plus a few of the same
edits elsewhere, test files included. It never knows which edit fixes the bug.

It also keeps score the way a developer does: a change whose test run did not lower the number
of failing tests counts as failed, and the next edits are offered *instead of* it (one edit that
undoes it and makes the new change), so trying a fix costs an edit and a test run.

Each candidate gets a fixed-length feature vector describing the action and the situation; the
network in `training.scorer_policy` learns from rewards which ones pay. Features are generic —
where an edit lands relative to the failure, what kind of edit it is, whether the tests were
run since, whether the last change helped — never which edit is the answer.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import hashlib
import io
import re
import tokenize
from collections.abc import Iterator

from training.actions import (
    Action,
    EditFile,
    History,
    ReadFile,
    RunCommand,
    Submit,
)

DEFAULT_TEST_COMMAND = "python -m pytest -q"
LIST_FILES_COMMAND = "find . -name '*.py' -not -path '*/.*' | sort"
FAST_PYTEST_ENV = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1"
"""Prefix of the proposer's test runs: third-party pytest plugins installed next to the
interpreter cost seconds per run to import, and bytecode caches would land in the diff."""

MUTATION_KINDS = (
    "comparison",
    "arithmetic",
    "off_by_one",
    "boolean",
    "wrong_variable",
    "missing_call",
    "return_value",
)

FEATURE_NAMES: tuple[str, ...] = (
    # what kind of action
    "is_run_tests",
    "is_list_files",
    "is_read",
    "is_edit",
    "is_revert",
    "is_submit",
    # running the tests, given the situation
    "run_tests_never_run",
    "run_tests_after_edit",
    "run_tests_nothing_changed",
    # submitting, given the situation
    "submit_tests_passed",
    "submit_never_tested",
    "submit_tests_failed",
    "submit_untested_edit",
    "submit_after_improvement",
    # listing and reading
    "list_already_listed",
    "read_named_by_failure",
    "read_named_by_instruction",
    "read_already_read",
    "read_test_file",
    "read_source_of_failing_test",
    "read_before_tests_run",
    # where an edit lands
    "edit_test_file",
    "edit_line_in_traceback",
    "edit_in_failing_function",
    "edit_before_tests_run",
    "edit_stacked_untested",
    "edit_replaces_failed_change",
    "edit_state_tested_before",
    "edit_line_changed_before",
    # what an edit does (one-hot over MUTATION_KINDS)
    *(f"edit_kind_{kind}" for kind in MUTATION_KINDS),
    # what the failure looks like, crossed with the kind of edit that would explain it
    "off_by_one_and_numbers_differ_by_one",
    "arithmetic_and_numbers_differ",
    "boolean_and_bool_mismatch",
    "comparison_and_bool_mismatch",
    "return_value_and_bool_or_none_mismatch",
    "missing_call_fits_the_difference",
    # undoing the changes since the last improvement
    "revert_after_failed_test",
    "revert_untested",
    # the situation (the same for every candidate; the hidden layer crosses it with the rest)
    "last_run_improved",
    "last_run_passed",
    "step_fraction",
    "edits_applied_scaled",
)
FEATURE_COUNT = len(FEATURE_NAMES)
_FEATURE_INDEX = {name: index for index, name in enumerate(FEATURE_NAMES)}

_STEP_HORIZON = 16
"""Steps after which `step_fraction` saturates (policies rarely get more)."""
_MAX_FOCUSED_EDITS = 120
"""Cap on edits in the functions the failures point to (per file)."""
_EDITS_ELSEWHERE_PER_FILE = 6
"""Edits proposed outside those functions, per source file: plausible-looking but aimed nowhere
in particular, so the policy has to learn that location matters."""
_EDITS_PER_TEST_FILE = 3
"""Edits proposed in a test file (changing tests never earns reward: the verifier restores them)."""

_PY_PATH = re.compile(r"(?<![\w/.-])(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py)\b")
_TRACEBACK_LOCATION = re.compile(
    r"(?:^|\s)(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py):(\d+)(?::|\b)"
    r"|File \"(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py)\", line (\d+)",
    re.MULTILINE,
)
_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")
_CALLED_NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_SOURCE_LINE = re.compile(r"^>\s+(.*)$", re.MULTILINE)
_ERROR_LINE = re.compile(r"^E\s+(.*)$", re.MULTILINE)
_ASSERT_COMPARISON = re.compile(r"^(?:AssertionError: )?assert (.+?) == (.+)$")
_BACKTICKED_PYTEST = re.compile(
    r"`([^`\n]*pytest[^`\n]*)`|^(?: {4}|\t)(\S*python\S* -m pytest[^\n]*)$", re.MULTILINE
)
_TEST_ID = re.compile(r"(?:[\w.-]+/)*test_\w+\.py::(test_\w+)")
_FAILED_TEST_FILE = re.compile(r"(?:FAILED |^)(?:[\w.-]+/)*test_(\w+)\.py(?:::|:\d+)", re.MULTILINE)
_FAILED_COUNT = re.compile(r"(\d+) (?:failed|errors?)\b")
_PASSED_COUNT = re.compile(r"(\d+) passed\b")

_COMPARISON_SWAPS = {
    "<": ("<=", ">"),
    "<=": ("<", ">="),
    ">": (">=", "<"),
    ">=": (">", "<="),
    "==": ("!=",),
    "!=": ("==",),
}
_ARITHMETIC_SWAPS = {
    "+": ("-", "*"),
    "-": ("+",),
    "*": ("/", "+"),
    "/": ("*", "//"),
    "//": ("%", "/"),
    "%": ("//",),
    "+=": ("-=", "*="),
    "-=": ("+=",),
    "*=": ("+=",),
}
_BOOLEAN_SWAPS = {"and": ("or",), "or": ("and",), "True": ("False",), "False": ("True",)}
_STRUCTURAL_PREFIXES = ("def ", "class ", "import ", "from ", "@", "#")
_WRAPPING_METHODS = ("lower", "upper")
_SWAPPABLE_RETURN_OPS = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod)
_KEYWORDS_BEFORE_PAREN = frozenset(
    {"return", "in", "and", "or", "not", "if", "elif", "while", "yield", "else", "for"}
)
_OPERAND_BEFORE = frozenset({"=", "(", ",", "[", "return", "in", "+", "-", "*", "/", "//", "%"})


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One action the policy may take, and its features."""

    action: Action
    features: tuple[float, ...]
    label: str
    """Short description for logs ("edit calc.py:12 comparison '<'->'<='")."""


@dataclasses.dataclass(slots=True)
class _Failure:
    """What a failing test run says, digested."""

    paths: set[str] = dataclasses.field(default_factory=set)
    traceback_lines: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    called_names: set[str] = dataclasses.field(default_factory=set)
    """Functions called on the failing source lines (`>` lines) of the tracebacks."""
    failing_test_names: set[str] = dataclasses.field(default_factory=set)
    failing_test_stems: set[str] = dataclasses.field(default_factory=set)
    numbers_differ_by_one: bool = False
    numbers_differ: bool = False
    bool_mismatch: bool = False
    none_mismatch: bool = False
    order_differs: bool = False
    case_differs: bool = False
    sign_differs: bool = False
    type_differs: bool = False


@dataclasses.dataclass(slots=True)
class _Situation:
    """What the history says, digested once per step."""

    instruction: str
    test_command: str
    step_count: int
    files: dict[str, str]
    """Current content of every file read (edits since applied)."""
    accepted: dict[str, str]
    """Content at the last state the tests did not get worse than (as read, or after a change
    that lowered the failure count): what a revert goes back to."""
    mentioned_paths: list[str]
    instruction_paths: set[str]
    listed: bool = False
    tests_run: bool = False
    last_tests_passed: bool = False
    last_run_improved: bool = False
    edited_since_test: bool = False
    change_failed: bool = False
    """The changes since `accepted` were tested and did not lower the failure count."""
    accepted_failures: int | None = None
    failure: _Failure = dataclasses.field(default_factory=_Failure)
    edits_applied: int = 0
    tested_states: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(path, content digest) of file states a test run has seen."""
    changed_lines: set[tuple[str, str]] = dataclasses.field(default_factory=set)


def is_test_path(path: str) -> bool:
    name = path.rsplit("/", 1)[-1]
    return (
        name.startswith("test_")
        or name.endswith("_test.py")
        or name == "conftest.py"
        or "tests/" in path
        or path.startswith("test/")
    )


def find_test_command(instruction: str) -> str:
    """The test command the instruction names in backticks, else plain pytest."""
    match = _BACKTICKED_PYTEST.search(instruction)
    return (match.group(1) or match.group(2)).strip() if match else DEFAULT_TEST_COMMAND


def runnable_test_command(instruction: str) -> str:
    """The command the proposer runs the tests with: the instruction's, without plugin
    autoloading, bytecode or cache files (`FAST_PYTEST_ENV`)."""
    command = find_test_command(instruction)
    if "pytest" not in command or "=" in command.split(" ", 1)[0]:
        return command
    return f"{FAST_PYTEST_ENV} {command} -p no:cacheprovider"


def _normalize_path(path: str) -> str:
    path = path.removeprefix("/workspace/")
    while path.startswith("./"):
        path = path[2:]
    return path


def _digest(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _UNPARSED


_UNPARSED = object()


def _compare_values(failure: _Failure, left: object, right: object) -> None:
    """Describe how an assertion's two sides differ (generic debugging hints)."""
    if left is _UNPARSED or right is _UNPARSED:
        return
    if isinstance(left, bool) or isinstance(right, bool):
        failure.bool_mismatch = True
        return
    if left is None or right is None:
        failure.none_mismatch = True
        return
    if type(left) is not type(right) and not (
        isinstance(left, int | float) and isinstance(right, int | float)
    ):
        failure.type_differs = True
        return
    if isinstance(left, int | float) and isinstance(right, int | float):
        failure.numbers_differ = True
        if abs(left - right) == 1:
            failure.numbers_differ_by_one = True
        if left == -right or (left < 0) != (right < 0):
            failure.sign_differs = True
        return
    if isinstance(left, str) and isinstance(right, str):
        failure.case_differs = left.lower() == right.lower()
        return
    if isinstance(left, list | tuple) and isinstance(right, list | tuple):
        with contextlib.suppress(TypeError):
            failure.order_differs = sorted(left) == sorted(right)  # type: ignore[type-var]
        pairs = list(zip(left, right, strict=False))
        if pairs and len(left) == len(right):
            for a, b in pairs:
                if a != b:
                    _compare_values(failure, a, b)
                    break
    if isinstance(left, dict) and isinstance(right, dict):
        lowered: dict[object, object] = {}
        for key, value in left.items():
            lowered_key = key.lower() if isinstance(key, str) else key
            lowered[lowered_key] = value
        failure.case_differs = failure.case_differs or set(lowered) == set(right)


def _digest_failure(output: str) -> _Failure:
    failure = _Failure()
    for match in _TRACEBACK_LOCATION.finditer(output):
        path = match.group(1) or match.group(3)
        line = match.group(2) or match.group(4)
        normalized = _normalize_path(path)
        failure.paths.add(normalized)
        failure.traceback_lines.add((normalized, int(line)))
    for line in _SOURCE_LINE.findall(output):
        failure.called_names.update(_CALLED_NAME.findall(line))
    failure.failing_test_names = set(_TEST_ID.findall(output))
    failure.failing_test_stems = set(_FAILED_TEST_FILE.findall(output))
    for line in _ERROR_LINE.findall(output):
        match = _ASSERT_COMPARISON.match(line.strip())
        if match:
            _compare_values(failure, _literal(match.group(1)), _literal(match.group(2)))
        elif line.strip() in ("assert False", "assert True"):
            failure.bool_mismatch = True
    return failure


def _failed_count(output: str, exit_code: int | None) -> int | None:
    if exit_code == 0:
        return 0
    tail = output[-400:]
    counts = [int(n) for n in _FAILED_COUNT.findall(tail)]
    return sum(counts) if counts else None


def _read_situation(history: History) -> _Situation:
    instruction = history.instruction
    mentioned: dict[str, None] = {}
    for match in _PY_PATH.finditer(instruction):
        mentioned[_normalize_path(match.group(1))] = None
    situation = _Situation(
        instruction=instruction,
        test_command=runnable_test_command(instruction),
        step_count=history.step_count,
        files={},
        accepted={},
        mentioned_paths=[],
        instruction_paths=set(mentioned),
    )
    listed_failures = _TEST_ID.findall(instruction)
    situation.failure.failing_test_names = set(listed_failures)
    situation.failure.failing_test_stems = set(_FAILED_TEST_FILE.findall(instruction))
    if listed_failures:
        situation.accepted_failures = len(set(listed_failures))
    for turn in history.turns:
        action, observation = turn.action, turn.observation
        if isinstance(action, RunCommand):
            for match in _PY_PATH.finditer(observation.text):
                mentioned[_normalize_path(match.group(1))] = None
            if action.command == LIST_FILES_COMMAND:
                situation.listed = True
            if "pytest" in action.command:
                _digest_test_run(situation, observation.text, observation.exit_code)
        elif isinstance(action, ReadFile) and observation.exit_code == 0:
            path = _normalize_path(action.path)
            situation.files[path] = observation.text
            situation.accepted.setdefault(path, observation.text)
        elif isinstance(action, EditFile) and observation.exit_code == 0:
            path = _normalize_path(action.path)
            if path in situation.files:
                situation.files[path] = situation.files[path].replace(
                    action.old_text, action.new_text, 1
                )
            situation.edited_since_test = True
            situation.change_failed = False  # a new change: untested, not failed
            situation.edits_applied += 1
            situation.changed_lines.update((path, line) for line in action.new_text.split("\n"))
            if all(situation.files[p] == situation.accepted.get(p) for p in situation.files):
                # back at the accepted state (a revert): nothing failed is pending any more
                situation.edited_since_test = False
                situation.change_failed = False
    situation.mentioned_paths = list(mentioned)
    return situation


def _digest_test_run(situation: _Situation, output: str, exit_code: int | None) -> None:
    changed = any(situation.files[p] != situation.accepted.get(p) for p in situation.files)
    failed = _failed_count(output, exit_code)
    situation.tests_run = True
    situation.last_tests_passed = exit_code == 0
    situation.edited_since_test = False
    for path, content in situation.files.items():
        situation.tested_states.add((path, _digest(content)))
    baseline = situation.accepted_failures
    improved = failed is not None and baseline is not None and failed < baseline
    situation.last_run_improved = changed and (improved or failed == 0)
    if not changed or situation.last_run_improved or baseline is None:
        # the tests' verdict on the accepted state, or a change that helped: keep it
        situation.accepted = dict(situation.files)
        situation.accepted_failures = failed
        situation.change_failed = False
    else:
        situation.change_failed = True
    if exit_code == 0:
        situation.failure = _Failure()
        return
    situation.failure = _digest_failure(output)


# -- edits --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Function:
    name: str
    first_line: int
    last_line: int
    local_names: tuple[str, ...]


def _functions(source: str) -> list[_Function]:
    """Functions of `source` with their line spans and local names; [] when it does not parse
    (a capped read or a broken edit), in which case edits get no function context."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    functions = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            names: dict[str, None] = {}
            for argument in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                names[argument.arg] = None
            for inner in ast.walk(node):
                if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                    names[inner.id] = None
            functions.append(
                _Function(node.name, node.lineno, node.end_lineno or node.lineno, tuple(names))
            )
    return functions


def _line_mutations(line: str, local_names: tuple[str, ...]) -> Iterator[tuple[str, str, str]]:
    """(kind, description, new_line) for every small mutation of one source line."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return
    tokens = [t for t in tokens if t.start[0] == 1 and t.end[0] == 1 and t.string.strip()]
    # Names before a top-level `=` (or `for ... in`) are assigned, not read; a bug in a name
    # is a read of the wrong one.
    assigned_before = 0
    depth = 0
    for position, token in enumerate(tokens):
        if token.string in ("(", "[", "{"):
            depth += 1
        elif token.string in (")", "]", "}"):
            depth -= 1
        elif depth == 0 and (
            token.string == "="
            or (token.string.endswith("=") and token.string[:-1] in ("+", "-", "*", "/", "//", "%"))
            or (token.string == "in" and tokens[0].string == "for")
        ):
            assigned_before = position
            break
    is_def = bool(tokens) and tokens[0].string in ("def", "class", "lambda")
    for position, token in enumerate(tokens):
        previous = tokens[position - 1] if position else None
        following = tokens[position + 1] if position + 1 < len(tokens) else None
        start, end = token.start[1], token.end[1]

        def replaced(text: str, start: int = start, end: int = end) -> str:
            return line[:start] + text + line[end:]

        string = token.string
        if token.type == tokenize.OP:
            if string in _COMPARISON_SWAPS:
                for other in _COMPARISON_SWAPS[string]:
                    yield "comparison", f"{string!r}->{other!r}", replaced(other)
            elif string in _ARITHMETIC_SWAPS:
                operand_before = previous is not None and (
                    previous.type in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING)
                    or previous.string in (")", "]", "}")
                )
                if string in ("+", "-") and not operand_before:
                    continue  # a sign, not an operator
                for other in _ARITHMETIC_SWAPS[string]:
                    yield "arithmetic", f"{string!r}->{other!r}", replaced(other)
            elif string == "(" and previous is not None and previous.string in _OPERAND_BEFORE:
                # a bare parenthesized expression may have lost the call around it
                yield "missing_call", "add abs(...)", line[:start] + "abs" + line[start:]
            elif string == "]" and following is not None and following.string in (")", ","):
                for method in _WRAPPING_METHODS:
                    yield "missing_call", f"add .{method}()", replaced(f"].{method}()")
        elif token.type == tokenize.NUMBER and string.isdigit():
            value = int(string)
            yield "off_by_one", f"{value}->{value + 1}", replaced(str(value + 1))
            if value > 0:
                yield "off_by_one", f"{value}->{value - 1}", replaced(str(value - 1))
            if value == 1 and previous is not None and previous.string in ("+", "-"):
                # `x + 1` -> `x`: the inverse of an added offset
                cut_start = previous.start[1]
                while cut_start > 0 and line[cut_start - 1] == " ":
                    cut_start -= 1
                yield "off_by_one", f"drop '{previous.string} 1'", line[:cut_start] + line[end:]
        elif token.type == tokenize.NAME:
            if string in _BOOLEAN_SWAPS:
                kind = (
                    "return_value"
                    if previous is not None and previous.string == "return"
                    else "boolean"
                )
                for other in _BOOLEAN_SWAPS[string]:
                    yield kind, f"{string!r}->{other!r}", replaced(other)
            elif string == "not":
                cut_end = end + 1 if line[end : end + 1] == " " else end
                kind = "comparison" if line[cut_end:].startswith("in ") else "boolean"
                yield kind, "drop 'not'", line[:start] + line[cut_end:]
            elif string == "in" and (previous is None or previous.string != "not"):
                yield "comparison", "'in'->'not in'", replaced("not in")
            elif string in ("if", "while") and line[end : end + 1] == " ":
                after = end + 1
                if not line[after:].startswith("not "):
                    yield (
                        "boolean",
                        f"add 'not' after {string!r}",
                        line[:after] + "not " + line[after:],
                    )
            elif string in local_names and (previous is None or previous.string != "."):
                after = following.string if following is not None else ""
                # only names that are read: not calls, not assignment targets, not parameters
                if after == "(" or is_def or position < assigned_before:
                    continue
                for other in local_names:
                    if other != string:
                        yield "wrong_variable", f"{string!r}->{other!r}", replaced(other)
                # a call the code may have lost, where such calls sit: a whole value assigned,
                # returned or iterated over, a tuple element, a method's receiver
                before = previous.string if previous is not None else ""
                whole_value = before in ("=", "return", "in") and after in ("", ":", ")", ",")
                if whole_value:
                    for call in ("sorted", "str", "abs"):
                        yield "missing_call", f"add {call}(...)", replaced(f"{call}({string})")
                if before in ("(", ",") and after in (")", ","):
                    for call in ("min", "max"):
                        yield "missing_call", f"add {call}(...)", replaced(f"{call}({string})")
                if before in ("=", "in", "return") and after in (":", ".", ")", ""):
                    for method in _WRAPPING_METHODS:
                        yield "missing_call", f"add .{method}()", replaced(f"{string}.{method}()")
    yield from _return_mutations(line)


def _return_mutations(line: str) -> Iterator[tuple[str, str, str]]:
    """Changes of what a `return` line returns: swap the operands of a non-commutative operator,
    `None` for `0`."""
    stripped = line.lstrip()
    if not stripped.startswith("return "):
        return
    indent = line[: len(line) - len(stripped)]
    try:
        node = ast.parse(stripped).body[0]
    except (SyntaxError, IndexError):
        return
    if not isinstance(node, ast.Return) or node.value is None:
        return
    value = node.value
    if isinstance(value, ast.BinOp) and isinstance(value.op, _SWAPPABLE_RETURN_OPS):
        swapped = ast.BinOp(value.right, value.op, value.left)
        yield "return_value", "swap operands", f"{indent}return {ast.unparse(swapped)}"
    elif isinstance(value, ast.Constant) and value.value == 0 and value.value is not False:
        yield "return_value", "0->None", f"{indent}return None"
    elif isinstance(value, ast.Constant) and value.value is None:
        yield "return_value", "None->0", f"{indent}return 0"


def edit_between(path: str, current: str, target: str) -> EditFile | None:
    """The one `edit_file` call that turns `current` into `target`: the changed lines, widened
    by context until the old text occurs once (None when nothing differs or no anchor exists)."""
    if current == target:
        return None
    old_lines, new_lines = current.split("\n"), target.split("\n")
    prefix = 0
    while prefix < min(len(old_lines), len(new_lines)) and old_lines[prefix] == new_lines[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < min(len(old_lines), len(new_lines)) - prefix
        and old_lines[-1 - suffix] == new_lines[-1 - suffix]
    ):
        suffix += 1
    first, old_end, new_end = prefix, len(old_lines) - suffix, len(new_lines) - suffix
    for _ in range(4):
        old_text = "\n".join(old_lines[first:old_end])
        if old_text.strip() and current.count(old_text) == 1:
            return EditFile(path, old_text, "\n".join(new_lines[first:new_end]))
        # widen: one more line of context on each side
        if first > 0:
            first -= 1
        if old_end < len(old_lines) and new_end < len(new_lines):
            old_end, new_end = old_end + 1, new_end + 1
    return None


# -- features -----------------------------------------------------------------------------------


def _vector(situation: _Situation, **active: float) -> tuple[float, ...]:
    values = [0.0] * FEATURE_COUNT
    values[_FEATURE_INDEX["step_fraction"]] = min(situation.step_count / _STEP_HORIZON, 1.0)
    values[_FEATURE_INDEX["edits_applied_scaled"]] = min(situation.edits_applied / 4.0, 1.0)
    values[_FEATURE_INDEX["last_run_improved"]] = float(situation.last_run_improved)
    values[_FEATURE_INDEX["last_run_passed"]] = float(situation.last_tests_passed)
    for name, value in active.items():
        values[_FEATURE_INDEX[name]] = value
    return tuple(values)


def _call_fits(description: str, failure: _Failure) -> bool:
    """Whether an added call would explain the difference the assertion shows."""
    return (
        (failure.order_differs and ("sorted" in description or "reversed" in description))
        or (failure.case_differs and ("lower" in description or "upper" in description))
        or (failure.sign_differs and "abs" in description)
        or (failure.type_differs and "str(" in description)
        or (failure.numbers_differ and ("min(" in description or "max(" in description))
    )


def _failing_functions(situation: _Situation, path: str, functions: list[_Function]) -> set[str]:
    """Names of `path`'s functions the failures point to: called on a failing line, named by a
    failing test (`test_<function>...`), or holding a traceback frame."""
    failure = situation.failure
    names = {f.name for f in functions}
    pointed = names & failure.called_names
    for test_name in failure.failing_test_names:
        for name in names:
            if test_name == f"test_{name}" or test_name.startswith(f"test_{name}_"):
                pointed.add(name)
    for frame_path, line in failure.traceback_lines:
        if frame_path == path:
            pointed.update(f.name for f in functions if f.first_line <= line <= f.last_line)
    return pointed


def _rank(key: str) -> str:
    """A fixed pseudo-random order (the same for the same edit in every episode)."""
    return _digest(key)


def _edit_candidates(situation: _Situation) -> Iterator[Candidate]:
    failure = situation.failure
    for path in sorted(situation.files):
        if not path.endswith(".py"):
            continue
        current = situation.files[path]
        # After a failed change, new edits are made on the accepted state: one edit call both
        # undoes the failed change and makes the new one.
        replaces = situation.change_failed and current != situation.accepted.get(path, current)
        base = situation.accepted[path] if replaces else current
        lines = base.split("\n")
        functions = _functions(base)
        test_file = is_test_path(path)
        pointed = set() if test_file else _failing_functions(situation, path, functions)
        focused: list[Candidate] = []
        elsewhere: list[Candidate] = []
        seen: set[str] = set()
        for index, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or stripped.startswith(_STRUCTURAL_PREFIXES):
                continue
            line_number = index + 1
            enclosing = [f for f in functions if f.first_line <= line_number <= f.last_line]
            function = enclosing[-1] if enclosing else None
            if function is None:
                continue  # module level: constants and imports, nothing a bug hides in here
            in_failing = function.name in pointed
            for kind, description, new_line in _line_mutations(line, function.local_names):
                target = "\n".join([*lines[:index], new_line, *lines[index + 1 :]])
                if target in seen or target == current:
                    continue
                seen.add(target)
                edit = edit_between(path, current, target)
                if edit is None:
                    continue
                features = _vector(
                    situation,
                    is_edit=1.0,
                    edit_test_file=float(test_file),
                    edit_line_in_traceback=float((path, line_number) in failure.traceback_lines),
                    edit_in_failing_function=float(in_failing),
                    edit_before_tests_run=float(not situation.tests_run),
                    edit_stacked_untested=float(situation.edited_since_test and not replaces),
                    edit_replaces_failed_change=float(replaces),
                    edit_state_tested_before=float(
                        (path, _digest(target)) in situation.tested_states
                    ),
                    edit_line_changed_before=float((path, line) in situation.changed_lines),
                    **{f"edit_kind_{kind}": 1.0},
                    off_by_one_and_numbers_differ_by_one=float(
                        kind == "off_by_one" and failure.numbers_differ_by_one
                    ),
                    arithmetic_and_numbers_differ=float(
                        kind == "arithmetic" and failure.numbers_differ
                    ),
                    boolean_and_bool_mismatch=float(kind == "boolean" and failure.bool_mismatch),
                    comparison_and_bool_mismatch=float(
                        kind == "comparison" and failure.bool_mismatch
                    ),
                    return_value_and_bool_or_none_mismatch=float(
                        kind == "return_value" and (failure.bool_mismatch or failure.none_mismatch)
                    ),
                    missing_call_fits_the_difference=float(
                        kind == "missing_call" and _call_fits(description, failure)
                    ),
                )
                label = f"edit {path}:{line_number} {kind} {description}"
                (focused if in_failing else elsewhere).append(Candidate(edit, features, label))
        yield from focused[:_MAX_FOCUSED_EDITS]
        keep = _EDITS_PER_TEST_FILE if test_file else _EDITS_ELSEWHERE_PER_FILE
        chosen = sorted(elsewhere, key=lambda c: _rank(c.label))[:keep]
        yield from sorted(chosen, key=elsewhere.index)


def propose_candidates(history: History) -> list[Candidate]:
    """Every action worth considering after `history`, each with its feature vector.

    Deterministic: the same history gives the same candidates in the same order (the trainer
    and the tests rely on it). Never empty: running the tests is always possible."""
    situation = _read_situation(history)
    failure = situation.failure
    changed = any(situation.files[p] != situation.accepted.get(p) for p in situation.files)
    candidates = [
        Candidate(
            RunCommand(situation.test_command),
            _vector(
                situation,
                is_run_tests=1.0,
                run_tests_never_run=float(not situation.tests_run),
                run_tests_after_edit=float(situation.tests_run and situation.edited_since_test),
                run_tests_nothing_changed=float(
                    situation.tests_run and not situation.edited_since_test
                ),
            ),
            "run tests",
        ),
        Candidate(
            RunCommand(LIST_FILES_COMMAND),
            _vector(situation, is_list_files=1.0, list_already_listed=float(situation.listed)),
            "list files",
        ),
    ]
    for path in situation.mentioned_paths:
        candidates.append(
            Candidate(
                ReadFile(path),
                _vector(
                    situation,
                    is_read=1.0,
                    read_named_by_failure=float(path in failure.paths),
                    read_named_by_instruction=float(path in situation.instruction_paths),
                    read_already_read=float(path in situation.files),
                    read_test_file=float(is_test_path(path)),
                    read_source_of_failing_test=float(
                        not is_test_path(path)
                        and path.rsplit("/", 1)[-1].removesuffix(".py")
                        in failure.failing_test_stems
                    ),
                    read_before_tests_run=float(not situation.tests_run),
                ),
                f"read {path}",
            )
        )
    if changed:
        for path in sorted(situation.files):
            revert = edit_between(path, situation.files[path], situation.accepted[path])
            if revert is None:
                continue
            candidates.append(
                Candidate(
                    revert,
                    _vector(
                        situation,
                        is_revert=1.0,
                        revert_after_failed_test=float(situation.change_failed),
                        revert_untested=float(situation.edited_since_test),
                    ),
                    f"revert changes to {path}",
                )
            )
    candidates.extend(_edit_candidates(situation))
    if not situation.tests_run:
        # Nothing worth submitting before the tests were ever run; a step budget that ends the
        # episode still has the workspace verified, so this only drops a blind early exit.
        return candidates
    candidates.append(
        Candidate(
            Submit(),
            _vector(
                situation,
                is_submit=1.0,
                submit_tests_passed=float(situation.last_tests_passed and not changed),
                submit_never_tested=float(not situation.tests_run),
                submit_tests_failed=float(situation.tests_run and not situation.last_tests_passed),
                submit_untested_edit=float(situation.edited_since_test),
                submit_after_improvement=float(
                    situation.last_run_improved and not situation.last_tests_passed
                ),
            ),
            "submit",
        )
    )
    return candidates
