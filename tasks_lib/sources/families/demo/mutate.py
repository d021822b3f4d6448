"""Mutation operators that inject one realistic bug into a function, as an exact text edit.

Each mutation replaces one source span with new text, so the rest of the module (comments,
docstrings, layout) stays as written and the reverse edit is the fix.
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import functools
from collections.abc import Iterator

OPERATORS = (
    "comparison",
    "arithmetic",
    "boundary",
    "boolean",
    "return_value",
    "wrong_variable",
    "missing_call",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Mutation:
    operator: str
    module: str
    function: str
    line: int
    start: int
    """Character offset of the replaced span in the module source."""
    end: int
    original: str
    replacement: str

    def apply(self, source: str) -> str:
        return source[: self.start] + self.replacement + source[self.end :]

    @property
    def key(self) -> tuple[str, str, int, str]:
        return (self.module, self.function, self.start, self.replacement)

    def describe(self) -> str:
        return (
            f"{self.module}.{self.function} line {self.line} ({self.operator}): "
            f"{self.original!r} -> {self.replacement!r}"
        )


_COMPARE_SWAPS: dict[type[ast.cmpop], tuple[type[ast.cmpop], ...]] = {
    ast.Lt: (ast.LtE, ast.Gt),
    ast.LtE: (ast.Lt,),
    ast.Gt: (ast.GtE, ast.Lt),
    ast.GtE: (ast.Gt,),
    ast.Eq: (ast.NotEq,),
    ast.NotEq: (ast.Eq,),
    ast.In: (ast.NotIn,),
    ast.NotIn: (ast.In,),
}
_ARITH_SWAPS: dict[type[ast.operator], tuple[type[ast.operator], ...]] = {
    ast.Add: (ast.Sub,),
    ast.Sub: (ast.Add,),
    ast.Mult: (ast.Add,),
    ast.FloorDiv: (ast.Mod,),
    ast.Mod: (ast.FloorDiv,),
    ast.Div: (ast.Mult,),
}
_DROPPABLE_CALLS = {"sorted", "abs", "round", "str", "list", "dict", "max", "min", "reversed"}
_DROPPABLE_METHODS = {"lower", "upper", "strip", "copy"}


def _offsets(source: str) -> list[int]:
    starts = [0]
    for line in source.splitlines(keepends=True):
        starts.append(starts[-1] + len(line))
    return starts


def _span(node: ast.AST, starts: list[int]) -> tuple[int, int]:
    # Sources are ASCII, so the byte columns of `ast` are character columns.
    start = starts[node.lineno - 1] + node.col_offset  # type: ignore[attr-defined]
    end = starts[node.end_lineno - 1] + node.end_col_offset  # type: ignore[attr-defined]
    return start, end


def _locals(function: ast.FunctionDef) -> list[str]:
    names = [arg.arg for arg in function.args.args]
    for node in ast.walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in names:
            names.append(node.id)
    return [name for name in names if not name.startswith("_")]


def node_variants(node: ast.AST, function: ast.FunctionDef) -> Iterator[tuple[str, ast.AST | None]]:
    """(operator, replacement node) pairs for `node`; None as node means "statement removed"."""
    if isinstance(node, ast.Compare):
        for index, op in enumerate(node.ops):
            for new_cmpop in _COMPARE_SWAPS.get(type(op), ()):
                compare = copy.deepcopy(node)
                compare.ops[index] = new_cmpop()
                yield "comparison", compare
    elif isinstance(node, ast.BinOp | ast.AugAssign):
        for new_operator in _ARITH_SWAPS.get(type(node.op), ()):
            arithmetic = copy.deepcopy(node)
            arithmetic.op = new_operator()
            yield "arithmetic", arithmetic
    elif isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            if node.value + delta >= 0:
                yield "boundary", ast.Constant(node.value + delta)
    elif isinstance(node, ast.BoolOp):
        boolean = copy.deepcopy(node)
        boolean.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        yield "boolean", boolean
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        yield "boolean", copy.deepcopy(node.operand)
    elif isinstance(node, ast.Return) and isinstance(node.value, ast.Constant):
        value = node.value.value
        flipped: object
        if value is True or value is False:
            flipped = not value
        elif value is None:
            flipped = 0
        elif isinstance(value, int | float):
            flipped = None
        else:
            return
        yield "return_value", ast.Return(ast.Constant(flipped))
    elif (
        isinstance(node, ast.Return)
        and isinstance(node.value, ast.BinOp)
        and isinstance(node.value.op, ast.Sub | ast.Div | ast.FloorDiv | ast.Mod)
    ):
        swapped = copy.deepcopy(node)
        assert isinstance(swapped.value, ast.BinOp)
        swapped.value.left, swapped.value.right = swapped.value.right, swapped.value.left
        yield "return_value", swapped
    elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
        names = _locals(function)
        if node.id in names:
            for other in names:
                if other != node.id:
                    yield "wrong_variable", ast.Name(other, ast.Load())
    elif isinstance(node, ast.Call) and not node.keywords:
        if isinstance(node.func, ast.Name) and node.func.id in _DROPPABLE_CALLS and node.args:
            yield "missing_call", copy.deepcopy(node.args[0])
        elif (
            isinstance(node.func, ast.Attribute)
            and node.func.attr in _DROPPABLE_METHODS
            and not node.args
        ):
            yield "missing_call", copy.deepcopy(node.func.value)
    elif (
        isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Call)
        and isinstance(node.value.func, ast.Attribute)
        and node.value.func.attr in ("append", "update", "sort")
    ):
        yield "missing_call", None


def _strip(tree: ast.AST) -> str:
    return ast.dump(tree, include_attributes=False)


@functools.lru_cache(maxsize=64)
def find_mutations(source: str, module: str) -> tuple[Mutation, ...]:
    """Every single-edit mutation of the module's functions that parses to the intended tree."""
    tree = ast.parse(source)
    starts = _offsets(source)
    mutations: list[Mutation] = []
    for top_index, function in enumerate(tree.body):
        if not isinstance(function, ast.FunctionDef):
            continue
        body = function.body
        if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
            body = body[1:]  # never mutate the docstring
        nodes = [node for statement in body for node in ast.walk(statement)]
        for node_index, node in enumerate(nodes):
            if not hasattr(node, "lineno"):
                continue
            for operator, replacement in node_variants(node, function):
                mutation = _as_edit(
                    source,
                    tree,
                    starts,
                    top_index,
                    node_index,
                    node,
                    operator,
                    replacement,
                    module,
                    function.name,
                )
                if mutation is not None:
                    mutations.append(mutation)
    return tuple(mutations)


def _as_edit(
    source: str,
    tree: ast.Module,
    starts: list[int],
    top_index: int,
    node_index: int,
    node: ast.AST,
    operator: str,
    replacement: ast.AST | None,
    module: str,
    function_name: str,
) -> Mutation | None:
    start, end = _span(node, starts)
    # The intended tree: the same edit made on a copy of the AST.
    expected = copy.deepcopy(tree)
    function = expected.body[top_index]
    assert isinstance(function, ast.FunctionDef)
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    target = [sub for statement in body for sub in ast.walk(statement)][node_index]
    if replacement is None:
        new_node: ast.AST = ast.Pass()
        text_options = ["pass"]
    else:
        new_node = replacement
        text = ast.unparse(replacement)
        text_options = [text, f"({text})"]
    if not _replace_node(expected, target, new_node):
        return None
    wanted = _strip(expected)
    original = source[start:end]
    for text in text_options:
        if text == original:
            return None
        candidate = source[:start] + text + source[end:]
        try:
            parsed = ast.parse(candidate)
        except SyntaxError:
            continue
        if _strip(parsed) == wanted:
            return Mutation(
                operator,
                module,
                function_name,
                # `ast.AST` declares no positions, though every node find_mutations hands
                # over has them (it skips nodes without `lineno`), as in `_span`.
                node.lineno,  # type: ignore[attr-defined]
                start,
                end,
                original,
                text,
            )
    return None


def _replace_node(tree: ast.AST, target: ast.AST, new: ast.AST) -> bool:
    for parent in ast.walk(tree):
        for field, value in ast.iter_fields(parent):
            if value is target:
                setattr(parent, field, new)
                return True
            if isinstance(value, list):
                for index, item in enumerate(value):
                    if item is target:
                        value[index] = new
                        return True
    return False
