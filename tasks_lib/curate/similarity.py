"""Duplicates and contamination: exact and MinHash-LSH near-duplicates (within the library and
against an evaluation set), 13-gram overlap with the evaluation set, and fix lines quoted in the
instruction.

A task's text is its instruction, its test files (visible, hidden and the Harbor `tests/`) and
its solution files; the untouched workspace source is left out because a family's tasks share
most of it by design (demo tasks over the same modules score 0.94 Jaccard on it, under 0.5 on
this text). Near-duplicates are searched twice: over the raw tokens (near copies) and over tokens
whose identifiers are renamed in order of first use (copies with renamed names).
"""

from __future__ import annotations

import builtins
import dataclasses
import hashlib
import keyword
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path

from datasketch import LeanMinHash, MinHash, MinHashLSH

from tasks_lib.curate.reasons import Reason
from tasks_lib.curate.settings import CurationSettings
from tasks_lib.format.globs import first_match
from tasks_lib.format.model import TEST_FILE_GLOBS, Task
from tasks_lib.verify.candidate import CandidateChanges

_TOKEN = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|\d+|[^\w\s]")
_KEEP = frozenset(keyword.kwlist) | frozenset(dir(builtins))
_MAX_FILE_BYTES = 1 << 20


def _read(path: Path) -> str:
    try:
        return path.read_bytes()[:_MAX_FILE_BYTES].decode("utf-8", errors="replace")
    except OSError:
        return ""


def _files(root: Path | None, keep: Sequence[str] | None = None) -> list[str]:
    if root is None or not root.is_dir():
        return []
    texts = []
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink()):
        rel = path.relative_to(root).as_posix()
        if keep is not None and not first_match(keep, rel):
            continue
        texts.append(f"# {rel}\n{_read(path)}")
    return texts


def problem_text(task: Task) -> str:
    """What an evaluation item is (instruction and test code, visible and hidden): the text
    n-gram contamination compares, as GPT-3's filter compares evaluation prompts and tests."""
    parts = [task.instruction]
    parts += _files(task.snapshot_dir, TEST_FILE_GLOBS)
    parts += _files(task.hidden_dir)
    return "\n".join(parts)


def task_text(task: Task) -> str:
    """The text duplicates are judged on: the problem plus the Harbor tests dir and the
    solution (two tasks with one fix are one task; see the module docstring)."""
    parts = [problem_text(task)]
    parts += _files(task.tests_dir)
    parts += _files(task.solution_dir)
    return "\n".join(parts)


def tokens(text: str) -> list[str]:
    return _TOKEN.findall(text)


def renamed(words: Sequence[str]) -> list[str]:
    """Identifiers replaced by `v0, v1, ...` in order of first use (keywords, builtins kept)."""
    names: dict[str, str] = {}
    out = []
    for word in words:
        if (word[0].isalpha() or word[0] == "_") and word not in _KEEP:
            word = names.setdefault(word, f"v{len(names)}")
        out.append(word)
    return out


def _shingles(words: Sequence[str], size: int) -> set[bytes]:
    if len(words) < size:
        return {" ".join(words).encode()} if words else set()
    return {" ".join(words[i : i + size]).encode() for i in range(len(words) - size + 1)}


def _minhash(shingles: Iterable[bytes], num_perm: int) -> LeanMinHash:
    sketch = MinHash(num_perm=num_perm, seed=1)
    sketch.update_batch(list(shingles))
    return LeanMinHash(sketch)


def _ngram_hashes(words: Sequence[str], n: int) -> frozenset[int]:
    # Stable across processes (Python's hash() is salted per process; Dask workers differ).
    lowered = [w.lower() for w in words]
    return frozenset(
        int.from_bytes(
            hashlib.blake2b(" ".join(lowered[i : i + n]).encode(), digest_size=8).digest(), "little"
        )
        for i in range(len(lowered) - n + 1)
    )


@dataclasses.dataclass(frozen=True, slots=True)
class Fingerprint:
    """What dedup and contamination need of one task; picklable, so the map step computes it."""

    task_id: str
    exact: str
    """sha256 of the whitespace-normalized text."""
    raw: LeanMinHash
    renamed: LeanMinHash
    ngrams: frozenset[int]


def fingerprint(task: Task, settings: CurationSettings) -> Fingerprint:
    text = task_text(task)
    words = tokens(text)
    exact = hashlib.sha256(" ".join(text.split()).encode()).hexdigest()
    return Fingerprint(
        task_id=task.id,
        exact=exact,
        raw=_minhash(_shingles(words, settings.shingle_tokens), settings.num_perm),
        renamed=_minhash(_shingles(renamed(words), settings.shingle_tokens), settings.num_perm),
        ngrams=_ngram_hashes(tokens(problem_text(task)), settings.contamination_ngram),
    )


class DuplicateIndex:
    """Exact hashes and two MinHash LSH indexes over the tasks added so far."""

    def __init__(self, settings: CurationSettings) -> None:
        self.settings = settings
        self._exact: dict[str, str] = {}
        self._prints: dict[str, Fingerprint] = {}
        self._raw = MinHashLSH(
            threshold=settings.near_duplicate_threshold, num_perm=settings.num_perm
        )
        self._renamed = MinHashLSH(
            threshold=settings.near_duplicate_threshold, num_perm=settings.num_perm
        )

    def __len__(self) -> int:
        return len(self._prints)

    def add(self, key: str, print_: Fingerprint) -> None:
        if key in self._prints:
            raise ValueError(
                f"task {key!r} is in the duplicate index twice; task ids must be unique"
            )
        self._exact.setdefault(print_.exact, key)
        self._prints[key] = print_
        self._raw.insert(key, print_.raw)
        self._renamed.insert(key, print_.renamed)

    def matches(self, print_: Fingerprint) -> list[tuple[str, str, float]]:
        """(key, how, similarity) of indexed tasks this one duplicates, most similar first."""
        found: dict[str, tuple[str, float]] = {}
        exact = self._exact.get(print_.exact)
        if exact is not None:
            found[exact] = ("exact", 1.0)
        for how, lsh, sketch in (("near", self._raw, print_.raw),
                                 ("renamed", self._renamed, print_.renamed)):  # fmt: skip
            for key in lsh.query(sketch):
                other = self._prints[key]
                similarity = sketch.jaccard(other.raw if how == "near" else other.renamed)
                if similarity >= self.settings.near_duplicate_threshold and key not in found:
                    found[key] = (how, similarity)
        return sorted(((k, h, s) for k, (h, s) in found.items()), key=lambda m: (-m[2], m[0]))


def duplicate_reasons(
    print_: Fingerprint, library: DuplicateIndex, evaluation: DuplicateIndex | None
) -> list[Reason]:
    reasons = []
    for key, how, similarity in library.matches(print_)[:1]:
        rule = "exact_duplicate" if how == "exact" else "near_duplicate"
        reasons.append(Reason(rule, _describe(key, how, similarity)))
    if evaluation is not None:
        for key, how, similarity in evaluation.matches(print_)[:1]:
            reasons.append(Reason("eval_duplicate", _describe(key, how, similarity)))
    return reasons


def _describe(key: str, how: str, similarity: float) -> str:
    if how == "exact":
        return f"same normalized text as {key}"
    what = "after renaming identifiers, " if how == "renamed" else ""
    return f"{what}estimated Jaccard {similarity:.2f} with {key}"


@dataclasses.dataclass(frozen=True, slots=True)
class EvalSet:
    """The evaluation tasks' fingerprints, their duplicate index and the n-grams that count."""

    prints: tuple[Fingerprint, ...]
    template_ngrams: frozenset[int]
    """n-grams so common across the evaluation set that they are family boilerplate."""

    def index(self, settings: CurationSettings) -> DuplicateIndex:
        index = DuplicateIndex(settings)
        for print_ in self.prints:
            index.add(print_.task_id, print_)
        return index


def build_eval_set(tasks: Sequence[Task], settings: CurationSettings) -> EvalSet:
    prints = tuple(fingerprint(task, settings) for task in tasks)
    template: frozenset[int] = frozenset()
    if len(prints) >= settings.template_min_docs:
        counts = Counter(h for p in prints for h in p.ngrams)
        floor = settings.template_doc_share * len(prints)
        template = frozenset(h for h, c in counts.items() if c >= floor)
    return EvalSet(prints, template)


def contamination_reasons(
    print_: Fingerprint, eval_set: EvalSet, settings: CurationSettings
) -> list[Reason]:
    """Shared n-grams (boilerplate left out) with the most-overlapping evaluation task."""
    best: tuple[int, str] = (0, "")
    for other in eval_set.prints:
        shared = len((print_.ngrams & other.ngrams) - eval_set.template_ngrams)
        if shared > best[0]:
            best = (shared, other.task_id)
    if best[0] >= settings.min_shared_ngrams:
        return [Reason("contaminated",
                       f"{best[0]} shared {settings.contamination_ngram}-grams with {best[1]}")]  # fmt: skip
    return []


def fix_lines(task: Task, solution: CandidateChanges, settings: CurationSettings) -> list[str]:
    """Lines the reference solution adds (stripped, at least `min_fix_line_chars` long)."""
    added: list[str] = []
    for path, data in sorted(solution.files.items()):
        new = data.decode("utf-8", errors="replace").splitlines()
        old = set(_read(task.snapshot_dir / path).splitlines())
        for line in new:
            if line in old:
                continue
            stripped = line.strip()
            if len(stripped) >= settings.min_fix_line_chars and re.search(r"\w", stripped):
                added.append(stripped)
    return added


def fix_in_instruction_reasons(
    task: Task, solution: CandidateChanges, settings: CurationSettings
) -> list[Reason]:
    instruction = " ".join(task.instruction.split())
    quoted = [line for line in fix_lines(task, solution, settings)
              if " ".join(line.split()) in instruction]  # fmt: skip
    if not quoted:
        return []
    return [
        Reason("fix_in_instruction", f"{len(quoted)} fix line(s) quoted, e.g. {quoted[0][:80]!r}")
    ]
