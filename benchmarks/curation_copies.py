"""The curation benchmark's planted copies of a distinct task under a new task id: identifiers
renamed, code reformatted, tests reordered, the instruction paraphrased, or all at once
(`plant`)."""

from __future__ import annotations

import ast
import builtins
import dataclasses
import difflib
import keyword
import random
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import tomli_w
from curation_corpus import Item

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
