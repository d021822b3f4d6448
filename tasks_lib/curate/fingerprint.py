"""Fingerprints of what tells one task from another, each part normalised so that renamed
identifiers, reformatted code, reworded instructions and reordered tests do not hide a copy.

The distinguishing parts (`PARTS`):

- `instruction`: the set of its content-word stems (English function words dropped, Snowball
  stems), so reworded sentences, reordered sentences and inflections keep most of it;
- `change`: the edits from the broken to the reference state, file by file: code parsed and
  unparsed (formatting, comments and docstrings gone), identifiers numbered in order of first use
  in the reference file, and each token edit kept with `shingle_tokens - 1` tokens of context;
- `failing_tests`: the bodies of the fail_to_pass tests (their inputs and expected values), each
  normalised alone, so neither their names nor their order count;
- `hidden_tests`: the same over the hidden tests.

The environment (the workspace's non-test files, which a family's or a repository's tasks share)
is fingerprinted as context: it names the code base for the `repository` decontamination policy
and is reported beside a match, but never makes two tasks one.
"""

from __future__ import annotations

import ast
import base64
import binascii
import builtins
import dataclasses
import difflib
import hashlib
import keyword
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import snowballstemmer
from datasketch import LeanMinHash, MinHash

from tasks_lib.format.globs import first_match
from tasks_lib.format.model import BYTECODE_GLOBS, CONFTEST_GLOBS, TEST_FILE_GLOBS, Task
from tasks_lib.verify.candidate import CandidateChanges

PARTS = ("instruction", "change", "failing_tests", "hidden_tests")
"""The parts of a task that tell it apart, in the order evidence lists them."""
CODE_PARTS = PARTS[1:]
"""The parts held as MinHash sketches (code, normalised); the instruction is a word set."""
ENVIRONMENT = "environment"
FINGERPRINT_VERSION = 1
"""Bumped whenever a normalisation changes: prints of another version are not comparable."""

_SEED = 1
_MAX_FILE_BYTES = 1 << 20
_MAX_ENVIRONMENT_BYTES = 4 << 20
"""The environment is read in path order up to this much: a stable sample of a large repository
(tasks of one repository read the same files), at a bounded cost per task."""
# Not the soft keywords: `_`, `match` and `case` are names in most code that uses them.
_KEPT_NAMES = frozenset(keyword.kwlist) | frozenset(dir(builtins))
_STRING = r"""[rRbBuUfF]{0,2}(?:'(?:[^'\\\n]|\\.)*'|"(?:[^"\\\n]|\\.)*")"""
_STRING_PREFIX = re.compile(r"[rRbBuUfF]{1,2}(?=['\"])")
_CODE_TOKEN = re.compile(rf"{_STRING}|[A-Za-z_][A-Za-z0-9_]*|\d[\w.]*|\S")
_STRING_OR_COMMENT = re.compile(rf"({_STRING})|#.*")
_WORD = re.compile(r"[^\W_]+")
_LINE_BREAK = ";"

# English function words: they carry the phrasing of an instruction, not what it asks.
_STOPWORD_TEXT = """a about above after again against all also am an and any are aren as at be because been
    before being below between both but by can cannot could couldn did didn do does doesn doing
    don down during each either else ever every few for from further had hadn has hasn have haven
    having he her here hers herself him himself his how however i if in into is isn it its itself
    just let ll may me might more most must mustn my myself need no nor not now of off on once
    only or other ought our ours ourselves out over own please re s same shall shan she should
    shouldn so some such t than that the their theirs them themselves then there these they this
    those though through thus to too under until up upon us ve very was wasn we were weren what
    when where whether which while who whom whose why will with within without won would wouldn
    yet you your yours yourself yourselves"""
_STOPWORDS = frozenset(_STOPWORD_TEXT.split())


# -- values -----------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class PartPrint:
    """One part of a task, normalised: an exact hash, a MinHash sketch and the shingle count."""

    exact: str
    """sha256 of the normalised part: equal hashes, equal parts."""
    sketch: LeanMinHash
    size: int
    """Distinct shingles behind the sketch (for containment estimates)."""

    def jaccard(self, other: PartPrint) -> float:
        """Estimated Jaccard similarity of the two shingle sets (1.0 for equal parts)."""
        if self.exact == other.exact:
            return 1.0
        return float(self.sketch.jaccard(other.sketch))

    def containment(self, other: PartPrint) -> float:
        """Estimated share of the smaller set found in the larger one: |A∩B| / min(|A|, |B|),
        from |A∩B| = J / (1 + J) * (|A| + |B|)."""
        similarity = self.jaccard(other)
        shared = similarity / (1.0 + similarity) * (self.size + other.size)
        return min(1.0, shared / max(1, min(self.size, other.size)))

    def to_json(self) -> dict[str, Any]:
        values = np.asarray(self.sketch.hashvalues)
        return {
            "exact": self.exact,
            "size": self.size,
            "scheme": self.sketch.scheme,
            "dtype": values.dtype.str,
            "hashvalues": base64.b64encode(values.tobytes()).decode(),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PartPrint:
        values = np.frombuffer(base64.b64decode(data["hashvalues"]), dtype=np.dtype(data["dtype"]))
        sketch = LeanMinHash(seed=_SEED, hashvalues=values, scheme=data["scheme"])
        return cls(exact=str(data["exact"]), sketch=sketch, size=int(data["size"]))


@dataclasses.dataclass(frozen=True, slots=True)
class Fingerprint:
    """What dedup and decontamination compare of one task; picklable, so the map step computes
    it, and JSON-able, so later batches compare against it from the store."""

    task_id: str
    family: str
    """The task's family: instructions of one family share a template (see `similarity`)."""
    instruction: frozenset[str]
    """The instruction's content-word stems. Kept whole (a few hundred words at most), not
    sketched, so words that every instruction of a template shares can be left out when two
    tasks are compared (see `similarity`)."""
    instruction_exact: str
    """sha256 of the stems in order: the normalised instruction."""
    parts: Mapping[str, PartPrint]
    """The code parts the task has (`change`, `failing_tests`, `hidden_tests`): a task without
    hidden tests has no `hidden_tests`, one whose solution did not run has no `change`."""
    environment: PartPrint | None
    """The shared code base: context and the `repository` policy only."""

    @property
    def exact(self) -> str:
        """sha256 over every distinguishing part's exact hash: the task's normalised identity."""
        hashes = [f"instruction={self.instruction_exact}"]
        hashes += [f"{name}={self.parts[name].exact}" for name in CODE_PARTS if name in self.parts]
        return hashlib.sha256("\n".join(hashes).encode()).hexdigest()

    @property
    def num_perm(self) -> int | None:
        """MinHash permutations of the sketches (None for a print without any)."""
        sketches = [*self.parts.values(), *([self.environment] if self.environment else [])]
        return len(sketches[0].sketch) if sketches else None

    def to_json(self) -> dict[str, Any]:
        return {
            "version": FINGERPRINT_VERSION,
            "task_id": self.task_id,
            "family": self.family,
            "instruction": sorted(self.instruction),
            "instruction_exact": self.instruction_exact,
            "parts": {name: part.to_json() for name, part in self.parts.items()},
            ENVIRONMENT: self.environment.to_json() if self.environment else None,
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Fingerprint:
        """The print `to_json` wrote; ValueError for another version or a damaged one."""
        if data.get("version") != FINGERPRINT_VERSION:
            raise ValueError(
                f"fingerprint version {data.get('version')!r}, this rollyard reads "
                f"{FINGERPRINT_VERSION}; curate the task again to refresh it"
            )
        try:
            environment = data.get(ENVIRONMENT)
            return cls(
                task_id=str(data["task_id"]),
                family=str(data["family"]),
                instruction=frozenset(str(word) for word in data["instruction"]),
                instruction_exact=str(data["instruction_exact"]),
                parts={str(k): PartPrint.from_json(v) for k, v in data["parts"].items()},
                environment=PartPrint.from_json(environment) if environment else None,
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as error:
            raise ValueError(f"damaged fingerprint: {type(error).__name__}: {error}") from None


# -- normalisation ----------------------------------------------------------------------------


def instruction_words(text: str) -> list[str]:
    """The content-word stems of an instruction, in order: lower-cased words (identifiers split
    at underscores and dots), English function words dropped, Snowball-stemmed."""
    words = [word for word in _WORD.findall(text.lower()) if word not in _STOPWORDS]
    # A stemmer keeps state between calls; one per call keeps threads apart.
    stems: list[str] = snowballstemmer.stemmer("english").stemWords(words)
    return stems


def code_lines(text: str, *, python: bool) -> list[str]:
    """Normalised lines of a file: Python is parsed and unparsed (one statement per line, one
    quoting and spacing style, no comments, no docstrings); other text has its runs of white
    space collapsed and blank lines dropped. Python that does not parse is treated as text."""
    if python:
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            tree = None
        if tree is not None:
            _drop_docstrings(tree)
            return [line for line in ast.unparse(tree).splitlines() if line.strip()]
    return [" ".join(line.split()) for line in text.splitlines() if line.strip()]


def _drop_docstrings(tree: ast.AST) -> None:
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if (
                body
                and isinstance(body[0], ast.Expr)
                and isinstance(body[0].value, ast.Constant)
                and isinstance(body[0].value.value, str)
            ):
                node.body = body[1:] or [ast.Pass()]


def line_tokens(lines: Sequence[str]) -> list[str]:
    """Tokens of normalised lines, each line ended by a line-break token and its indentation
    depth kept (it is structure in Python). An f-string is opened up: the names in it are code."""
    tokens: list[str] = []
    for line in lines:
        depth = (len(line) - len(line.lstrip(" "))) // 4
        if depth:
            tokens.append(f"<{depth}>")
        for token in _CODE_TOKEN.findall(line):
            prefix = _STRING_PREFIX.match(token)
            if prefix and "f" in prefix.group(0).lower() and len(token) > prefix.end() + 1:
                start = prefix.end()
                tokens += [
                    token[: start + 1],
                    *_CODE_TOKEN.findall(token[start + 1 : -1]),
                    token[-1],
                ]
            else:
                tokens.append(token)
        tokens.append(_LINE_BREAK)
    return tokens


def numbered(tokens: Iterable[str], names: dict[str, str] | None = None) -> list[str]:
    """Identifiers replaced by `v0, v1, ...` in order of first use (keywords and builtins kept;
    literals kept, so expected values still count). `names` carries a numbering across calls."""
    names = {} if names is None else names
    return [
        names.setdefault(token, f"v{len(names)}")
        if token.isidentifier() and token not in _KEPT_NAMES
        else token
        for token in tokens
    ]


def _is_python(path: str) -> bool:
    return path.endswith((".py", ".pyi"))


def _read(path: Path, limit: int = _MAX_FILE_BYTES) -> str:
    try:
        with path.open("rb") as handle:
            return handle.read(limit).decode("utf-8", errors="replace")
    except OSError:
        return ""


def _windows(tokens: Sequence[str], size: int) -> Iterator[str]:
    if 0 < len(tokens) < size:
        yield " ".join(tokens)
    for start in range(len(tokens) - size + 1):
        yield " ".join(tokens[start : start + size])


def _part(shingles: Iterable[str], exact_text: str | None, num_perm: int) -> PartPrint | None:
    """The part's print; `exact_text` is its normalised form (None: the sorted shingles)."""
    distinct = sorted({shingle.encode() for shingle in shingles})
    if not distinct:
        return None
    sketch = MinHash(num_perm=num_perm, seed=_SEED)
    sketch.update_batch(distinct)
    digest = hashlib.sha256()
    if exact_text is None:
        for shingle in distinct:
            digest.update(shingle + b"\n")
    else:
        digest.update(exact_text.encode())
    return PartPrint(exact=digest.hexdigest(), sketch=LeanMinHash(sketch), size=len(distinct))


# -- the parts --------------------------------------------------------------------------------


def change_edits(task: Task, solution: CandidateChanges, window: int) -> list[list[str]]:
    """Each token edit of the reference solution as `context, -removed, +added, context`
    (numbered tokens; `window - 1` tokens of context each side), file by file, in path order."""
    edits: list[list[str]] = []
    paths = sorted({*solution.files, *solution.deleted})
    for path in paths:
        if first_match(BYTECODE_GLOBS, path):
            continue
        before_file = task.snapshot_dir / path
        before = _read(before_file) if before_file.is_file() else ""
        data = solution.files.get(path)
        after = data[:_MAX_FILE_BYTES].decode("utf-8", errors="replace") if data else ""
        python = _is_python(path)
        edits += _file_edits(
            code_lines(before, python=python), code_lines(after, python=python), window
        )
    return edits


def _file_edits(before: list[str], after: list[str], window: int) -> list[list[str]]:
    names: dict[str, str] = {}
    # Numbered in the reference file's order first: the same fixed code numbers the same way
    # whatever the bug, and a renamed copy numbers exactly like its original.
    after_lines = [numbered(line_tokens([line]), names) for line in after]
    before_lines = [numbered(line_tokens([line]), names) for line in before]
    before_tokens = [token for line in before_lines for token in line]
    offsets = [0]
    for line in before_lines:
        offsets.append(offsets[-1] + len(line))
    context = max(0, window - 1)
    edits = []
    # Lines first (cheap on a large file), then tokens within each changed block of lines.
    lines = difflib.SequenceMatcher(
        None, [" ".join(x) for x in before_lines], [" ".join(x) for x in after_lines], False
    )
    for tag, i1, i2, j1, j2 in lines.get_opcodes():
        if tag == "equal":
            continue
        old = before_tokens[offsets[i1] : offsets[i2]]
        new = [token for line in after_lines[j1:j2] for token in line]
        for inner, a1, a2, b1, b2 in difflib.SequenceMatcher(None, old, new, False).get_opcodes():
            if inner == "equal":
                continue
            start, end = offsets[i1] + a1, offsets[i1] + a2
            edits.append(
                before_tokens[max(0, start - context) : start]
                + [f"-{t}" for t in old[a1:a2]]
                + [f"+{t}" for t in new[b1:b2]]
                + before_tokens[end : end + context]
            )
    return edits


def change_part(
    task: Task, solution: CandidateChanges, window: int, num_perm: int
) -> PartPrint | None:
    edits = change_edits(task, solution, window)
    shingles = {shingle for edit in edits for shingle in _windows(edit, window)}
    return _part(shingles, "\n".join(sorted(" ".join(edit) for edit in edits)), num_perm)


class _TestSources:
    """Test functions by id, looked up in the hidden overlay first (it replaces workspace files
    at verification), then in the workspace; each file parsed once."""

    def __init__(self, task: Task) -> None:
        self.roots = [root for root in (task.hidden_dir, task.snapshot_dir) if root is not None]
        self._parsed: dict[str, ast.Module | None] = {}

    def _tree(self, rel: str) -> ast.Module | None:
        if rel not in self._parsed:
            tree = None
            for root in self.roots:
                path = root / rel
                if path.is_file():
                    try:
                        tree = ast.parse(_read(path))
                    except (SyntaxError, ValueError, RecursionError, MemoryError):
                        tree = None
                    break
            self._parsed[rel] = tree
        return self._parsed[rel]

    def body(self, test_id: str) -> str | None:
        """Source of the function a pytest id names (parameters left out: the decorator that
        holds them is part of the body), or None when it cannot be found."""
        rel, _, rest = test_id.partition("::")
        tree = self._tree(rel)
        if tree is None or not rest:
            return None
        node: ast.AST = tree
        for name in re.sub(r"\[.*\]$", "", rest).split("::"):
            found = next(
                (
                    child
                    for child in getattr(node, "body", [])
                    if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                    and child.name == name
                ),
                None,
            )
            if found is None:
                return None
            node = found
        return ast.unparse(node)

    def all_tests(self, root: Path) -> list[str]:
        """Every test function (module level, or in a `Test*` class) of the Python files under
        `root`, as ids relative to `root`."""
        ids = []
        for path in sorted(root.rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            tree = self._tree(rel)
            for node in tree.body if tree is not None else []:
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    if node.name.startswith("test"):
                        ids.append(f"{rel}::{node.name}")
                elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                    ids += [
                        f"{rel}::{node.name}::{child.name}"
                        for child in node.body
                        if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)
                        and child.name.startswith("test")
                    ]
        return ids


def _bodies_part(bodies: Iterable[str], window: int, num_perm: int) -> PartPrint | None:
    shingles: set[str] = set()
    normalised = set()
    for body in bodies:
        # Each body numbered on its own: a renamed test, or one moved elsewhere, reads the same.
        tokens = numbered(line_tokens(code_lines(body, python=True)))
        normalised.add(" ".join(tokens))
        shingles.update(_windows(tokens, window))
    return _part(shingles, "\n".join(sorted(normalised)), num_perm)


def _files_text(root: Path, skip: Path | None) -> list[str]:
    """Normalised text of every file under `root` (but `skip`), one entry per file."""
    texts = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        if skip is not None and path.is_relative_to(skip):
            continue
        lines = code_lines(_read(path), python=_is_python(path.name))
        texts.append("\n".join(lines))
    return texts


def failing_tests_part(task: Task, window: int, num_perm: int) -> PartPrint | None:
    """The fail_to_pass tests' bodies; a task that names none (a plain Harbor task, an artifact
    or rules verifier) is judged by its `tests/` directory, the hidden overlay left out."""
    if task.fail_to_pass:
        sources = _TestSources(task)
        bodies = [body for test_id in task.fail_to_pass if (body := sources.body(test_id))]
        return _bodies_part(bodies, window, num_perm)
    if not task.tests_dir.is_dir():
        return None
    texts = _files_text(task.tests_dir, task.hidden_dir)
    shingles = {
        s for text in texts for s in _windows(numbered(line_tokens(text.splitlines())), window)
    }
    return _part(shingles, "\n".join(texts), num_perm)


def hidden_tests_part(task: Task, window: int, num_perm: int) -> PartPrint | None:
    if task.hidden_dir is None or not task.hidden_dir.is_dir():
        return None
    sources = _TestSources(task)
    ids = list(task.hidden_tests) or sources.all_tests(task.hidden_dir)
    bodies = [body for test_id in ids if (body := sources.body(test_id))]
    return _bodies_part(bodies, window, num_perm)


def environment_part(task: Task, window: int, num_perm: int) -> PartPrint | None:
    """The workspace, tests, test configuration and caches left out: what the tasks of one
    repository or one family code base share. One shingle per line: the `2 * window` tokens from
    its start (comments dropped), identifiers numbered within the shingle, so a renamed code base
    reads the same and a change in one place leaves the shingles elsewhere alone."""
    shingles: set[str] = set()
    budget = _MAX_ENVIRONMENT_BYTES
    root = task.snapshot_dir
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if first_match((*TEST_FILE_GLOBS, *CONFTEST_GLOBS, *BYTECODE_GLOBS), rel):
            continue
        if budget <= 0:
            break
        text = _read(path, min(budget, _MAX_FILE_BYTES))
        budget -= len(text)
        # Raw tokens, no parse: cheap on a large repository, and blind to layout.
        lines = [
            _CODE_TOKEN.findall(_STRING_OR_COMMENT.sub(lambda m: m.group(1) or "", line))
            for line in text.splitlines()
        ]
        tokens = [token for line in lines for token in line]
        start = 0
        for line in lines:
            if line:
                shingles.add(" ".join(numbered(tokens[start : start + 2 * window])))
            start += len(line)
    return _part(shingles, None, num_perm)


def fingerprint(
    task: Task, solution: CandidateChanges | None, *, shingle_tokens: int, num_perm: int
) -> Fingerprint:
    """Every part of `task` it has; `solution` (the reference solution's changes) gives the
    `change` part, None leaves it out."""
    window = shingle_tokens
    words = instruction_words(task.instruction)
    parts = {
        "change": change_part(task, solution, window, num_perm) if solution else None,
        "failing_tests": failing_tests_part(task, window, num_perm),
        "hidden_tests": hidden_tests_part(task, window, num_perm),
    }
    return Fingerprint(
        task_id=task.id,
        family=task.family,
        instruction=frozenset(words),
        instruction_exact=hashlib.sha256(" ".join(words).encode()).hexdigest(),
        parts={name: part for name, part in parts.items() if part is not None},
        environment=environment_part(task, window, num_perm),
    )
