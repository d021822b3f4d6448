"""Curation's duplicate and decontamination rules on labelled generated data.

Distinct tasks: demo-family tasks (one family, one template, one pool of modules; tasks whose
generator drew the very same bug set are one task and are set aside) and tasks synthesized from
two small generated repositories (one code base per repository). Planted copies of distinct
tasks, each under a new task id: `new_id` (nothing else changed), `renamed` (every identifier
the project defines, its package and module files renamed, in code, tests, fix and
instruction), `reformatted` (code and tests through another formatter style: 2-space indent,
single quotes, 48-column lines; the fix regenerated), `paraphrased` (instruction reworded with
a synonym table this benchmark owns, paragraphs reordered), `reordered` (test functions and test
id lists reversed) and `all` (every one of those at once).

Scenarios, each judged by `tasks_lib.curate.decide` on the tasks' fingerprints (the oracle
runs, which this change leaves alone, are not part of it):

1. one batch: the distinct tasks and copies of some of them -> copies rejected as duplicates
   naming their original, distinct tasks admitted;
2. two batches: copies of tasks admitted by batch 1 (fingerprints read back from the rows batch 1
   recorded) -> rejected naming the batch-1 task;
3. `instance`: an evaluation set of held-out tasks, the library holding their siblings and copies
   of them -> copies rejected as contaminated, siblings admitted; the same under `off` rejects
   nothing;
4. `repository`: two tasks of repository A held out as the evaluation set -> every other task of
   A rejected, none of repository B.

Targets: 0 false rejections and 100% of the planted copies caught under `instance`; under
`repository` every task of the evaluation repository rejected and none of another.

    python benchmarks/curation.py [--demo-tasks 40] [--synth-tasks 8] [--seed 7] [--originals 6]
"""

from __future__ import annotations

import argparse
import ast
import builtins
import dataclasses
import difflib
import json
import keyword
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

import tomli_w
from tasks_lib.synthesize import synthesize_tasks

from sandboxes import SandboxError
from tasks_lib import CandidateChanges, Task, generate_demo_tasks, load_task, solution_changes
from tasks_lib.curate import (
    PARTS,
    CurationSettings,
    TaskChecks,
    TaskVerdict,
    decide,
    earlier_admitted,
    load_eval_set,
    task_fingerprint,
    verdict_rows,
)
from tasks_lib.curate.similarity import compare, instruction_templates

DUPLICATE_RULES = frozenset({"exact_duplicate", "near_duplicate"})
EVAL_RULES = frozenset({"contaminated", "eval_repository"})
ATTEMPTS = 8
"""Tries of a step that opens sandboxes: on a shared host other jobs' mounts come and go, and
bwrap's setup fails now and then (`Can't bind mount /oldroot/`); that is the host, not curation."""
KINDS = ("new_id", "renamed", "reformatted", "paraphrased", "reordered", "all")

# -- two generated repositories --------------------------------------------------------------------

REPOSITORIES = {
    "geomkit": (
        "geomkit/shapes.py",
        '''\
"""Plane geometry helpers."""


def rectangle_area(width, height):
    if width < 0 or height < 0:
        raise ValueError("sides must not be negative")
    return width * height


def perimeter(points):
    total = 0.0
    for index in range(len(points)):
        x1, y1 = points[index]
        x2, y2 = points[(index + 1) % len(points)]
        total += ((x2 - x1) ** 2 + (y2 - y1) ** 2) ** 0.5
    return total


def bounding_box(points):
    if not points:
        return None
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    return (min(xs), min(ys), max(xs), max(ys))


def contains(box, point):
    left, bottom, right, top = box
    x, y = point
    return left <= x <= right and bottom <= y <= top


def centroid(points):
    count = len(points)
    if count == 0:
        raise ValueError("no points")
    return (sum(x for x, _ in points) / count, sum(y for _, y in points) / count)


def scale_points(points, factor, origin=(0, 0)):
    ox, oy = origin
    return [(ox + (x - ox) * factor, oy + (y - oy) * factor) for x, y in points]


def manhattan(a, b):
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def closest_pair_distance(points):
    best = None
    for i in range(len(points)):
        for j in range(i + 1, len(points)):
            distance = manhattan(points[i], points[j])
            if best is None or distance < best:
                best = distance
    return best
''',
        """\
import pytest

from geomkit.shapes import (
    bounding_box, centroid, closest_pair_distance, contains, manhattan, perimeter,
    rectangle_area, scale_points,
)


def test_rectangle_area():
    assert rectangle_area(3, 4) == 12
    assert rectangle_area(0, 5) == 0


def test_rectangle_area_rejects_negative_sides():
    with pytest.raises(ValueError):
        rectangle_area(-1, 2)


def test_perimeter_of_square():
    assert perimeter([(0, 0), (2, 0), (2, 2), (0, 2)]) == 8.0


def test_perimeter_of_triangle():
    assert perimeter([(0, 0), (3, 0), (3, 4)]) == 12.0


def test_bounding_box():
    assert bounding_box([(1, 5), (-2, 3), (4, -1)]) == (-2, -1, 4, 5)
    assert bounding_box([]) is None


def test_contains_inside_and_edge():
    assert contains((0, 0, 4, 4), (2, 3))
    assert contains((0, 0, 4, 4), (4, 0))


def test_contains_outside():
    assert not contains((0, 0, 4, 4), (5, 1))
    assert not contains((0, 0, 4, 4), (1, -1))


def test_centroid():
    assert centroid([(0, 0), (4, 0), (4, 4), (0, 4)]) == (2.0, 2.0)


def test_centroid_of_nothing():
    with pytest.raises(ValueError):
        centroid([])


def test_scale_points_about_origin():
    assert scale_points([(1, 2), (3, 4)], 2) == [(2, 4), (6, 8)]


def test_scale_points_about_center():
    assert scale_points([(3, 3)], 3, origin=(1, 1)) == [(7, 7)]


def test_manhattan():
    assert manhattan((1, 1), (4, 5)) == 7
    assert manhattan((-1, 0), (1, 0)) == 2


def test_closest_pair_distance():
    assert closest_pair_distance([(0, 0), (5, 5), (1, 1), (9, 0)]) == 2
    assert closest_pair_distance([(0, 0)]) is None
""",
    ),
    "ledgerbook": (
        "ledgerbook/entries.py",
        '''\
"""Bookkeeping over simple ledger entries: (account, amount in cents) pairs."""


def balance(entries, account):
    total = 0
    for name, amount in entries:
        if name == account:
            total += amount
    return total


def accounts(entries):
    seen = []
    for name, _ in entries:
        if name not in seen:
            seen.append(name)
    return sorted(seen)


def largest_debit(entries):
    debits = [amount for _, amount in entries if amount < 0]
    if not debits:
        return 0
    return min(debits)


def format_cents(cents):
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def split_evenly(total, parts):
    if parts <= 0:
        raise ValueError("parts must be positive")
    share, left = divmod(total, parts)
    return [share + 1 if index < left else share for index in range(parts)]


def running_totals(amounts):
    totals = []
    current = 0
    for amount in amounts:
        current += amount
        totals.append(current)
    return totals


def overdrawn(entries):
    return [name for name in accounts(entries) if balance(entries, name) < 0]


def apply_fee(amount, percent, minimum=25):
    fee = amount * percent // 100
    return amount - max(fee, minimum)
''',
        """\
import pytest

from ledgerbook.entries import (
    accounts, apply_fee, balance, format_cents, largest_debit, overdrawn, running_totals,
    split_evenly,
)

ENTRIES = [("cash", 500), ("rent", -300), ("cash", -120), ("food", -80), ("rent", 100)]


def test_balance():
    assert balance(ENTRIES, "cash") == 380
    assert balance(ENTRIES, "none") == 0


def test_accounts_sorted_unique():
    assert accounts(ENTRIES) == ["cash", "food", "rent"]


def test_largest_debit():
    assert largest_debit(ENTRIES) == -300
    assert largest_debit([("a", 5)]) == 0


def test_format_cents():
    assert format_cents(12345) == "123.45"
    assert format_cents(-5) == "-0.05"
    assert format_cents(100) == "1.00"


def test_split_evenly():
    assert split_evenly(10, 3) == [4, 3, 3]
    assert split_evenly(9, 3) == [3, 3, 3]


def test_split_evenly_rejects_no_parts():
    with pytest.raises(ValueError):
        split_evenly(10, 0)


def test_running_totals():
    assert running_totals([5, -2, 10]) == [5, 3, 13]
    assert running_totals([]) == []


def test_overdrawn():
    assert overdrawn(ENTRIES) == ["food", "rent"]


def test_apply_fee_percent():
    assert apply_fee(10000, 2) == 9800


def test_apply_fee_minimum():
    assert apply_fee(1000, 1) == 975
""",
    ),
}


def make_repository(root: Path, name: str) -> Path:
    module, source, tests = REPOSITORIES[name]
    project = root / name
    (project / module).parent.mkdir(parents=True)
    (project / module).parent.joinpath("__init__.py").write_text(f'"""{name}."""\n')
    (project / module).write_text(source)
    (project / "tests").mkdir()
    (project / "tests" / f"test_{Path(module).stem}.py").write_text(tests)
    (project / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0.1"\n')
    return project


# -- labelled corpus -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    """A task directory with its label."""

    task_dir: Path
    task_id: str
    group: str
    """Ground truth: tasks with one group are one task (an original and its copies)."""
    origin: str
    """`demo`, or the repository a synthesized task comes from."""
    kind: str | None = None
    """The planted copy's transformation; None for a distinct task."""


def _bugs(task_dir: Path) -> tuple[str, ...]:
    document = tomllib.loads((task_dir / "task.toml").read_text())
    return tuple(sorted(document["metadata"]["bugs"]))


def distinct_tasks(
    root: Path, demo_tasks: int, synth_tasks: int, seed: int
) -> tuple[list[Item], int]:
    """The distinct tasks and how many demo tasks were set aside as the same bug set again;
    generated under `root/corpus`, or read back from an earlier run with the same arguments."""
    manifest = root / "corpus" / "manifest.json"
    wanted = {"demo_tasks": demo_tasks, "synth_tasks": synth_tasks, "seed": seed}
    if manifest.is_file():
        saved = json.loads(manifest.read_text())
        if saved["arguments"] == wanted:
            items = [Item(Path(d["task_dir"]), d["task_id"], d["group"], d["origin"])
                     for d in saved["items"]]  # fmt: skip
            return items, saved["same_bugs"]
    shutil.rmtree(root / "corpus", ignore_errors=True)
    items, same_bugs = _generate(root / "corpus", demo_tasks, synth_tasks, seed)
    manifest.write_text(json.dumps({
        "arguments": wanted, "same_bugs": same_bugs,
        "items": [{"task_dir": str(i.task_dir), "task_id": i.task_id, "group": i.group,
                   "origin": i.origin} for i in items],
    }))  # fmt: skip
    return items, same_bugs


def _generate(root: Path, demo_tasks: int, synth_tasks: int, seed: int) -> tuple[list[Item], int]:
    items: list[Item] = []
    seen: set[tuple[str, ...]] = set()
    same_bugs = 0
    for task_dir in generate_demo_tasks(root / "demo", demo_tasks, seed=seed):
        bugs = _bugs(task_dir)
        if bugs in seen:
            same_bugs += 1
            continue
        seen.add(bugs)
        items.append(Item(task_dir, load_task(task_dir).id, task_dir.name, "demo"))
    for name in REPOSITORIES:
        project = make_repository(root / "projects", name)
        for attempt in range(ATTEMPTS):
            try:
                report = synthesize_tasks(project, root / name, max_tasks=synth_tasks, seed=seed)
                break
            except SandboxError as error:  # the host's sandboxes broke, not the benchmark
                print(f"synthesis of {name}, attempt {attempt + 1}: {error}", file=sys.stderr)
                shutil.rmtree(root / name, ignore_errors=True)
                time.sleep(2)
        else:
            raise SystemExit(f"synthesis of {name} failed {ATTEMPTS} times on sandbox errors")
        for task_dir in map(Path, report.task_dirs):
            items.append(Item(task_dir, load_task(task_dir).id, task_dir.name, name))
    return items, same_bugs


# -- planted copies --------------------------------------------------------------------------------

_KEEP = (
    frozenset(keyword.kwlist)
    | frozenset(dir(builtins))
    | frozenset(a for kind in (str, list, dict, set, tuple, int, float) for a in dir(kind))
    | {"self", "cls", "tests", "test", "pytest"}
)


def _text_files(root: Path) -> Iterable[Path]:
    suffixes = (".py", ".md", ".patch", ".sh", ".json", ".toml")
    return sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in suffixes)


def _workspace(task_dir: Path) -> Path:
    return task_dir / "environment" / "workspace"


_PY_STRING = (
    r"[rRbBuUfF]{0,2}(?:"
    r"'''.*?'''"
    r'|""".*?"""'
    r"|'(?:[^'\\\n]|\\.)*'"
    r'|"(?:[^"\\\n]|\\.)*"'
    r")"
)


class Renamer:
    """Renames a project's names where they are code: Python outside string literals and
    comments (but inside f-string fields), and code spans and blocks of Markdown."""

    def __init__(self, mapping: dict[str, str]) -> None:
        self.mapping = mapping
        names = "|".join(map(re.escape, sorted(mapping, key=len, reverse=True)))
        self.name = re.compile(rf"\b({names})\b")
        self.code = re.compile(rf"(?P<s>{_PY_STRING})|(?P<c>#[^\n]*)|\b(?P<n>{names})\b", re.S)

    def _words(self, text: str) -> str:
        return self.name.sub(lambda m: self.mapping[m.group(1)], text)

    def python(self, source: str) -> str:
        def one(match: re.Match[str]) -> str:
            if match.group("n"):
                return self.mapping[match.group("n")]
            text = match.group(0)
            prefix = re.match(r"[rRbBuU]*[fF][rRbBuU]*", text)
            if match.group("s") and prefix:  # f-string: its fields are code
                return re.sub(r"\{[^{}]*\}", lambda f: self._words(f.group(0)), text)
            return text

        return self.code.sub(one, source)

    def markdown(self, text: str) -> str:
        return re.sub(r"```.*?```|`[^`]*`", lambda m: self._words(m.group(0)), text, flags=re.S)


def rename_identifiers(task_dir: Path, rng: random.Random) -> None:
    """Every name the project's source defines (functions, classes, arguments, variables,
    modules, the package) renamed where it is code: sources, tests, hidden tests, the
    instruction's code; the fix regenerated over the renamed files."""
    workspace = _workspace(task_dir)
    names: set[str] = set()
    for path in workspace.rglob("*.py"):
        rel = path.relative_to(workspace)
        if rel.parts[0] == "tests":
            continue
        names.update(p for p in rel.with_suffix("").parts if p != "__init__")
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
    names = {n for n in names - _KEEP if not n.startswith("__")}
    renamer = Renamer(
        {n: f"{rng.choice('bcdfgkmpst')}{rng.getrandbits(24):06x}" for n in sorted(names)}
    )
    fixed = {rel: renamer.python(text) for rel, text in _fixed_sources(task_dir).items()}
    for path in task_dir.rglob("*.py"):
        if "solution" not in path.relative_to(task_dir).parts:
            path.write_text(renamer.python(path.read_text()))
    (task_dir / "instruction.md").write_text(
        renamer.markdown((task_dir / "instruction.md").read_text())
    )
    # Module files and the package directory, deepest first.
    for path in sorted(task_dir.rglob("*"), key=lambda p: -len(p.parts)):
        stem = path.stem if path.is_file() else path.name
        if stem in renamer.mapping and (path.suffix == ".py" or path.is_dir()):
            path.rename(
                path.with_name(renamer.mapping[stem] + (path.suffix if path.is_file() else ""))
            )
    renamed_path = {rel: "/".join(renamer.mapping.get(Path(p).stem, Path(p).stem) + Path(p).suffix
                                  for p in rel.split("/")) for rel in fixed}  # fmt: skip
    _write_fix(task_dir, {renamed_path[rel]: text for rel, text in fixed.items()})


def _fixed_sources(task_dir: Path) -> dict[str, str]:
    """The files the reference fix changes, as the fix leaves them (patch run on a scratch
    copy of the workspace)."""
    scratch = Path(tempfile.mkdtemp(prefix="fix-"))
    try:
        shutil.copytree(_workspace(task_dir), scratch / "w")
        patch = (task_dir / "solution" / "fix.patch").read_text()
        subprocess.run(["patch", "-p1", "--quiet", "--no-backup-if-mismatch"], cwd=scratch / "w",
                       input=patch, text=True, check=True)  # fmt: skip
        changed = re.findall(r"^\+\+\+ b/(\S+)", patch, flags=re.M)
        return {rel: (scratch / "w" / rel).read_text() for rel in changed}
    finally:
        shutil.rmtree(scratch)


def _write_fix(task_dir: Path, fixed: dict[str, str]) -> None:
    workspace = _workspace(task_dir)
    patch = ""
    for rel, after in sorted(fixed.items()):
        before = (workspace / rel).read_text()
        patch += "".join(difflib.unified_diff(before.splitlines(keepends=True),
                                              after.splitlines(keepends=True),
                                              fromfile=f"a/{rel}", tofile=f"b/{rel}"))  # fmt: skip
    (task_dir / "solution" / "fix.patch").write_text(patch)


def _ruff_format(paths: Sequence[Path]) -> None:
    ruff = Path(sys.executable).with_name("ruff")
    subprocess.run(
        [str(ruff), "format", "--quiet", "--isolated", "--line-length", "48",
         "--config", "indent-width = 2", "--config", "format.quote-style = 'single'",
         *map(str, paths)],
        check=True,
    )  # fmt: skip


def reformat_code(task_dir: Path) -> None:
    """Code and tests through another formatter style; the fix regenerated to match."""
    fixed = _fixed_sources(task_dir)
    scratch = Path(tempfile.mkdtemp(prefix="fmt-"))
    try:
        copies = []
        for rel, text in fixed.items():
            copy = scratch / rel
            copy.parent.mkdir(parents=True, exist_ok=True)
            copy.write_text(text)
            copies.append(copy)
        python = [p for p in task_dir.rglob("*.py") if "solution" not in p.parts]
        _ruff_format([*python, *copies])
        _write_fix(task_dir, {rel: (scratch / rel).read_text() for rel in fixed})
    finally:
        shutil.rmtree(scratch)


def _reordered_module(source: str) -> str:
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)

    def segment(node: ast.stmt) -> str:
        first = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))])
        return "".join(lines[first - 1 : node.end_lineno])

    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef | ast.ClassDef)]
    rest = [n for n in tree.body if n not in defs]
    parts = [segment(n) for n in rest] + [segment(n) for n in reversed(defs)]
    return "\n\n".join(part.rstrip("\n") for part in parts) + "\n"


def reorder_tests(task_dir: Path) -> None:
    """Test functions in reverse order in every test file; test id lists reversed."""
    for path in task_dir.rglob("test_*.py"):
        path.write_text(_reordered_module(path.read_text()))
    toml = task_dir / "task.toml"
    document = tomllib.loads(toml.read_text())
    for key in ("fail_to_pass", "pass_to_pass", "hidden_tests"):
        if key in document["rollyard"]:
            document["rollyard"][key] = list(reversed(document["rollyard"][key]))
    toml.write_bytes(tomli_w.dumps(document).encode())


SYNONYMS = {
    "fix": "repair", "fixes": "repairs", "bugs": "defects", "bug": "defect",
    "package": "library", "small": "compact", "function": "routine", "functions": "routines",
    "states": "describes", "should": "ought to", "currently": "at the moment", "fail": "break",
    "failing": "breaking", "whole": "entire", "passes": "succeeds", "run": "execute",
    "change": "modify", "changed": "modified", "only": "just", "source": "code",
    "restored": "reset", "grading": "scoring", "further": "additional", "inputs": "arguments",
    "check": "verify", "correct": "right", "general": "every case", "find": "locate",
    "broke": "damaged", "tests": "checks", "test": "check", "suite": "battery",
    "project": "codebase", "workspace": "working tree", "behaviour": "behavior",
    "holds": "contains", "library": "module set", "must": "need to", "keep": "continue",
}  # fmt: skip
_PROTECTED = re.compile(r"```.*?```|`[^`]*`|^    .*$", re.S | re.M)


def paraphrase_instruction(task_dir: Path) -> None:
    """Prose reworded through `SYNONYMS`, paragraphs after the title in reverse order, and a
    lead sentence; code spans and code blocks left as they are."""
    path = task_dir / "instruction.md"
    text = path.read_text()
    kept: list[str] = []

    def protect(match: re.Match[str]) -> str:
        kept.append(match.group(0))
        return f"\x00{len(kept) - 1}\x00"

    words = re.compile(r"\b(" + "|".join(sorted(SYNONYMS, key=len, reverse=True)) + r")\b", re.I)

    def swap(match: re.Match[str]) -> str:
        word = match.group(1)
        new = SYNONYMS[word.lower()]
        return new[0].upper() + new[1:] if word[0].isupper() else new

    prose = words.sub(swap, _PROTECTED.sub(protect, text))
    title, _, body = prose.partition("\n\n")
    paragraphs = [p for p in body.split("\n\n") if p.strip()]
    prose = "\n\n".join([title, "Here is what needs doing.", *reversed(paragraphs)]) + "\n"
    path.write_text(re.sub("\x00(\\d+)\x00", lambda m: kept[int(m.group(1))], prose))


def set_task_id(task_dir: Path, task_id: str) -> None:
    toml = task_dir / "task.toml"
    document = tomllib.loads(toml.read_text())
    document["rollyard"]["id"] = task_id
    toml.write_bytes(tomli_w.dumps(document).encode())


TRANSFORMS: dict[str, Callable[[Path, random.Random], None]] = {
    "renamed": rename_identifiers,
    "reformatted": lambda d, _rng: reformat_code(d),
    "reordered": lambda d, _rng: reorder_tests(d),
    "paraphrased": lambda d, _rng: paraphrase_instruction(d),
}


def plant(original: Item, kind: str, dest_root: Path, seed: int) -> Item:
    task_id = f"{original.task_id}-copy-{kind}"
    dest = dest_root / task_id
    shutil.copytree(original.task_dir, dest)
    rng = random.Random(f"{seed}:{task_id}")
    steps = list(TRANSFORMS) if kind == "all" else [kind] if kind in TRANSFORMS else []
    for step in steps:
        TRANSFORMS[step](dest, rng)
    set_task_id(dest, task_id)
    return dataclasses.replace(original, task_dir=dest, task_id=task_id, kind=kind)


# -- the curation stage ----------------------------------------------------------------------------


@dataclasses.dataclass
class StageTimes:
    """Seconds per task of the fingerprint stage, by step."""

    load_and_solution_s: list[float] = dataclasses.field(default_factory=list)
    """Load the task and run its reference solution in a sandbox (the oracle runs do this
    already: curation pays it once)."""
    fingerprint_s: list[float] = dataclasses.field(default_factory=list)
    """What this stage adds: the fingerprint of every part."""
    decide_s: list[float] = dataclasses.field(default_factory=list)
    """`decide`, per task of the batch."""


def _solution(task: Task) -> CandidateChanges:
    """The reference solution's changes; a sandbox that breaks (a loaded shared host) is tried
    again."""
    for attempt in range(ATTEMPTS):
        try:
            return solution_changes(task)
        except SandboxError as error:
            if attempt == ATTEMPTS - 1:
                raise
            print(f"{task.id}: sandbox error, trying again: {error}", file=sys.stderr)
    raise AssertionError("unreachable")


def fingerprint_stage(
    items: Sequence[Item], settings: CurationSettings, times: StageTimes
) -> list[TaskChecks]:
    """Per task: load, reference solution (one sandbox), fingerprint."""
    checks = []
    for item in items:
        started = time.perf_counter()
        task = load_task(item.task_dir)
        solution = _solution(task)
        solved = time.perf_counter()
        print_ = task_fingerprint(task, solution, settings)
        times.load_and_solution_s.append(solved - started)
        times.fingerprint_s.append(time.perf_counter() - solved)
        checks.append(
            TaskChecks(
                task_dir=str(item.task_dir),
                task_id=task.id,
                task_version=task.version,
                family=task.family,
                source=task.source,
                declared_difficulty=None,
                n_fail_to_pass=len(task.fail_to_pass),
                n_pass_to_pass=len(task.pass_to_pass),
                reasons=(),
                flip_rates={},
                runs=0,
                solution_passes=True,
                fingerprint=print_,
                difficulty=None,
            )
        )
    return checks


@dataclasses.dataclass
class Tally:
    """Flagged tasks of one rule against the labels."""

    rule: str
    scenario: str
    expected: int = 0
    flagged: int = 0
    true_positives: int = 0
    wrong_other: int = 0
    """Flagged copies whose named other task is not of their group."""

    def row(self) -> str:
        precision = self.true_positives / self.flagged if self.flagged else 1.0
        recall = self.true_positives / self.expected if self.expected else 1.0
        return (f"| {self.rule} | {self.scenario} | {self.expected} | {self.flagged} | "
                f"{self.true_positives} | {self.flagged - self.true_positives} | "
                f"{precision:.0%} | {recall:.0%} |")  # fmt: skip


def judge(
    verdicts: Sequence[TaskVerdict],
    items: dict[str, Item],
    rules: frozenset[str],
    positive: Callable[[Item], bool],
    group_of_other: Callable[[str], str | None],
    tally: Tally,
    by_kind: dict[str, list[int]],
    false_rejections: list[str],
) -> None:
    for verdict in verdicts:
        item = items[verdict.task_id]
        hits = [r for r in verdict.reasons if r.rule in rules]
        expected = positive(item)
        tally.expected += expected
        if hits:
            tally.flagged += 1
            right = expected and all(group_of_other(r.other or "") == item.group for r in hits[:1])
            tally.true_positives += right
            tally.wrong_other += expected and not right
        if item.kind is not None and expected:
            by_kind.setdefault(item.kind, [0, 0])
            by_kind[item.kind][0] += 1
            by_kind[item.kind][1] += bool(hits)
        if item.kind is None and not expected and hits:
            false_rejections.append(f"{verdict.task_id}: {hits[0]}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--demo-tasks", type=int, default=40)
    parser.add_argument("--synth-tasks", type=int, default=8, help="per repository")
    parser.add_argument("--originals", type=int, default=6, help="tasks copied per scenario")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument(
        "--workdir",
        type=Path,
        default=None,
        help="keep the generated tasks here and reuse them in a later run with the same "
        "arguments (default: a temporary directory, removed at the end)",
    )
    args = parser.parse_args(argv)
    settings = CurationSettings()
    rng = random.Random(args.seed)
    # Task files are read by the unprivileged sandbox user: not under a 0700 temp dir.
    root = args.workdir or Path(tempfile.mkdtemp(prefix="rollyard-curation-bench-", dir="/var/tmp"))
    root.mkdir(parents=True, exist_ok=True)
    root.chmod(0o755)
    for scratch in [p for p in root.iterdir() if p.name != "corpus"]:
        shutil.rmtree(scratch)  # copies and evaluation sets of an earlier run
    try:
        started = time.perf_counter()
        distinct, same_bugs = distinct_tasks(root, args.demo_tasks, args.synth_tasks, args.seed)
        generation_s = time.perf_counter() - started
        by_origin: dict[str, list[Item]] = {}
        for item in distinct:
            by_origin.setdefault(item.origin, []).append(item)
        print(f"distinct tasks: {len(distinct)} ({', '.join(f'{k} {len(v)}' for k, v in by_origin.items())}); "
              f"demo tasks set aside as the same bug set again: {same_bugs}; generated in {generation_s:.0f} s")  # fmt: skip

        def sample(count: int, exclude: Iterable[Item] = ()) -> list[Item]:
            skip = {i.task_id for i in exclude}
            picked: list[Item] = []
            for origin in by_origin.values():  # every origin copied, round robin
                pool = [i for i in origin if i.task_id not in skip]
                picked += rng.sample(pool, min(len(pool), max(1, count // len(by_origin))))
            return picked[:count] if len(picked) >= count else picked

        eval_root = root / "eval"
        eval_root.mkdir()

        # Fingerprints of every distinct task once; copies per scenario.
        times = StageTimes()
        distinct_checks = fingerprint_stage(distinct, settings, times)
        checks_of = {c.task_id: c for c in distinct_checks}
        items = {i.task_id: i for i in distinct}

        tallies: list[Tally] = []
        by_kind: dict[str, dict[str, list[int]]] = {}
        false_rejections: list[str] = []

        def group_of(task_id: str) -> str | None:
            base = task_id.split(" ")[0]
            return items[base].group if base in items else None

        def timed_decide(checks: Sequence[TaskChecks], **kwargs: Any) -> list[TaskVerdict]:
            begun = time.perf_counter()
            verdicts = decide(checks, settings, **kwargs)
            times.decide_s.append((time.perf_counter() - begun) / max(1, len(checks)))
            return verdicts

        def copies_of(originals: Sequence[Item], where: Path) -> list[TaskChecks]:
            where.mkdir()
            planted = [plant(o, kind, where, args.seed) for o in originals for kind in KINDS]
            checks = fingerprint_stage(planted, settings, times)
            items.update({p.task_id: p for p in planted})
            return checks

        # 1. One batch: distinct tasks and copies of some of them.
        originals = sample(args.originals)
        planted = copies_of(originals, root / "copies-1")
        tally = Tally("exact_duplicate + near_duplicate", "1. one batch")
        judge(timed_decide([*distinct_checks, *planted]), items, DUPLICATE_RULES,
              lambda i: i.kind is not None, group_of, tally, by_kind.setdefault("1. one batch", {}),
              false_rejections)  # fmt: skip
        tallies.append(tally)

        # 2. Two batches: batch 1 admitted and recorded; batch 2 holds the rest and copies of
        # batch-1 tasks, compared with the fingerprints batch 1's rows carry.
        first, second = distinct_checks[::2], distinct_checks[1::2]
        first_ids = {c.task_id for c in first}
        rows = verdict_rows(timed_decide(first))
        for row in rows:
            row["batch_id"] = "batch-1"
        earlier, unreadable = earlier_admitted(json.loads(json.dumps(rows)))  # as stored
        assert not unreadable and len(earlier) == len(first), (unreadable, len(earlier))
        originals2 = [items[c.task_id] for c in first][: args.originals]
        planted2 = copies_of(originals2, root / "copies-2")
        tally = Tally("exact_duplicate + near_duplicate", "2. against batch 1")
        judge(timed_decide([*second, *planted2], earlier=earlier), items, DUPLICATE_RULES,
              lambda i: i.kind is not None and i.group in {items[t].group for t in first_ids},
              group_of, tally, by_kind.setdefault("2. against batch 1", {}), false_rejections)  # fmt: skip
        tallies.append(tally)

        # 3. Evaluation set of held-out tasks; the library holds their siblings and copies.
        held_out = sample(args.originals, exclude=originals)
        for item in held_out:
            shutil.copytree(item.task_dir, eval_root / item.task_id)
        eval_set = load_eval_set(sorted(eval_root.iterdir()), settings)
        held_ids = {i.task_id for i in held_out}
        library = [checks_of[i.task_id] for i in distinct if i.task_id not in held_ids]
        planted3 = copies_of(held_out, root / "copies-3")
        for policy in ("instance", "off"):
            tally = Tally("contaminated", f"3. evaluation set, {policy}")
            verdicts = timed_decide(
                [*library, *planted3], eval_set=eval_set, decontamination=policy
            )
            assert all(v.decontamination == policy for v in verdicts)
            judge(verdicts, items, EVAL_RULES,
                  (lambda i: i.kind is not None) if policy == "instance" else (lambda i: False),
                  group_of, tally, by_kind.setdefault(f"3. evaluation set, {policy}", {}),
                  false_rejections)  # fmt: skip
            tallies.append(tally)

        # 4. Repository policy: two tasks of the first repository held out.
        repo_a, repo_b = list(REPOSITORIES)
        held_a = by_origin[repo_a][:2]
        repo_eval = root / "eval-repository"
        repo_eval.mkdir()
        for item in held_a:
            shutil.copytree(item.task_dir, repo_eval / item.task_id)
        repo_set = load_eval_set(sorted(repo_eval.iterdir()), settings)
        held_a_ids = {i.task_id for i in held_a}
        synthesized = [checks_of[i.task_id] for i in [*by_origin[repo_a], *by_origin[repo_b]]
                       if i.task_id not in held_a_ids]  # fmt: skip
        for policy in ("repository", "instance"):
            tally = Tally("eval_repository" if policy == "repository" else "contaminated",
                          f"4. repository {repo_a} in eval, {policy}")  # fmt: skip
            verdicts = timed_decide(synthesized, eval_set=repo_set, decontamination=policy)
            rules = frozenset({"eval_repository"}) if policy == "repository" else EVAL_RULES
            judge(verdicts, items, rules,
                  (lambda i: i.origin == repo_a) if policy == "repository" else (lambda i: False),
                  lambda other: items[other].group if other in items else None,
                  tally, {}, false_rejections)  # fmt: skip
            if policy == "repository":
                # Evidence names an evaluation task of the same repository.
                tally.true_positives = sum(
                    1 for v in verdicts
                    if items[v.task_id].origin == repo_a
                    and any(r.rule == "eval_repository" and r.other in held_a_ids for r in v.reasons)
                )  # fmt: skip
            tallies.append(tally)

        # Margins: the most similar distinct pair against the least similar copy, per part.
        prints = [c.fingerprint for c in distinct_checks if c.fingerprint]
        template = instruction_templates(prints, settings)
        highest = {p: 0.0 for p in PARTS}
        for i, left in enumerate(prints):
            for right in prints[i + 1 :]:
                match = compare(left, right, template, settings)
                for part, value in match.similarity.items():
                    highest[part] = max(highest[part], value)
        lowest: dict[str, dict[str, float]] = {}
        for check in planted:
            item = items[check.task_id]
            original = checks_of[item.task_id.split("-copy-")[0]]
            assert check.fingerprint and original.fingerprint
            match = compare(check.fingerprint, original.fingerprint, template, settings)
            row = lowest.setdefault(item.kind or "", {})
            for part, value in match.similarity.items():
                row[part] = min(row.get(part, 1.0), value)

        figures = {
            "distinct_tasks": {k: len(v) for k, v in by_origin.items()},
            "demo_same_bug_set_set_aside": same_bugs,
            "tallies": [dataclasses.asdict(t) for t in tallies],
            "recall_by_kind": by_kind,
            "false_rejections": false_rejections,
            "ms_per_task": {
                step: {
                    "median": round(1000 * statistics.median(values), 2),
                    "p95": round(1000 * sorted(values)[int(0.95 * (len(values) - 1))], 2),
                }
                for step, values in dataclasses.asdict(times).items()
            },
            "highest_distinct_similarity": {k: round(v, 3) for k, v in highest.items()},
            "lowest_copy_similarity": {
                k: {p: round(v, 3) for p, v in row.items()} for k, row in lowest.items()
            },
        }
        print()
        print("| rule | scenario | expected | flagged | right | wrong | precision | recall |")
        print("|---|---|---|---|---|---|---|---|")
        for tally in tallies:
            print(tally.row())
        print()
        print("| scenario | " + " | ".join(KINDS) + " |")
        print("|---|" + "---|" * len(KINDS))
        for scenario, kinds in by_kind.items():
            if kinds:
                cells = [f"{kinds[k][1]}/{kinds[k][0]}" if k in kinds else "-" for k in KINDS]
                print(f"| {scenario} | " + " | ".join(cells) + " |")
        print()
        print(
            "| part | most similar distinct pair | "
            + " | ".join(f"least similar copy: {k}" for k in KINDS)
            + " |"
        )
        print("|---|---|" + "---|" * len(KINDS))
        for part in PARTS:
            cells = [f"{lowest[k][part]:.2f}" if part in lowest.get(k, {}) else "-" for k in KINDS]
            print(f"| {part} | {highest[part]:.2f} | " + " | ".join(cells) + " |")
        print()
        print(f"false rejections of distinct tasks: {len(false_rejections)}")
        for line in false_rejections[:10]:
            print(f"  {line}")
        print()
        labels = {
            "load_and_solution_s": "load the task, run its reference solution in a sandbox",
            "fingerprint_s": "fingerprint every part",
            "decide_s": "decide (duplicates, decontamination), per task of the batch",
        }
        print("| step, per task | median ms | p95 ms |")
        print("|---|---|---|")
        for step, value in figures["ms_per_task"].items():
            print(f"| {labels[step]} | {value['median']} | {value['p95']} |")
        if args.json:
            args.json.write_text(json.dumps(figures, indent=2, sort_keys=True))
        instance_ok = not false_rejections and all(
            t.true_positives == t.expected and t.flagged == t.true_positives for t in tallies
        )
        print(f"targets: {'PASS' if instance_ok else 'FAIL'}")
        return 0 if instance_ok else 1
    finally:
        if args.workdir is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main())
