"""AST mutation operators over real modules: each mutation is one exact byte-span edit whose
re-parse yields exactly the intended tree, so the module's layout stays as written and the
reverse edit is the fix.

The demo family's operators (comparison, arithmetic, boundary, boolean, return_value,
wrong_variable, missing_call) are reused as they are; this module adds the kinds real code needs
(identity tests, negated conditions, dropped raises, swapped arguments, break/continue, lost
accumulation) and handles methods, nested functions and non-ASCII sources.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import hashlib
import warnings
from collections.abc import Iterator

from tasks_lib.sources.families.demo.mutate import OPERATORS as DEMO_OPERATORS
from tasks_lib.sources.families.demo.mutate import node_variants as demo_variants

EXTRA_OPERATORS = (
    "identity",
    "negated_condition",
    "missing_raise",
    "swapped_arguments",
    "break_continue",
    "lost_accumulation",
)
OPERATORS = (*DEMO_OPERATORS, *EXTRA_OPERATORS)
"""Every mutation kind synthesis draws from (13)."""

FunctionNode = ast.FunctionDef | ast.AsyncFunctionDef


@dataclasses.dataclass(frozen=True, slots=True)
class SourceMutation:
    """One edit of one file: bytes `start:end` of the original become `replacement`."""

    operator: str
    path: str
    """Workspace-relative POSIX path of the module."""
    function: str
    """Qualified name of the enclosing function (`Class.method`)."""
    line: int
    start: int
    end: int
    original: str
    replacement: str

    def apply(self, source: bytes) -> bytes:
        return source[: self.start] + self.replacement.encode() + source[self.end :]

    @property
    def key(self) -> str:
        """Stable short id of this edit (for task ids and ordering)."""
        text = f"{self.path}:{self.start}:{self.end}:{self.replacement}"
        return hashlib.sha256(text.encode()).hexdigest()[:10]

    def describe(self) -> str:
        return (
            f"{self.path} {self.function} line {self.line} ({self.operator}): "
            f"{self.original!r} -> {self.replacement!r}"
        )


@dataclasses.dataclass(frozen=True, slots=True)
class _Site:
    """A mutation found by the walk, not yet turned into (and checked as) a text edit."""

    operator: str
    function: str
    node: ast.AST
    replacement: ast.AST | None
    """None: the statement is removed (replaced by `pass`)."""


def _extra_variants(node: ast.AST) -> Iterator[tuple[str, ast.AST | _TestEdit | None]]:
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            swap = {ast.Is: ast.IsNot, ast.IsNot: ast.Is}.get(type(op))
            if swap is not None:
                compare = copy.deepcopy(node)
                compare.ops[index] = swap()
                yield "identity", compare
    elif isinstance(node, ast.If | ast.While) and not (
        isinstance(node.test, ast.Constant)  # `while True:` loops forever when negated
    ):
        mutated_test: ast.AST
        if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not):
            return  # the demo's boolean operator already drops a `not`
        mutated_test = ast.UnaryOp(ast.Not(), copy.deepcopy(node.test))
        # Only the test expression is replaced, not the whole statement.
        yield "negated_condition", _TestEdit(node.test, mutated_test)
    elif isinstance(node, ast.Raise) and node.exc is not None:
        yield "missing_raise", None
    elif (
        isinstance(node, ast.Call)
        and len(node.args) >= 2
        and not any(isinstance(arg, ast.Starred) for arg in node.args[:2])
        and ast.dump(node.args[0]) != ast.dump(node.args[1])
    ):
        call = copy.deepcopy(node)
        call.args[0], call.args[1] = call.args[1], call.args[0]
        yield "swapped_arguments", call
    elif isinstance(node, ast.Break):
        yield "break_continue", ast.Continue()
    elif isinstance(node, ast.Continue):
        yield "break_continue", ast.Break()
    elif isinstance(node, ast.AugAssign) and isinstance(node.op, ast.Add | ast.Sub | ast.Mult):
        assign = ast.Assign([copy.deepcopy(node.target)], copy.deepcopy(node.value))
        yield "lost_accumulation", ast.copy_location(assign, node)


@dataclasses.dataclass(frozen=True, slots=True)
class _TestEdit:
    """Marker: replace `target` (a sub-node) rather than the node the walk is at."""

    target: ast.AST
    replacement: ast.AST


def _parse(source: bytes) -> ast.Module:
    # Real projects carry invalid escape sequences and the like: their warnings are not ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ast.parse(source)


def _is_stub(function: FunctionNode) -> bool:
    body = _body(function)
    if not body:
        return True
    if len(body) == 1:
        only = body[0]
        if isinstance(only, ast.Pass) or (
            isinstance(only, ast.Expr) and isinstance(only.value, ast.Constant)
        ):
            return True
        if isinstance(only, ast.Raise) and "NotImplementedError" in ast.dump(only):
            return True
    return False


def _body(function: FunctionNode) -> list[ast.stmt]:
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        return body[1:]  # never mutate the docstring
    return body


def _functions(tree: ast.Module) -> Iterator[tuple[str, FunctionNode]]:
    def walk(nodes: list[ast.stmt], prefix: str) -> Iterator[tuple[str, FunctionNode]]:
        for node in nodes:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{prefix}{node.name}", node
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.ClassDef):
                yield from walk(node.body, f"{prefix}{node.name}.")
            elif isinstance(node, ast.If | ast.Try | ast.With):
                yield from walk([*node.body, *getattr(node, "orelse", [])], prefix)

    yield from walk(tree.body, "")


def _own_nodes(function: FunctionNode) -> Iterator[ast.AST]:
    """Nodes of `function`'s body, not descending into nested functions or classes (they are
    visited as functions of their own)."""
    stack: list[ast.AST] = list(reversed(_body(function)))
    while stack:
        node = stack.pop()
        yield node
        children = [
            child
            for child in ast.iter_child_nodes(node)
            if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        ]
        stack.extend(reversed(children))


def find_sites(tree: ast.Module) -> list[_Site]:
    """Every candidate mutation of the module's functions, in source order."""
    sites: list[_Site] = []
    for name, function in _functions(tree):
        if _is_stub(function):
            continue
        assert isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef)
        for node in _own_nodes(function):
            if not hasattr(node, "lineno"):
                continue
            if isinstance(node, ast.JoinedStr | ast.FormattedValue):
                continue  # f-string internals have unreliable spans
            # The demo operators expect a plain function; they only read its argument names.
            for operator, replacement in demo_variants(node, function):  # type: ignore[arg-type]
                sites.append(_Site(operator, name, node, replacement))
            for operator, extra in _extra_variants(node):
                if isinstance(extra, _TestEdit):
                    sites.append(_Site(operator, name, extra.target, extra.replacement))
                else:
                    sites.append(_Site(operator, name, node, extra))
    return sites


class ModuleMutator:
    """Turns sites of one module into checked byte edits (lazily: checking costs a parse)."""

    def __init__(self, path: str, source: bytes) -> None:
        self.path = path
        self.source = source
        self.tree = _parse(source)
        self.sites = find_sites(self.tree)
        self._line_starts = [0]
        for line in source.splitlines(keepends=True):
            self._line_starts.append(self._line_starts[-1] + len(line))
        self._parents: dict[int, tuple[ast.AST, str, int | None]] = {}
        for parent in ast.walk(self.tree):
            for field, value in ast.iter_fields(parent):
                if isinstance(value, ast.AST):
                    self._parents[id(value)] = (parent, field, None)
                elif isinstance(value, list):
                    for index, item in enumerate(value):
                        if isinstance(item, ast.AST):
                            self._parents[id(item)] = (parent, field, index)
        self._wanted_cache: dict[int, str] = {}

    def _span(self, node: ast.AST) -> tuple[int, int]:
        # ast offsets are UTF-8 byte columns, which is why edits work on bytes.
        start = self._line_starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
        end = self._line_starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
        return start, end

    def _swap(self, node: ast.AST, new: ast.AST) -> None:
        parent, field, index = self._parents[id(node)]
        if index is None:
            setattr(parent, field, new)
        else:
            getattr(parent, field)[index] = new

    def edit(self, site: _Site) -> SourceMutation | None:
        """The site as a text edit, or None when no edit of its span parses to the intended
        tree (operator precedence, layout the unparser cannot reproduce)."""
        node = site.node
        if id(node) not in self._parents:
            return None
        new_node: ast.AST = site.replacement if site.replacement is not None else ast.Pass()
        self._swap(node, new_node)
        try:
            wanted = ast.dump(self.tree)
        finally:
            self._swap(node, node)
        start, end = self._span(node)
        original = self.source[start:end].decode("utf-8", errors="replace")
        text = ast.unparse(new_node)
        for candidate_text in (text, f"({text})"):
            if candidate_text == original or "\n" in candidate_text:
                continue
            mutated = self.source[:start] + candidate_text.encode() + self.source[end:]
            try:
                parsed = _parse(mutated)
            except SyntaxError:
                continue
            if ast.dump(parsed) == wanted:
                return SourceMutation(
                    operator=site.operator,
                    path=self.path,
                    function=site.function,
                    line=node.lineno,  # type: ignore[attr-defined]
                    start=start,
                    end=end,
                    original=original,
                    replacement=candidate_text,
                )
        return None
