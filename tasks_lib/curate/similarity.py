"""Duplicates and contamination, judged on what tells tasks apart (see `fingerprint`), and fix
lines quoted in the instruction.

Two tasks are one task when their changes match (the bug and its fix, normalised) and at least
one more distinguishing part does: the failing tests, the hidden tests, or the instruction beyond
its template. Without a change on both sides, any two matching parts decide. A part matches at
`near_duplicate_threshold` estimated Jaccard (`instruction_threshold` for the instruction, whose
template words, shared by most instructions of its family, are left out first). The shared environment
never makes two tasks one: siblings of a family or of a repository share it by design. It is
reported as context, and under the `repository` decontamination policy it names the code base.

Candidates come from MinHash LSH over the code parts (datasketch), exact copies from the
normalised hashes; each candidate is then compared part by part.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Literal

from datasketch import MinHashLSH

from tasks_lib.curate.fingerprint import CODE_PARTS, PARTS, Fingerprint
from tasks_lib.curate.reasons import Reason
from tasks_lib.curate.settings import CurationSettings
from tasks_lib.format.model import Task
from tasks_lib.verify.candidate import CandidateChanges

Decontamination = Literal["instance", "repository", "off"]
POLICIES: tuple[Decontamination, ...] = ("instance", "repository", "off")
"""`instance` (default): reject a task that is one task with an evaluation task; `repository`:
also reject every task whose code base appears in the evaluation set; `off`: no evaluation set
checks."""
DEFAULT_POLICY: Decontamination = "instance"


def check_policy(name: str) -> Decontamination:
    """`name` as a policy, or ValueError naming the choices."""
    for policy in POLICIES:
        if name == policy:
            return policy
    raise ValueError(f"decontamination policy {name!r}; use one of {', '.join(POLICIES)}")


@dataclasses.dataclass(frozen=True, slots=True)
class Match:
    """How a task compares with another: every part both have, and the shared environment."""

    other: str
    similarity: Mapping[str, float]
    """Estimated Jaccard similarity per compared part (instruction: beyond its template)."""
    matched: tuple[str, ...]
    """Parts at or above their threshold, in `PARTS` order."""
    exact: bool
    """Both tasks have the same parts, each with the same normalised hash."""
    environment: float | None
    """Estimated share of the smaller code base found in the other (context only)."""

    @property
    def score(self) -> float:
        """Mean similarity of the matched parts: ranks the matches of one task."""
        return sum(self.similarity[p] for p in self.matched) / max(1, len(self.matched))

    def evidence(self) -> tuple[tuple[str, float], ...]:
        pairs = [
            (part, round(self.similarity[part], 3)) for part in PARTS if part in self.similarity
        ]
        if self.environment is not None:
            pairs.append(("environment", round(self.environment, 3)))
        return tuple(pairs)

    def describe(self) -> str:
        matched = ", ".join(f"{p} {self.similarity[p]:.2f}" for p in self.matched)
        others = [f"{p} {s:.2f}" for p, s in self.similarity.items() if p not in self.matched]
        if self.environment is not None:
            others.append(f"shared environment {self.environment:.2f}, context only")
        how = "identical after normalising" if self.exact else "matches"
        tail = f" ({'; '.join(others)})" if others else ""
        return f"{how} {self.other} on {matched}{tail}"


Templates = Mapping[str, frozenset[str]]
"""Per family, the words of its instructions' template."""


def instruction_templates(prints: Iterable[Fingerprint], settings: CurationSettings) -> Templates:
    """Per family with at least `template_min_docs` instructions, the words found in at least
    `template_doc_share` of them: the generator's template, which siblings share by design."""
    by_family: dict[str, list[frozenset[str]]] = {}
    for print_ in prints:
        by_family.setdefault(print_.family, []).append(print_.instruction)
    templates = {}
    for family, sets in by_family.items():
        if len(sets) >= settings.template_min_docs:
            counts = Counter(word for words in sets for word in words)
            floor = settings.template_doc_share * len(sets)
            templates[family] = frozenset(w for w, count in counts.items() if count >= floor)
    return templates


def compare(
    left: Fingerprint, right: Fingerprint, templates: Templates, settings: CurationSettings
) -> Match:
    """Part-by-part comparison of two prints (`right` is the other task)."""
    similarity: dict[str, float] = {}
    # Exact: the same normalised instruction and the same code parts, each with one hash.
    exact = (
        left.instruction_exact == right.instruction_exact
        and left.parts.keys() == right.parts.keys()
    )
    left_words = left.instruction - templates.get(left.family, frozenset())
    right_words = right.instruction - templates.get(right.family, frozenset())
    if left_words and right_words:
        similarity["instruction"] = len(left_words & right_words) / len(left_words | right_words)
    for part in CODE_PARTS:
        mine, theirs = left.parts.get(part), right.parts.get(part)
        if mine is not None and theirs is not None:
            similarity[part] = mine.jaccard(theirs)
            exact = exact and mine.exact == theirs.exact
    matched = tuple(
        part
        for part in PARTS
        if part in similarity
        and similarity[part]
        >= (
            settings.instruction_threshold
            if part == "instruction"
            else settings.near_duplicate_threshold
        )
    )
    environment = None
    if left.environment is not None and right.environment is not None:
        environment = left.environment.containment(right.environment)
    return Match(right.task_id, similarity, matched, exact and bool(similarity), environment)


def same_task(match: Match) -> bool:
    """The rule of the module docstring: the change and one more part, or any two parts."""
    compared = match.similarity.keys()
    if "change" in compared:
        return "change" in match.matched and (len(compared) == 1 or len(match.matched) >= 2)
    return len(match.matched) >= min(2, len(compared)) > 0


class FingerprintIndex:
    """Tasks added so far: an LSH index per code part for candidates, exact identities, and the
    part-by-part comparison that decides."""

    def __init__(self, settings: CurationSettings, templates: Templates | None = None) -> None:
        self.settings = settings
        self.templates = templates or {}
        self._prints: dict[str, Fingerprint] = {}
        self._exact: dict[str, list[str]] = {}
        self._lsh = {
            part: MinHashLSH(
                threshold=settings.near_duplicate_threshold, num_perm=settings.num_perm
            )
            for part in CODE_PARTS
        }
        self._by_instruction: dict[str, list[str]] = {}

    def __len__(self) -> int:
        return len(self._prints)

    def __contains__(self, key: str) -> bool:
        return key in self._prints

    def add(self, key: str, print_: Fingerprint) -> None:
        if key in self._prints:
            raise ValueError(f"task {key!r} is in the index twice; task ids must be unique")
        self._prints[key] = print_
        self._exact.setdefault(print_.exact, []).append(key)
        self._by_instruction.setdefault(print_.instruction_exact, []).append(key)
        for part, sketch in print_.parts.items():
            self._lsh[part].insert(key, sketch.sketch)

    def matches(self, print_: Fingerprint) -> list[Match]:
        """Indexed tasks that are one task with `print_`: exact copies first, then by score."""
        candidates = set(self._exact.get(print_.exact, ()))
        # A task without code parts is found by its instruction alone.
        candidates.update(self._by_instruction.get(print_.instruction_exact, ()))
        for part, sketch in print_.parts.items():
            candidates.update(self._lsh[part].query(sketch.sketch))
        found = []
        for key in sorted(candidates):
            match = compare(print_, self._prints[key], self.templates, self.settings)
            if same_task(match):
                found.append(dataclasses.replace(match, other=key))
        return sorted(found, key=lambda m: (not m.exact, -m.score, m.other))


@dataclasses.dataclass(frozen=True, slots=True)
class EvalSet:
    """The evaluation tasks' fingerprints."""

    prints: tuple[Fingerprint, ...]

    def code_base_matches(
        self, print_: Fingerprint, settings: CurationSettings
    ) -> list[tuple[str, float]]:
        """(evaluation task, estimated containment) of every evaluation task whose environment
        shares at least `repository_overlap` of the smaller one with `print_`'s, best first."""
        mine = print_.environment
        if mine is None:
            return []
        found = []
        for other in self.prints:
            if other.environment is not None:
                overlap = mine.containment(other.environment)
                if overlap >= settings.repository_overlap:
                    found.append((other.task_id, overlap))
        return sorted(found, key=lambda item: (-item[1], item[0]))


def build_eval_set(prints: Iterable[Fingerprint]) -> EvalSet:
    return EvalSet(tuple(prints))


def duplicate_reason(matches: Sequence[Match], label: Mapping[str, str]) -> Reason | None:
    """`exact_duplicate` or `near_duplicate` naming the best match (its key shown as `label`
    gives it, e.g. with the batch that admitted it)."""
    if not matches:
        return None
    best = matches[0]
    rule = "exact_duplicate" if best.exact else "near_duplicate"
    other = label.get(best.other, best.other)
    return Reason(
        rule, dataclasses.replace(best, other=other).describe(), best.other, best.evidence()
    )


def contamination_reasons(
    print_: Fingerprint,
    evaluation: FingerprintIndex,
    eval_set: EvalSet,
    policy: Decontamination,
    settings: CurationSettings,
) -> list[Reason]:
    """Under `instance` and `repository`: one task with an evaluation task (`contaminated`);
    under `repository` also: the code base appears in the evaluation set (`eval_repository`)."""
    if policy == "off":
        return []
    reasons = []
    matches = evaluation.matches(print_)
    if matches:
        best = matches[0]
        detail = f"{best.describe()} (evaluation set, policy {policy})"
        reasons.append(Reason("contaminated", detail, best.other, best.evidence()))
    if policy == "repository":
        bases = eval_set.code_base_matches(print_, settings)
        if bases:
            other, overlap = bases[0]
            more = f" and {len(bases) - 1} more evaluation task(s)" if len(bases) > 1 else ""
            detail = (
                f"code base shared with evaluation task {other}{more}: {overlap:.2f} of the "
                f"environment (policy repository, threshold {settings.repository_overlap:.2f})"
            )
            reasons.append(
                Reason("eval_repository", detail, other, (("environment", round(overlap, 3)),))
            )
    return reasons


# -- fix lines in the instruction ---------------------------------------------------------------


def _read(path: Path) -> str:
    try:
        return path.read_bytes()[: 1 << 20].decode("utf-8", errors="replace")
    except OSError:
        return ""


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
