"""The built-in demo family: bug-fix tasks over generated small Python packages.

Each task assembles a package from a few modules of `pool`, injects one to three bugs with the
operators of `mutate`, and writes a Harbor task: the buggy workspace with its visible pytest suite,
hidden tests with other inputs (which also check result types), and the reverse patch as the
solution. Everything is drawn from `random.Random(f"{seed}:{index}")`, so a seed fixes the tasks
and task N is the same whatever the count.

A difficulty knob sizes the tasks (`DIFFICULTY_LEVELS`): `easy` is one bug in a two-module
package whose failing tests call the buggy function directly, `medium` two bugs over three
modules, `hard` three bugs over three or four. Without it (`difficulty=None`) the bug count is
drawn per task (`BUG_COUNT_WEIGHTS`) and the difficulty follows from it. A curriculum mixes
levels by weight (`generate_demo_tasks(..., difficulty={"easy": 3, "medium": 1})`).
"""

from __future__ import annotations

import ast
import copy
import dataclasses
import difflib
import random
import sys
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tasks_lib.errors import GenerationError
from tasks_lib.format.model import DEFAULT_HIDDEN_DIR, DEFAULT_WORKSPACE_DIR
from tasks_lib.sources.authoring.writer import (
    FIX_PATCH,
    REWARD_FROM_EXIT,
    FileContent,
    TaskFiles,
    dockerfile,
    harbor_test_sh,
    patch_solve_sh,
    write_task,
)
from tasks_lib.sources.families.demo.mutate import OPERATORS, Mutation, find_mutations
from tasks_lib.sources.families.demo.pool import MODULES, PACKAGE_NAMES, ModuleSpec

FAMILY = "demo.bugfix"
HIDDEN_CASES_PER_FUNCTION = 4
BUG_COUNT_WEIGHTS = {1: 0.45, 2: 0.35, 3: 0.2}
DIFFICULTY_BY_BUGS = {1: "easy", 2: "medium", 3: "hard"}
MAX_ATTEMPTS_PER_TASK = 40
HIDDEN_SUBDIR = DEFAULT_HIDDEN_DIR.removeprefix("tests/")
"""Where the hidden tests go under the task's `tests/` (the loader's default `hidden_dir`)."""


@dataclasses.dataclass(frozen=True, slots=True)
class DifficultyLevel:
    """How big a task of one difficulty is."""

    bugs: int
    """Bugs injected (each in its own function)."""
    module_counts: tuple[int, ...]
    """Modules drawn for the package (one count chosen per task), before dependencies."""
    standalone_modules: bool
    """Draw only modules without dependencies, so no bug shows through another module."""
    direct_failures: bool
    """Every failing visible test calls a buggy function directly (none fails through a
    caller), so the failing test names the function to fix."""
    max_body_lines: int | None = None
    """Bugs go only into functions whose body (docstring aside) has at most this many lines."""


DIFFICULTY_LEVELS = {
    "easy": DifficultyLevel(
        bugs=1, module_counts=(2,), standalone_modules=True, direct_failures=True, max_body_lines=5
    ),
    "medium": DifficultyLevel(
        bugs=2, module_counts=(3,), standalone_modules=False, direct_failures=False
    ),
    "hard": DifficultyLevel(
        bugs=3, module_counts=(3, 4), standalone_modules=False, direct_failures=False
    ),
}


@dataclasses.dataclass(frozen=True, slots=True)
class _Case:
    test_name: str
    module: str
    function: str
    args: tuple[Any, ...]
    expected: Any
    hidden: bool


@dataclasses.dataclass(frozen=True, slots=True)
class DemoTaskPlan:
    """Everything that defines one generated task (before it is written)."""

    task_id: str
    package: str
    modules: tuple[str, ...]
    mutations: tuple[Mutation, ...]
    cases: tuple[_Case, ...]
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    hidden_tests: tuple[str, ...]
    seed: int
    index: int
    difficulty: str
    """`easy`, `medium` or `hard` (as written to `task.toml`)."""

    @property
    def signature(self) -> tuple[Any, ...]:
        return (self.package, self.modules, tuple(sorted(m.key for m in self.mutations)))


# -- running generated code in-process (it is our own code, not a candidate's) -------------------

_counter = [0]


def _load_package(sources: dict[str, str]) -> dict[str, types.ModuleType]:
    _counter[0] += 1
    package_name = f"_rollyard_demo_eval_{_counter[0]}"
    package = types.ModuleType(package_name)
    package.__path__ = []
    sys.modules[package_name] = package
    loaded: dict[str, types.ModuleType] = {}
    ordered = sorted(sources, key=lambda name: len(MODULES[name].depends_on))
    try:
        for name in ordered:
            module = types.ModuleType(f"{package_name}.{name}")
            module.__package__ = package_name
            sys.modules[module.__name__] = module
            setattr(package, name, module)
            exec(compile(sources[name], f"{name}.py", "exec"), module.__dict__)
            loaded[name] = module
    finally:
        for key in [key for key in sys.modules if key.split(".")[0] == package_name]:
            del sys.modules[key]
    return loaded


def _same_types(left: Any, right: Any) -> bool:
    if type(left) is not type(right):
        return False
    if isinstance(left, list | tuple):
        return len(left) == len(right) and all(map(_same_types, left, right))
    if isinstance(left, dict):
        return left.keys() == right.keys() and all(_same_types(left[k], right[k]) for k in left)
    return True


def _passes(modules: dict[str, types.ModuleType], case: _Case) -> bool:
    try:
        result = getattr(modules[case.module], case.function)(*copy.deepcopy(case.args))
        equal = bool(result == case.expected)
    except Exception:
        return False
    return equal and (not case.hidden or _same_types(result, case.expected))


# -- planning ---------------------------------------------------------------------------------


def _body_lines(source: str, function: str) -> int:
    """Lines of `function`'s body in `source`, its docstring left out."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                body = body[1:]
            return (node.end_lineno or node.lineno) - body[0].lineno + 1 if body else 0
    raise GenerationError(f"no function {function!r} in the module source")


def _draw_cases(
    rng: random.Random, specs: list[ModuleSpec]
) -> list[tuple[str, str, tuple[Any, ...], bool, int]]:
    drawn = []
    for spec in specs:
        for function, cases in spec.cases.items():
            for number, args in enumerate(cases.visible, start=1):
                drawn.append((spec.name, function, args, False, number))
            seen = set(map(repr, cases.visible))
            number = 0
            for _ in range(HIDDEN_CASES_PER_FUNCTION * 4):
                args = cases.hidden(rng)
                if repr(args) in seen:
                    continue
                seen.add(repr(args))
                number += 1
                drawn.append((spec.name, function, args, True, number))
                if number == HIDDEN_CASES_PER_FUNCTION:
                    break
    return drawn


def plan_demo_task(
    seed: int, index: int, attempt: int = 0, *, difficulty: str | None = None
) -> DemoTaskPlan:
    """Decide one task: package, modules, bugs and tests. Deterministic in (seed, index, attempt,
    difficulty); `difficulty=None` draws the bug count per task (the family's original mix)."""
    level = None
    if difficulty is not None:
        if difficulty not in DIFFICULTY_LEVELS:
            raise GenerationError(
                f"unknown demo difficulty {difficulty!r}; use one of {', '.join(DIFFICULTY_LEVELS)}"
            )
        level = DIFFICULTY_LEVELS[difficulty]
        rng = random.Random(f"rollyard-demo:{seed}:{index}:{attempt}:{difficulty}")
    else:
        rng = random.Random(f"rollyard-demo:{seed}:{index}:{attempt}")
    package = rng.choice(PACKAGE_NAMES)
    if level is None:
        names = rng.sample(sorted(MODULES), k=rng.randint(3, 4))
    else:
        standalone = level.standalone_modules
        pool = sorted(name for name in MODULES if not (standalone and MODULES[name].depends_on))
        names = rng.sample(pool, k=rng.choice(level.module_counts))
    for name in list(names):
        for dependency in MODULES[name].depends_on:
            if dependency not in names:
                names.append(dependency)
    names.sort()
    specs = [MODULES[name] for name in names]
    originals = {spec.name: spec.source for spec in specs}
    reference = _load_package(originals)
    cases: list[_Case] = []
    for module, function, args, hidden, number in _draw_cases(rng, specs):
        expected = getattr(reference[module], function)(*copy.deepcopy(args))
        kind = "hidden_" if hidden else ""
        cases.append(
            _Case(f"test_{function}_{kind}{number}", module, function, args, expected, hidden)
        )

    def failing(sources: dict[str, str]) -> tuple[set[str], set[str]]:
        modules = _load_package(sources)
        visible = {c.test_name for c in cases if not c.hidden and not _passes(modules, c)}
        hidden = {c.test_name for c in cases if c.hidden and not _passes(modules, c)}
        return visible, hidden

    if level is None:
        weights = list(BUG_COUNT_WEIGHTS.values())
        bug_count = rng.choices(list(BUG_COUNT_WEIGHTS), weights=weights)[0]
    else:
        bug_count = level.bugs
    function_of_test = {c.test_name: (c.module, c.function) for c in cases if not c.hidden}
    by_operator: dict[str, list[Mutation]] = {operator: [] for operator in OPERATORS}
    for spec in specs:
        for mutation in find_mutations(spec.source, spec.name):
            by_operator[mutation.operator].append(mutation)
    chosen: list[Mutation] = []
    used_functions: set[tuple[str, str]] = set()
    for _ in range(60):
        if len(chosen) == bug_count:
            break
        # Operator first, so the many variable swaps do not crowd out the other bug kinds.
        operator = rng.choice([op for op in OPERATORS if by_operator[op]])
        mutation = rng.choice(by_operator[operator])
        if (mutation.module, mutation.function) in used_functions:
            continue
        small_enough = (
            level is None
            or level.max_body_lines is None
            or _body_lines(MODULES[mutation.module].source, mutation.function)
            <= level.max_body_lines
        )
        if not small_enough:
            continue
        sources = dict(originals)
        sources[mutation.module] = mutation.apply(sources[mutation.module])
        try:
            visible_failing, hidden_failing = failing(sources)
        except Exception:
            continue  # the mutant does not even import
        # Each bug must show in the visible suite (the agent can find it) and in the hidden
        # one (hard-coding the visible answers does not pass).
        direct = all(
            function_of_test[name] == (mutation.module, mutation.function)
            for name in visible_failing
        )
        if (
            visible_failing
            and hidden_failing
            and (direct or not level or not level.direct_failures)
        ):
            chosen.append(mutation)
            used_functions.add((mutation.module, mutation.function))
    if not chosen:
        raise GenerationError(f"no detectable bug found for seed {seed} index {index}")
    buggy = dict(originals)
    for mutation in sorted(chosen, key=lambda m: -m.start):
        buggy[mutation.module] = mutation.apply(buggy[mutation.module])
    visible_failing, hidden_failing = failing(buggy)

    def test_id(case: _Case) -> str:
        prefix = "test_hidden_" if case.hidden else "test_"
        return f"tests/{prefix}{case.module}.py::{case.test_name}"

    fail_to_pass = tuple(
        test_id(c) for c in cases if not c.hidden and c.test_name in visible_failing
    )
    pass_to_pass = tuple(
        test_id(c) for c in cases if not c.hidden and c.test_name not in visible_failing
    )
    hidden_tests = tuple(test_id(c) for c in cases if c.hidden)
    return DemoTaskPlan(
        task_id=f"demo-{seed}-{index:04d}",
        package=package,
        modules=tuple(names),
        mutations=tuple(sorted(chosen, key=lambda m: (m.module, m.start))),
        cases=tuple(cases),
        fail_to_pass=fail_to_pass,
        pass_to_pass=pass_to_pass,
        hidden_tests=hidden_tests,
        seed=seed,
        index=index,
        difficulty=difficulty or DIFFICULTY_BY_BUGS[min(len(chosen), 3)],
    )


# -- writing ----------------------------------------------------------------------------------


def _test_module(plan: DemoTaskPlan, module: str, hidden: bool) -> str:
    lines = [
        f'"""{"Further tests" if hidden else "Tests"} for {plan.package}.{module}."""',
        "",
        f"from {plan.package} import {module}",
        "",
    ]
    if hidden:
        lines += [
            "",
            "def _same_types(left, right):",
            "    # Results must be real values of the expected type, not look-alikes.",
            "    if type(left) is not type(right):",
            "        return False",
            "    if isinstance(left, (list, tuple)):",
            "        return len(left) == len(right) and all(map(_same_types, left, right))",
            "    if isinstance(left, dict):",
            "        return left.keys() == right.keys() and all(_same_types(left[k], right[k]) for k in left)",
            "    return True",
            "",
        ]
    for case in plan.cases:
        if case.module != module or case.hidden != hidden:
            continue
        call = f"{module}.{case.function}({', '.join(repr(arg) for arg in case.args)})"
        lines += ["", f"def {case.test_name}():"]
        if hidden:
            lines += [
                f"    result = {call}",
                f"    expected = {case.expected!r}",
                "    assert result == expected",
                "    assert _same_types(result, expected)",
                "",
            ]
        else:
            lines += [f"    assert {call} == {case.expected!r}", ""]
    return "\n".join(lines).rstrip() + "\n"


def _instruction(plan: DemoTaskPlan) -> str:
    failing = "\n".join(f"- `{test_id}`" for test_id in plan.fail_to_pass)
    modules = ", ".join(f"`{plan.package}/{name}.py`" for name in plan.modules)
    return (
        f"# Fix the bugs in `{plan.package}`\n\n"
        f"`{plan.package}` is a small Python package ({modules}) with a pytest suite in `tests/`.\n"
        "Each function's docstring states what it should do. These tests currently fail:\n\n"
        f"{failing}\n\n"
        "Fix the package so the whole suite passes. Run it with:\n\n"
        "    python -m pytest tests\n\n"
        "Change only the package source. Test files, conftest files and configuration are\n"
        "restored before grading, and further tests with other inputs check the same behaviour,\n"
        "so a fix has to be correct in general, not only for the inputs above.\n"
    )


_DOCKERFILE = dockerfile('"pytest>=8,<10"')

_TEST_SH = harbor_test_sh(
    "installs the hidden tests, runs the suite, writes the reward.",
    "cp -r /tests/hidden/. /workspace/\n"
    "cd /workspace\n"
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 \\\n"
    "    python -m pytest -p no:cacheprovider -q tests\n" + REWARD_FROM_EXIT,
)

_SOLVE_SH = patch_solve_sh("the reverse of the injected bugs, applied in the workspace.")


def write_demo_task(plan: DemoTaskPlan, task_dir: Path) -> Path:
    """Write `plan` as a Harbor task directory (replacing `task_dir` if it exists)."""
    workspace: dict[str, str | bytes] = {
        f"{plan.package}/__init__.py": f'"""{plan.package}: small helpers."""\n'
    }
    hidden: dict[str, FileContent] = {}
    patch_parts: list[str] = []
    for name in plan.modules:
        original = MODULES[name].source
        buggy = original
        for mutation in sorted(
            (m for m in plan.mutations if m.module == name), key=lambda m: -m.start
        ):
            buggy = mutation.apply(buggy)
        workspace[f"{plan.package}/{name}.py"] = buggy
        if buggy != original:
            path = f"{plan.package}/{name}.py"
            patch_parts.extend(
                difflib.unified_diff(
                    buggy.splitlines(keepends=True),
                    original.splitlines(keepends=True),
                    fromfile=f"a/{path}",
                    tofile=f"b/{path}",
                )
            )
        workspace[f"tests/test_{name}.py"] = _test_module(plan, name, hidden=False)
        hidden[f"{HIDDEN_SUBDIR}/tests/test_hidden_{name}.py"] = _test_module(
            plan, name, hidden=True
        )
    workspace["pyproject.toml"] = (
        f'[project]\nname = "{plan.package}"\nversion = "0.1.0"\nrequires-python = ">=3.10"\n'
    )
    difficulty = plan.difficulty
    files = TaskFiles(
        task_id=plan.task_id,
        instruction=_instruction(plan),
        workspace=workspace,
        rollyard={
            "id": plan.task_id,
            "version": "1",
            "family": FAMILY,
            "source": f"rollyard demo generator, seed {plan.seed}, index {plan.index}",
            "difficulty": difficulty,
            "workspace_dir": DEFAULT_WORKSPACE_DIR,
            "test_command": "python -m pytest tests",
            "hidden_dir": DEFAULT_HIDDEN_DIR,
            "fail_to_pass": list(plan.fail_to_pass),
            "pass_to_pass": list(plan.pass_to_pass),
            "hidden_tests": list(plan.hidden_tests),
            "limits": {"wall_time_s": 60.0, "memory_mb": 1024, "verify_timeout_s": 120.0},
        },
        solve_sh=_SOLVE_SH,
        tests=hidden,
        solution={FIX_PATCH: "".join(patch_parts)},
        test_sh=_TEST_SH,
        metadata={
            "author_name": "rollyard demo generator",
            "difficulty": difficulty,
            "category": "debugging",
            "tags": ["python", "bug-fix", "demo"],
            "bugs": [mutation.describe() for mutation in plan.mutations],
        },
        dockerfile=_DOCKERFILE,
    )
    return write_task(files, task_dir)


def difficulty_for_index(
    difficulty: str | Mapping[str, float] | None, seed: int, index: int
) -> str | None:
    """The difficulty of task `index`: fixed, drawn from a weighted mix (deterministic in seed
    and index, so task N is the same whatever the count), or None for the original mix."""
    if difficulty is None or isinstance(difficulty, str):
        return difficulty
    levels = [level for level, weight in difficulty.items() if weight > 0]
    unknown = [level for level in levels if level not in DIFFICULTY_LEVELS]
    if not levels or unknown:
        raise GenerationError(
            f"a difficulty mix needs positive weights over {', '.join(DIFFICULTY_LEVELS)}; "
            f"got {dict(difficulty)!r}"
        )
    rng = random.Random(f"rollyard-demo-difficulty:{seed}:{index}")
    return rng.choices(levels, weights=[difficulty[level] for level in levels])[0]


def generate_demo_tasks(
    out_dir: str | Path,
    count: int,
    seed: int = 0,
    *,
    difficulty: str | Mapping[str, float] | None = None,
    progress: Callable[[int, Path], None] | None = None,
) -> list[Path]:
    """Write `count` distinct demo tasks under `out_dir` (one directory per task id).

    `difficulty`: one level for every task, a mix `{level: weight}` drawn per task, or None for
    the family's original mix of one to three bugs."""
    if count < 1:
        raise GenerationError(f"count must be at least 1, got {count}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    seen: set[tuple[Any, ...]] = set()
    written: list[Path] = []
    for index in range(count):
        level = difficulty_for_index(difficulty, seed, index)
        for attempt in range(MAX_ATTEMPTS_PER_TASK):
            plan = plan_demo_task(seed, index, attempt, difficulty=level)
            if plan.signature not in seen:
                break
        else:
            raise GenerationError(
                f"could not find a distinct task for index {index} after "
                f"{MAX_ATTEMPTS_PER_TASK} attempts; use a smaller count"
            )
        seen.add(plan.signature)
        path = write_demo_task(plan, out / plan.task_id)
        written.append(path)
        if progress is not None:
            progress(index, path)
    return written
