"""Candidate actions for the built-in policy, proposed from what the agent has seen, with features.

The proposer reads the history the way a developer skims a failing build: which tests failed,
which files and lines the traceback names, which functions the failing assertions call, what
the files it has read contain. From that it proposes every action worth considering — run the
tests, list files, read a file, submit, undo the last edit, and edits made by small mutations of
source lines (flip a comparison or arithmetic operator, move a constant by one, swap `and`/`or`,
drop a `not`, use another local variable, delete the line). It proposes plausible *and*
implausible edits everywhere it can see code, test files included; it never knows which one
fixes the bug. Each candidate gets a fixed-length feature vector describing the action and the
situation; the network in `training.scorer_policy` learns from rewards which ones pay.
"""

from __future__ import annotations

import ast
import dataclasses
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

MUTATION_KINDS = (
    "comparison",
    "arithmetic",
    "off_by_one",
    "boolean",
    "wrong_variable",
    "missing_call",
    "return_value",
    "delete_line",
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
    "edit_in_instruction_function",
    "edit_before_tests_run",
    "edit_stacked_untested",
    "edit_already_tried",
    "edit_line_edited_before",
    "edit_structural_line",
    # what an edit does (one-hot over MUTATION_KINDS)
    *(f"edit_kind_{kind}" for kind in MUTATION_KINDS),
    # what the failure looks like, crossed with the kind of edit
    "off_by_one_and_numbers_differ_by_one",
    "boolean_and_bool_mismatch",
    "comparison_and_bool_mismatch",
    # undoing the last edit
    "revert_after_failed_test",
    "revert_after_passed_test",
    "revert_untested",
    # progress
    "step_fraction",
    "edits_applied_scaled",
)
FEATURE_COUNT = len(FEATURE_NAMES)
_FEATURE_INDEX = {name: index for index, name in enumerate(FEATURE_NAMES)}

_STEP_HORIZON = 16
"""Steps after which `step_fraction` saturates (policies rarely get more)."""
_MAX_EDITS_PER_FILE = 160
"""Cap on edit candidates per file, so a large file cannot crowd out every other action."""

_PY_PATH = re.compile(r"(?<![\w/.-])(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py)\b")
_TRACEBACK_LOCATION = re.compile(
    r"(?:^|\s)(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py):(\d+)(?::|\b)"
    r"|File \"(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py)\", line (\d+)",
    re.MULTILINE,
)
_IDENTIFIER = re.compile(r"\b[A-Za-z_]\w*\b")
_ASSERT_NUMBERS = re.compile(r"assert (-?\d+(?:\.\d+)?) == (-?\d+(?:\.\d+)?)")
_ASSERT_BOOLS = re.compile(r"assert (True|False) == (True|False)|assert (?:not )?(True|False)\b")
_BACKTICKED_PYTEST = re.compile(
    r"`([^`\n]*pytest[^`\n]*)`|^(?: {4}|\t)(\S*python\S* -m pytest[^\n]*)$", re.MULTILINE
)
_FAILED_TEST_FILE = re.compile(r"(?:FAILED |^)(?:[\w.-]+/)*test_(\w+)\.py(?:::|:\d+)", re.MULTILINE)

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
    "+=": ("-=",),
    "-=": ("+=",),
}
_BOOLEAN_SWAPS = {"and": ("or",), "or": ("and",), "True": ("False",), "False": ("True",)}
_STRUCTURAL_PREFIXES = ("def ", "class ", "import ", "from ", "@", "#")
_WRAPPING_CALLS = ("abs", "sorted", "round", "str", "list", "max", "min", "reversed")
_WRAPPING_METHODS = ("lower", "upper", "strip", "copy")
_SWAPPABLE_RETURN_OPS = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod)


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One action the policy may take, and its features."""

    action: Action
    features: tuple[float, ...]
    label: str
    """Short description for logs ("edit calc.py:12 comparison '<'->'<='")."""


@dataclasses.dataclass(slots=True)
class _AppliedEdit:
    edit: EditFile
    tested_after: bool = False
    reverted: bool = False


@dataclasses.dataclass(slots=True)
class _Situation:
    """What the history says, digested once per step."""

    instruction: str
    test_command: str
    step_count: int
    files: dict[str, str]
    mentioned_paths: list[str]
    instruction_paths: set[str]
    listed: bool
    tests_run: bool
    last_tests_passed: bool
    edited_since_test: bool
    failure_paths: set[str]
    traceback_lines: set[tuple[str, int]]
    failure_identifiers: set[str]
    failing_test_stems: set[str]
    instruction_identifiers: set[str]
    numbers_differ_by_one: bool
    bool_mismatch: bool
    applied: list[_AppliedEdit]
    tried: set[EditFile]
    edited_lines: set[tuple[str, str]]


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


def _normalize_path(path: str) -> str:
    path = path.removeprefix("/workspace/")
    while path.startswith("./"):
        path = path[2:]
    return path


def _read_situation(history: History) -> _Situation:
    instruction = history.instruction
    test_command = find_test_command(instruction)
    files: dict[str, str] = {}
    mentioned: dict[str, None] = {}
    for match in _PY_PATH.finditer(instruction):
        mentioned[_normalize_path(match.group(1))] = None
    instruction_paths = set(mentioned)
    situation = _Situation(
        instruction=instruction,
        test_command=test_command,
        step_count=history.step_count,
        files=files,
        mentioned_paths=[],
        instruction_paths=instruction_paths,
        listed=False,
        tests_run=False,
        last_tests_passed=False,
        edited_since_test=False,
        failure_paths=set(),
        traceback_lines=set(),
        failure_identifiers=set(),
        failing_test_stems=set(_FAILED_TEST_FILE.findall(instruction)),
        instruction_identifiers=set(_IDENTIFIER.findall(instruction)),
        numbers_differ_by_one=False,
        bool_mismatch=False,
        applied=[],
        tried=set(),
        edited_lines=set(),
    )
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
            files[_normalize_path(action.path)] = observation.text
        elif isinstance(action, EditFile) and observation.exit_code == 0:
            path = _normalize_path(action.path)
            if path in files:
                files[path] = files[path].replace(action.old_text, action.new_text, 1)
            situation.edited_since_test = True
            situation.edited_lines.add((path, action.new_text))
            last = situation.applied[-1] if situation.applied else None
            if (
                last is not None
                and not last.reverted
                and action.path == last.edit.path
                and action.old_text == last.edit.new_text
                and action.new_text == last.edit.old_text
            ):
                last.reverted = True
            else:
                situation.applied.append(_AppliedEdit(action))
                situation.tried.add(action)
    situation.mentioned_paths = list(mentioned)
    return situation


def _digest_test_run(situation: _Situation, output: str, exit_code: int | None) -> None:
    situation.tests_run = True
    situation.last_tests_passed = exit_code == 0
    situation.edited_since_test = False
    for applied in situation.applied:
        applied.tested_after = True
    situation.failure_paths = set()
    situation.traceback_lines = set()
    situation.failure_identifiers = set()
    situation.numbers_differ_by_one = False
    situation.bool_mismatch = False
    if exit_code == 0:
        return
    for match in _TRACEBACK_LOCATION.finditer(output):
        path = match.group(1) or match.group(3)
        line = match.group(2) or match.group(4)
        normalized = _normalize_path(path)
        situation.failure_paths.add(normalized)
        situation.traceback_lines.add((normalized, int(line)))
    situation.failure_identifiers = set(_IDENTIFIER.findall(output))
    situation.failing_test_stems = set(_FAILED_TEST_FILE.findall(output))
    for left, right in _ASSERT_NUMBERS.findall(output):
        if abs(float(left) - float(right)) == 1:
            situation.numbers_differ_by_one = True
    situation.bool_mismatch = bool(_ASSERT_BOOLS.search(output))


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
    previous: tokenize.TokenInfo | None = None
    for token in tokens:
        if token.start[0] != 1 or token.end[0] != 1:
            previous = token
            continue
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
                    previous = token
                    continue  # a sign, not an operator
                for other in _ARITHMETIC_SWAPS[string]:
                    yield "arithmetic", f"{string!r}->{other!r}", replaced(other)
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
                for other in _BOOLEAN_SWAPS[string]:
                    yield "boolean", f"{string!r}->{other!r}", replaced(other)
            elif string == "not":
                cut_end = end + 1 if line[end : end + 1] == " " else end
                kind = "comparison" if line[cut_end:].startswith("in ") else "boolean"
                yield kind, "drop 'not'", line[:start] + line[cut_end:]
            elif string == "in" and (previous is None or previous.string != "not"):
                yield "comparison", "'in'->'not in'", replaced("not in")
            elif string in ("if", "while", "return") and line[end : end + 1] == " ":
                after = end + 1
                if not line[after:].startswith("not "):
                    yield (
                        "boolean",
                        f"add 'not' after {string!r}",
                        line[:after] + "not " + line[after:],
                    )
            elif string in local_names and (previous is None or previous.string != "."):
                rest_of_line = line[end:].lstrip()
                # only names that are read: not calls, not assignment targets, not parameters
                is_target = rest_of_line.startswith(("=", ",")) and not rest_of_line.startswith(
                    "=="
                )
                if (
                    not rest_of_line.startswith("(")
                    and not is_target
                    and not line.lstrip().startswith("def ")
                ):
                    for other in local_names:
                        if other != string:
                            yield "wrong_variable", f"{string!r}->{other!r}", replaced(other)
        elif (
            token.type == tokenize.OP
            and string == "("
            and not (
                previous is not None
                and (
                    (
                        previous.type == tokenize.NAME
                        and previous.string not in _KEYWORDS_BEFORE_PAREN
                    )
                    or previous.string in (")", "]")
                )
            )
        ):
            # a bare parenthesized expression may have lost the call around it
            for call in _WRAPPING_CALLS:
                yield "missing_call", f"add {call}(...)", line[:start] + call + line[start:]
        previous = token
    yield from _return_mutations(line)
    stripped = line.strip()
    if stripped and not stripped.startswith(_STRUCTURAL_PREFIXES) and not stripped.endswith(":"):
        yield "delete_line", "delete line", ""


_KEYWORDS_BEFORE_PAREN = frozenset(
    {"return", "in", "and", "or", "not", "if", "elif", "while", "yield", "else", "for"}
)


def _return_mutations(line: str) -> Iterator[tuple[str, str, str]]:
    """Changes of what a `return` line returns: wrap it in a call or method, swap the operands of
    a non-commutative operator, `0` for `None`."""
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
    expression = stripped[len("return ") :]
    if isinstance(value, ast.Name):
        for call in _WRAPPING_CALLS:
            yield "missing_call", f"return {call}(...)", f"{indent}return {call}({expression})"
        for method in _WRAPPING_METHODS:
            yield (
                "missing_call",
                f"return ....{method}()",
                f"{indent}return {expression}.{method}()",
            )
    elif isinstance(value, ast.BinOp) and isinstance(value.op, _SWAPPABLE_RETURN_OPS):
        swapped = ast.BinOp(value.right, value.op, value.left)
        yield "return_value", "swap operands", f"{indent}return {ast.unparse(swapped)}"
    elif isinstance(value, ast.Constant) and value.value == 0 and value.value is not False:
        yield "return_value", "0->None", f"{indent}return None"


def _unique_old_text(source: str, lines: list[str], index: int) -> str | None:
    """The shortest text around line `index` that occurs once in `source` (the edit anchor)."""
    for extra in range(3):
        text = "\n".join(lines[index : index + 1 + extra])
        if index + extra >= len(lines):
            return None
        if source.count(text) == 1:
            return text
    return None


# -- features -----------------------------------------------------------------------------------


def _vector(situation: _Situation, **active: float) -> tuple[float, ...]:
    values = [0.0] * FEATURE_COUNT
    values[_FEATURE_INDEX["step_fraction"]] = min(situation.step_count / _STEP_HORIZON, 1.0)
    live_edits = sum(1 for applied in situation.applied if not applied.reverted)
    values[_FEATURE_INDEX["edits_applied_scaled"]] = min(live_edits / 3.0, 1.0)
    for name, value in active.items():
        values[_FEATURE_INDEX[name]] = value
    return tuple(values)


def _edit_candidates(situation: _Situation) -> Iterator[Candidate]:
    for path, source in situation.files.items():
        if not path.endswith(".py"):
            continue
        lines = source.split("\n")
        functions = _functions(source)
        test_file = is_test_path(path)
        produced = 0
        for index, line in enumerate(lines):
            line_number = index + 1
            enclosing = [f for f in functions if f.first_line <= line_number <= f.last_line]
            function = enclosing[-1] if enclosing else None
            local_names = function.local_names if function else ()
            old_text = None
            for kind, description, new_line in _line_mutations(line, local_names):
                if old_text is None:
                    old_text = _unique_old_text(source, lines, index)
                    if old_text is None:
                        break
                new_text = old_text.replace(line, new_line, 1) if new_line else None
                if new_text is None:
                    # deleting the line: drop it together with its newline
                    rest = old_text.split("\n", 1)
                    new_text = rest[1] if len(rest) > 1 else ""
                edit = EditFile(path, old_text, new_text)
                in_failing = function is not None and function.name in situation.failure_identifiers
                in_instruction = (
                    function is not None and function.name in situation.instruction_identifiers
                )
                features = _vector(
                    situation,
                    is_edit=1.0,
                    edit_test_file=float(test_file),
                    edit_line_in_traceback=float((path, line_number) in situation.traceback_lines),
                    edit_in_failing_function=float(in_failing and not test_file),
                    edit_in_instruction_function=float(in_instruction and not test_file),
                    edit_before_tests_run=float(not situation.tests_run),
                    edit_stacked_untested=float(situation.edited_since_test),
                    edit_already_tried=float(edit in situation.tried),
                    edit_line_edited_before=float((path, old_text) in situation.edited_lines),
                    edit_structural_line=float(line.strip().startswith(_STRUCTURAL_PREFIXES)),
                    **{f"edit_kind_{kind}": 1.0},
                    off_by_one_and_numbers_differ_by_one=float(
                        kind == "off_by_one" and situation.numbers_differ_by_one
                    ),
                    boolean_and_bool_mismatch=float(kind == "boolean" and situation.bool_mismatch),
                    comparison_and_bool_mismatch=float(
                        kind == "comparison" and situation.bool_mismatch
                    ),
                )
                yield Candidate(edit, features, f"edit {path}:{line_number} {kind} {description}")
                produced += 1
                if produced >= _MAX_EDITS_PER_FILE:
                    break
            if produced >= _MAX_EDITS_PER_FILE:
                break


def propose_candidates(history: History) -> list[Candidate]:
    """Every action worth considering after `history`, each with its feature vector.

    Deterministic: the same history gives the same candidates in the same order (the trainer
    and the tests rely on it). Never empty: submitting is always possible."""
    situation = _read_situation(history)
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
                    read_named_by_failure=float(path in situation.failure_paths),
                    read_named_by_instruction=float(path in situation.instruction_paths),
                    read_already_read=float(path in situation.files),
                    read_test_file=float(is_test_path(path)),
                    read_source_of_failing_test=float(
                        not is_test_path(path)
                        and path.rsplit("/", 1)[-1].removesuffix(".py")
                        in situation.failing_test_stems
                    ),
                    read_before_tests_run=float(not situation.tests_run),
                ),
                f"read {path}",
            )
        )
    live = [applied for applied in situation.applied if not applied.reverted]
    if live:
        last = live[-1].edit
        tested = live[-1].tested_after
        candidates.append(
            Candidate(
                EditFile(last.path, last.new_text, last.old_text),
                _vector(
                    situation,
                    is_revert=1.0,
                    revert_after_failed_test=float(tested and not situation.last_tests_passed),
                    revert_after_passed_test=float(tested and situation.last_tests_passed),
                    revert_untested=float(not tested),
                ),
                f"revert last edit of {last.path}",
            )
        )
    candidates.extend(_edit_candidates(situation))
    candidates.append(
        Candidate(
            Submit(),
            _vector(
                situation,
                is_submit=1.0,
                submit_tests_passed=float(situation.tests_run and situation.last_tests_passed),
                submit_never_tested=float(not situation.tests_run),
                submit_tests_failed=float(situation.tests_run and not situation.last_tests_passed),
                submit_untested_edit=float(situation.edited_since_test),
            ),
            "submit",
        )
    )
    return candidates
