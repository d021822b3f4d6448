"""The built-in policy's bug-fix proposer: candidate actions from what the agent has seen.

The proposer reads the history the way a developer skims a failing build: how many tests fail,
which functions the failing tests exercise (the calls on pytest's `>` lines, the
`test_<function>` naming convention, the package frames of a traceback), what the failing
assertion looks like (numbers one apart, a bool, `None`, the same items in another order, an
exception, ...), and what the source files it has read contain. From that it proposes a bounded
set of actions: run the tests, read a source file, submit, and *trials* (`TryEdit`): one small
edit, then the tests, kept only if fewer tests fail. The edits are the inverses of the usual
single-token slips — flip a comparison or arithmetic operator, move an integer by one, swap
`and`/`or`, add a lost `not`, restore a lost call, fix what a `return` gives, read the variable
that is never read instead of one that is — in the functions the failures point to, plus a few
of the same edits elsewhere. It never knows which edit fixes the bug.

Each candidate gets a fixed-length feature vector (`training.builtin.features`) describing the
action and the situation; the network in `training.builtin.scorer_policy` learns from rewards
which ones pay. Features are generic —
where an edit lands relative to the failure, what kind of edit it is crossed with what the
failure looks like, whether its line was tried already — never which edit is the answer. An edit
whose result was tried and reverted is not offered again.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import io
import keyword
import re
import tokenize
from collections.abc import Iterator

from training.actions import (
    History,
    ReadFile,
    RunCommand,
    Submit,
    TryEdit,
    failing_test_count,
)
from training.builtin.edit_history import Edits, digest, edit_between, normalize_path
from training.builtin.features import FEATURE_COUNT, FEATURE_INDEX, Candidate

DEFAULT_TEST_COMMAND = "python -m pytest -q"
LIST_FILES_COMMAND = "find . -name '*.py' -not -path '*/.*' | sort"
FAST_PYTEST_ENV = "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1"
"""Prefix of the proposer's test runs: third-party pytest plugins installed next to the
interpreter cost seconds per run to import, and bytecode caches would land in the diff."""

_STEP_HORIZON = 8
"""Steps after which `step_fraction` saturates (the built-in policy gets few)."""
_MAX_FOCUSED_EDITS = 40
"""Cap on trials offered in the functions the failures point to (per file)."""
_EDITS_ELSEWHERE_PER_FILE = 3
"""Trials offered outside those functions, per source file: plausible-looking but aimed
nowhere in particular, so the policy has to learn that location matters."""

_PY_PATH = re.compile(r"(?<![\w/.-])(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py)\b")
_TRACEBACK_LOCATION = re.compile(
    r"(?:^|\s)(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py):(\d+)(?::|\b)"
    r"|File \"(?:/workspace/)?((?:[\w.-]+/)*[\w.-]+\.py)\", line (\d+)",
    re.MULTILINE,
)
_CALLED_NAME = re.compile(r"\b([A-Za-z_]\w*)\s*\(")
_SOURCE_LINE = re.compile(r"^>\s+(.*)$", re.MULTILINE)
_ERROR_LINE = re.compile(r"^E\s+(.*)$", re.MULTILINE)
_ASSERT_COMPARISON = re.compile(r"^(?:AssertionError: )?assert (.+?) == (.+)$")
_EXCEPTION_LINE = re.compile(r"^(?!AssertionError)[A-Z]\w*(?:Error|Exception)\b")
_BACKTICKED_PYTEST = re.compile(
    r"`((?:[\w.=/-]+ )*(?:\S*python\S* -m )?pytest\b[^`\n]*)`"
    r"|^(?: {4}|\t)(\S*python\S* -m pytest[^\n]*)$",
    re.MULTILINE,
)
_TEST_ID = re.compile(r"(?:[\w.-]+/)*test_\w+\.py::(test_\w+)")
_FAILED_TEST_FILE = re.compile(r"(?:FAILED |^)(?:[\w.-]+/)*test_(\w+)\.py(?:::|:\d+)", re.MULTILINE)

# The inverses of single-token slips: what the code shows -> what it may have said.
_COMPARISON_FIXES = {
    "<": ("<=", ">"),
    "<=": ("<",),
    ">": (">=", "<"),
    ">=": (">",),
    "==": ("!=",),
    "!=": ("==",),
}
_ARITHMETIC_FIXES = {
    "+": ("-", "*"),
    "-": ("+",),
    "*": ("/",),
    "//": ("%",),
    "%": ("//",),
    "+=": ("-=", "*="),
    "-=": ("+=",),
    "*=": ("/=",),
}
_LOST_CALLS = ("sorted", "abs", "str")
"""Calls a value may have lost (`sorted(x)` -> `x`); ones that took more arguments (`round`,
`min`) cannot be restored from what is left."""
_LOST_METHODS = ("lower", "upper", "strip")
_STRUCTURAL_PREFIXES = ("def ", "class ", "import ", "from ", "@", "#", "else", "try", "finally")
_SWAPPABLE_RETURN_OPS = (ast.Sub, ast.Div, ast.FloorDiv, ast.Mod)


@dataclasses.dataclass(slots=True)
class _Failure:
    """What a failing test run says, digested."""

    paths: set[str] = dataclasses.field(default_factory=set)
    traceback_lines: set[tuple[str, int]] = dataclasses.field(default_factory=set)
    called_names: set[str] = dataclasses.field(default_factory=set)
    """Functions called on the failing source lines (`>` lines) of the tracebacks."""
    failing_test_names: set[str] = dataclasses.field(default_factory=set)
    failing_test_stems: set[str] = dataclasses.field(default_factory=set)
    evidence: set[str] = dataclasses.field(default_factory=set)
    """Which of `features.EVIDENCE_KINDS` the failing assertions show."""


@dataclasses.dataclass(slots=True)
class _Situation:
    """What the history says, digested once per step."""

    instruction: str
    test_command: str
    step_count: int
    files: dict[str, str]
    """Current content of every file read (kept edits since applied)."""
    mentioned_paths: list[str]
    instruction_paths: set[str]
    failing: int | None = None
    """Failing tests now: from the instruction's list, then from each run or kept trial."""
    listed: bool = False
    tests_run: bool = False
    trials: int = 0
    trials_reverted: int = 0
    last_trial_kept: bool = False
    failure: _Failure = dataclasses.field(default_factory=_Failure)
    tried: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(path, digest of the content a trial made) of every trial that was reverted."""
    tried_lines: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(path, original line) of lines a reverted trial changed."""


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


_UNPARSED = object()


def _literal(text: str) -> object:
    try:
        return ast.literal_eval(text.strip())
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return _UNPARSED


def _compare_values(evidence: set[str], left: object, right: object) -> None:
    """Describe how an assertion's two sides differ (generic debugging hints)."""
    if left is _UNPARSED or right is _UNPARSED:
        return
    if isinstance(left, bool) or isinstance(right, bool):
        evidence.add("bool_mismatch")
    elif left is None or right is None:
        evidence.add("none_mismatch")
    elif isinstance(left, int | float) and isinstance(right, int | float):
        evidence.add("numbers_one_apart" if abs(left - right) == 1 else "numbers_further_apart")
        if left == -right or (left < 0) != (right < 0):
            evidence.add("sign_differs")
    elif type(left) is not type(right):
        evidence.add("type_differs")
    elif isinstance(left, str) and isinstance(right, str):
        if left.lower() == right.lower() or left.strip() == right.strip():
            evidence.add("case_differs")
    elif isinstance(left, list | tuple) and isinstance(right, list | tuple):
        with contextlib.suppress(TypeError):
            if sorted(left) == sorted(right):
                evidence.add("order_differs")
        if len(left) == len(right):
            for a, b in zip(left, right, strict=True):
                if a != b:
                    _compare_values(evidence, a, b)
                    break
    elif isinstance(left, dict) and isinstance(right, dict):
        lowered = {k.lower() if isinstance(k, str) else k for k in left}
        if lowered == set(right):
            evidence.add("case_differs")


def _digest_failure(output: str, previous: _Failure) -> _Failure:
    failure = _Failure()
    for match in _TRACEBACK_LOCATION.finditer(output):
        path = match.group(1) or match.group(3)
        line = match.group(2) or match.group(4)
        normalized = normalize_path(path)
        failure.paths.add(normalized)
        failure.traceback_lines.add((normalized, int(line)))
    for line in _SOURCE_LINE.findall(output):
        failure.called_names.update(_CALLED_NAME.findall(line))
    failure.failing_test_names = set(_TEST_ID.findall(output)) or previous.failing_test_names
    failure.failing_test_stems = (
        set(_FAILED_TEST_FILE.findall(output)) or previous.failing_test_stems
    )
    for line in _ERROR_LINE.findall(output):
        text = line.strip()
        compared = _ASSERT_COMPARISON.match(text)
        if compared:
            _compare_values(
                failure.evidence, _literal(compared.group(1)), _literal(compared.group(2))
            )
        elif text in ("assert False", "assert True"):
            failure.evidence.add("bool_mismatch")
        elif _EXCEPTION_LINE.match(text):
            failure.evidence.add("exception_raised")
    return failure


def _read_situation(history: History) -> _Situation:
    instruction = history.instruction
    mentioned: dict[str, None] = {}
    for match in _PY_PATH.finditer(instruction):
        mentioned[normalize_path(match.group(1))] = None
    situation = _Situation(
        instruction=instruction,
        test_command=runnable_test_command(instruction),
        step_count=history.step_count,
        files={},
        mentioned_paths=[],
        instruction_paths=set(mentioned),
    )
    listed_failures = set(_TEST_ID.findall(instruction))
    situation.failure.failing_test_names = listed_failures
    situation.failure.failing_test_stems = set(_FAILED_TEST_FILE.findall(instruction))
    if listed_failures:
        situation.failing = len(listed_failures)
    edits = Edits()
    for turn in history.turns:
        action, observation = turn.action, turn.observation
        if isinstance(action, RunCommand):
            for match in _PY_PATH.finditer(observation.text):
                mentioned[normalize_path(match.group(1))] = None
            if action.command == LIST_FILES_COMMAND:
                situation.listed = True
            if "pytest" in action.command:
                situation.tests_run = True
                situation.failing = failing_test_count(observation.text, observation.exit_code)
                situation.failure = _digest_failure(observation.text, situation.failure)
        # A kept trial on a file the agent knows also reports the tests it ran.
        elif (
            edits.record(action, observation)
            and isinstance(action, TryEdit)
            and edits.last_trial_kept
        ):
            situation.failing = failing_test_count(observation.text, observation.exit_code)
            situation.failure = _digest_failure(observation.text, situation.failure)
    situation.files = edits.files
    situation.trials, situation.trials_reverted = edits.trials, edits.reverted
    situation.last_trial_kept = edits.last_trial_kept
    situation.tried, situation.tried_lines = edits.tried, edits.tried_lines
    situation.mentioned_paths = list(mentioned)
    return situation


# -- edits --------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class _Function:
    name: str
    first_line: int
    """First line of the body (after the docstring)."""
    last_line: int
    local_names: tuple[str, ...]
    reads: tuple[tuple[int, int, int, str], ...]
    """(line, start column, end column, name) of every read of a local."""
    never_read: frozenset[str]
    """Locals (parameters included) that nothing in the function reads."""


def _functions(source: str) -> list[_Function]:
    """Functions of `source` with their body spans and locals; [] when it does not parse (a
    capped read), in which case no edits are proposed in it."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    functions = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        body = node.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # the docstring
        if not body:
            continue
        names: dict[str, None] = {}
        for argument in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
            names[argument.arg] = None
        for inner in ast.walk(node):
            if isinstance(inner, ast.Name) and isinstance(inner.ctx, ast.Store):
                names[inner.id] = None
        local_names = tuple(n for n in names if not n.startswith("_"))
        reads = tuple(
            sorted(
                (inner.lineno, inner.col_offset, inner.end_col_offset or inner.col_offset, inner.id)
                for inner in ast.walk(node)
                if isinstance(inner, ast.Name)
                and isinstance(inner.ctx, ast.Load)
                and inner.id in local_names
                and inner.lineno == inner.end_lineno
            )
        )
        read_names = {read[3] for read in reads}
        functions.append(
            _Function(
                node.name,
                body[0].lineno,
                node.end_lineno or node.lineno,
                local_names,
                reads,
                frozenset(n for n in local_names if n not in read_names),
            )
        )
    return functions


_Mutation = tuple[str, str, str, dict[str, float]]
"""(kind, description, new line, extra features)."""


def _name_swaps(line: str, line_number: int, function: _Function) -> Iterator[_Mutation]:
    """Reads of a variable changed to another local: to a local nothing reads (the one a slip
    would have left unused), or, when there is none, to another name read on the same line."""
    on_line = [read for read in function.reads if read[0] == line_number]
    counts: dict[str, int] = {}
    for read in on_line:
        counts[read[3]] = counts.get(read[3], 0) + 1
    targets = sorted(function.never_read) or sorted(counts)
    for _, start, end, name in on_line:
        for other in targets:
            if other == name:
                continue
            yield (
                "wrong_variable",
                f"{name!r}->{other!r}",
                line[:start] + other + line[end:],
                {
                    "edit_name_never_read": float(other in function.never_read),
                    "edit_name_repeated_on_line": float(counts[name] > 1),
                },
            )


def _line_mutations(line: str) -> Iterator[_Mutation]:
    """Token-level inverses of slips on one source line."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return
    tokens = [t for t in tokens if t.start[0] == 1 and t.end[0] == 1 and t.string.strip()]
    sibling_calls = _sibling_calls(tokens)
    for position, token in enumerate(tokens):
        previous = tokens[position - 1] if position else None
        following = tokens[position + 1] if position + 1 < len(tokens) else None
        start, end = token.start[1], token.end[1]

        def replaced(text: str, start: int = start, end: int = end) -> str:
            return line[:start] + text + line[end:]

        string = token.string
        if token.type == tokenize.OP:
            if string in _COMPARISON_FIXES:
                for other in _COMPARISON_FIXES[string]:
                    yield "comparison", f"{string!r}->{other!r}", replaced(other), {}
            elif string in _ARITHMETIC_FIXES:
                operand_before = previous is not None and (
                    previous.type in (tokenize.NAME, tokenize.NUMBER, tokenize.STRING)
                    or previous.string in (")", "]", "}")
                )
                if string in ("+", "-") and not operand_before:
                    continue  # a sign, not an operator
                for other in _ARITHMETIC_FIXES[string]:
                    yield "arithmetic", f"{string!r}->{other!r}", replaced(other), {}
            elif string == "]" and following is not None and following.string in (")", ","):
                for method in _LOST_METHODS:
                    yield "missing_call", f"add .{method}()", replaced(f"].{method}()"), {}
        elif token.type == tokenize.NUMBER and string.isdigit():
            value = int(string)
            yield "off_by_one", f"{value}->{value + 1}", replaced(str(value + 1)), {}
            if value > 0:
                yield "off_by_one", f"{value}->{value - 1}", replaced(str(value - 1)), {}
        elif token.type == tokenize.NAME:
            before = previous.string if previous is not None else ""
            after = following.string if following is not None else ""
            if string in ("and", "or"):
                other = "or" if string == "and" else "and"
                yield "boolean", f"{string!r}->{other!r}", replaced(other), {}
            elif string in ("True", "False") and before == "return":
                other = "False" if string == "True" else "True"
                yield "return_value", f"{string!r}->{other!r}", replaced(other), {}
            elif string == "not" and after == "in":
                cut_end = end + 1 if line[end : end + 1] == " " else end
                yield "comparison", "'not in'->'in'", line[:start] + line[cut_end:], {}
            elif string == "in" and before != "not" and tokens[0].string != "for":
                yield "comparison", "'in'->'not in'", replaced("not in"), {}
            elif string in ("if", "elif", "while") and after != "not":
                yield "boolean", f"add 'not' after {string!r}", replaced(f"{string} not"), {}
            elif (
                before in ("(", ",")
                and after in (")", ",")
                and string in sibling_calls.get(position, {})
            ):
                # a bare argument next to wrapped ones (`(min(xs), ys)`) may have lost its call
                for call in sibling_calls[position][string]:
                    yield "missing_call", f"add {call}(...)", replaced(f"{call}({string})"), {}
            elif (
                before in ("=", "return", "in") and after in ("", ":") and not keyword_like(string)
            ):
                # a whole value assigned, returned or iterated over may have lost a call
                for call in _LOST_CALLS:
                    yield "missing_call", f"add {call}(...)", replaced(f"{call}({string})"), {}
                for method in _LOST_METHODS:
                    yield "missing_call", f"add .{method}()", replaced(f"{string}.{method}()"), {}
    yield from _return_mutations(line)


def _sibling_calls(tokens: list[tokenize.TokenInfo]) -> dict[int, dict[str, tuple[str, ...]]]:
    """For each bare name argument (position -> name), the single-argument calls wrapping other
    arguments on the line (`min`, `max`, `sorted`, ...)."""
    calls = {
        tokens[i - 1].string
        for i in range(1, len(tokens) - 2)
        if tokens[i].string == "("
        and tokens[i - 1].type == tokenize.NAME
        and tokens[i + 1].type == tokenize.NAME
        and tokens[i + 2].string == ")"
    }
    calls &= {"min", "max", "sorted", "abs", "str", "len", "sum", "list", "reversed"}
    if not calls:
        return {}
    return {
        i: {tokens[i].string: tuple(sorted(calls))}
        for i in range(1, len(tokens) - 1)
        if tokens[i].type == tokenize.NAME
        and tokens[i - 1].string in ("(", ",")
        and tokens[i + 1].string in (")", ",")
        and not (
            i >= 2
            and tokens[i - 1].string == "("
            and tokens[i - 2].type == tokenize.NAME
            and not keyword.iskeyword(tokens[i - 2].string)
        )
    }


def keyword_like(name: str) -> bool:
    return name in ("None", "True", "False", "not", "lambda", "await", "yield")


def _return_mutations(line: str) -> Iterator[_Mutation]:
    """Changes of what a `return` line returns: swap the operands of a non-commutative operator,
    `None` for `0` and back."""
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
        yield "return_value", "swap operands", f"{indent}return {ast.unparse(swapped)}", {}
    elif isinstance(value, ast.Constant) and type(value.value) in (int, float):
        yield "return_value", f"{value.value!r}->None", f"{indent}return None", {}
    elif isinstance(value, ast.Constant) and value.value is None:
        yield "return_value", "None->0", f"{indent}return 0", {}


# -- features -----------------------------------------------------------------------------------


def _vector(situation: _Situation, **active: float) -> tuple[float, ...]:
    values = [0.0] * FEATURE_COUNT
    values[FEATURE_INDEX["tests_run"]] = float(situation.tests_run)
    values[FEATURE_INDEX["step_fraction"]] = min(situation.step_count / _STEP_HORIZON, 1.0)
    values[FEATURE_INDEX["trials_reverted_scaled"]] = min(situation.trials_reverted / 4.0, 1.0)
    values[FEATURE_INDEX["last_trial_kept"]] = float(situation.last_trial_kept)
    for name, value in active.items():
        values[FEATURE_INDEX[name]] = value
    return tuple(values)


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
    return digest(key)


def _edit_candidates(situation: _Situation) -> Iterator[Candidate]:
    failure, failing = situation.failure, situation.failing
    if failing is None:
        return  # without a count to beat, a trial cannot tell whether it helped
    evidence = failure.evidence or {"no_evidence"}
    for path in sorted(situation.files):
        if not path.endswith(".py") or is_test_path(path):
            continue  # tests are restored before grading: editing them never pays
        current = situation.files[path]
        lines = current.split("\n")
        functions = _functions(current)
        pointed = _failing_functions(situation, path, functions)
        focused: list[Candidate] = []
        elsewhere: list[Candidate] = []
        seen: set[str] = set()
        for index, line in enumerate(lines):
            stripped = line.strip()
            if not stripped or stripped.startswith(_STRUCTURAL_PREFIXES):
                continue
            line_number = index + 1
            enclosing = [f for f in functions if f.first_line <= line_number <= f.last_line]
            if not enclosing:
                continue  # module level or a docstring: nothing a slip hides in here
            function = enclosing[-1]
            in_failing = function.name in pointed
            mutations = [*_line_mutations(line), *_name_swaps(line, line_number, function)]
            for kind, description, new_line, extra in mutations:
                target = "\n".join([*lines[:index], new_line, *lines[index + 1 :]])
                if target in seen or target == current:
                    continue
                if (path, digest(target)) in situation.tried:
                    # The same file content was tried and reverted: the tests would fail the
                    # same way again (they are deterministic; the verifier's flakiness check
                    # admits only such tasks), so a second try is a wasted step.
                    continue
                seen.add(target)
                edit = edit_between(path, current, target)
                if edit is None:
                    continue
                features = _vector(
                    situation,
                    is_try_edit=1.0,
                    edit_in_failing_function=float(in_failing),
                    edit_line_in_traceback=float((path, line_number) in failure.traceback_lines),
                    edit_line_tried_before=float((path, line) in situation.tried_lines),
                    **extra,
                    **{f"edit_kind_{kind}": 1.0},
                    **{f"{kind}_given_{name}": 1.0 for name in evidence},
                )
                action = TryEdit(
                    edit.path, edit.old_text, edit.new_text, situation.test_command, failing
                )
                label = f"try {path}:{line_number} {kind} {description}"
                (focused if in_failing else elsewhere).append(Candidate(action, features, label))
        yield from focused[:_MAX_FOCUSED_EDITS]
        chosen = sorted(elsewhere, key=lambda c: _rank(c.label))[:_EDITS_ELSEWHERE_PER_FILE]
        yield from sorted(chosen, key=elsewhere.index)


def propose(history: History) -> list[Candidate]:
    """Every action worth considering after `history` on a bug-fix task, with its features.

    Deterministic: the same history gives the same candidates in the same order (the trainer
    and the tests rely on it). Never empty. Once the tests pass, submitting is all that is
    left; before then it is offered once the tests have run or a trial was made."""
    situation = _read_situation(history)
    failure = situation.failure
    submit = Candidate(
        Submit(),
        _vector(
            situation,
            is_submit=1.0,
            submit_tests_failing=float(situation.failing != 0),
            submit_before_any_trial=float(situation.trials == 0),
        ),
        "submit",
    )
    if situation.failing == 0 and (situation.tests_run or situation.trials):
        return [submit]
    candidates = []
    if not situation.tests_run:
        candidates.append(
            Candidate(
                RunCommand(situation.test_command),
                _vector(situation, is_run_tests=1.0, run_tests_never_run=1.0),
                "run tests",
            )
        )
    sources = [p for p in situation.mentioned_paths if p.endswith(".py") and not is_test_path(p)]
    if not sources and not situation.listed:
        candidates.append(
            Candidate(
                RunCommand(LIST_FILES_COMMAND), _vector(situation, is_list_files=1.0), "list files"
            )
        )
    for path in sources:
        if path in situation.files:
            continue  # the proposer keeps track of its own edits: a second read adds nothing
        stem = path.rsplit("/", 1)[-1].removesuffix(".py")
        candidates.append(
            Candidate(
                ReadFile(path),
                _vector(
                    situation,
                    is_read=1.0,
                    read_named_by_failure=float(path in failure.paths),
                    read_source_of_failing_test=float(stem in failure.failing_test_stems),
                ),
                f"read {path}",
            )
        )
    candidates.extend(_edit_candidates(situation))
    if situation.tests_run or situation.trials:
        candidates.append(submit)
    if not candidates:
        candidates.append(submit)
    return candidates
