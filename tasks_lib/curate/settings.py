"""Thresholds of task curation, read when a curation starts (never at import), and the rule that
sizes the flakiness reruns.

How many reruns: a test that fails with probability p on each run goes unnoticed in N independent
runs with probability (1 - p)^N. To catch it with confidence c, choose the smallest N with
1 - (1 - p)^N >= c, that is N = ceil(log(1 - c) / log(1 - p)). For c = 0.95 that gives 14 runs
for p = 0.2, 29 for 0.1, 59 for 0.05 and 299 for 0.01. A test that is flaky with p = 0.05 passes
10 runs unnoticed 60% of the time, which is why N comes from the rate and confidence you choose.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from rollyard.settings import settings
from tasks_lib.errors import CurationSettingsError

ENV_PREFIX = "ROLLYARD_CURATE_"


def reruns_for(flake_rate: float, confidence: float) -> int:
    """Runs needed to see at least one flip of a test that flips with probability `flake_rate`
    per run, with probability `confidence`: ceil(log(1 - confidence) / log(1 - flake_rate))."""
    if not 0.0 < flake_rate < 1.0:
        raise CurationSettingsError(f"flake_rate = {flake_rate}; it must lie in (0, 1)")
    if not 0.0 < confidence < 1.0:
        raise CurationSettingsError(f"confidence = {confidence}; it must lie in (0, 1)")
    return max(1, math.ceil(math.log(1.0 - confidence) / math.log(1.0 - flake_rate) - 1e-9))


@dataclasses.dataclass(frozen=True, slots=True)
class CurationSettings:
    """What curation checks and how strictly. Every field can be set from
    `ROLLYARD_CURATE_<FIELD>`; see `from_env`."""

    flake_rate: float = 0.05
    """Smallest per-run flip probability the flakiness certification must catch."""
    confidence: float = 0.95
    """Probability of catching a test that flips at `flake_rate`."""
    reruns: int | None = None
    """Runs of the solution and of the untouched workspace, each in a fresh sandbox; None
    derives it from `flake_rate` and `confidence` (59 for the defaults)."""
    random_order_runs: int = 2
    """Further runs of each (solution, untouched) in another test order; the first reverses the
    order (every pair of tests swaps), the others shuffle with a seeded RNG."""
    order_seed: int = 0
    max_fail_to_pass: int = 50
    """More fail_to_pass tests than this is a sign of an over-broad task (VAL-3)."""
    shingle_tokens: int = 5
    """Tokens per shingle of the code parts (BigCode uses 5)."""
    near_duplicate_threshold: float = 0.8
    """Estimated Jaccard similarity from which a code part of two tasks matches (the change,
    the failing tests, the hidden tests); see `similarity` for when matching parts make two
    tasks one."""
    num_perm: int = 128
    """MinHash permutations."""
    instruction_threshold: float = 0.5
    """Jaccard similarity of two instructions' content words (template words left out) from
    which the instructions match. Lower than the code parts' threshold: rewording changes words,
    and an instruction never makes two tasks one on its own."""
    template_doc_share: float = 0.5
    """An instruction word found in at least this share of the instructions compared (this
    batch, the evaluation set and the earlier admitted tasks, when there are at least
    `template_min_docs`) is a generator's template, not what tells tasks apart."""
    template_min_docs: int = 4
    repository_overlap: float = 0.5
    """Share of the smaller environment found in the other from which two tasks share a code
    base (the `repository` decontamination policy)."""
    min_fix_line_chars: int = 12
    """Shortest added solution line (stripped) that counts when found in the instruction."""
    difficulty_samples: int = 8
    """k: samples of the reference policy per task for its pass rate (DIF-1 uses 8-16)."""
    difficulty_edges: tuple[float, ...] = (0.25, 0.5, 0.75)
    """Bucket upper edges between the all-fail (0) and all-pass (1) buckets."""

    def __post_init__(self) -> None:
        reruns_for(self.flake_rate, self.confidence)  # validates both
        if self.reruns is not None and self.reruns < 1:
            raise CurationSettingsError(f"reruns = {self.reruns}; it must be at least 1")
        if self.random_order_runs < 0 or self.difficulty_samples < 1:
            raise CurationSettingsError(
                "random_order_runs must be >= 0 and difficulty_samples >= 1"
            )
        if not 0.0 < self.near_duplicate_threshold <= 1.0:
            raise CurationSettingsError(
                f"near_duplicate_threshold = {self.near_duplicate_threshold}; use (0, 1]"
            )
        for name in ("instruction_threshold", "repository_overlap"):
            if not 0.0 < getattr(self, name) <= 1.0:
                raise CurationSettingsError(f"{name} = {getattr(self, name)}; use (0, 1]")
        if self.shingle_tokens < 1 or self.num_perm < 16:
            raise CurationSettingsError("shingle_tokens must be >= 1, num_perm >= 16")
        edges = self.difficulty_edges
        if any(not 0.0 < e < 1.0 for e in edges) or list(edges) != sorted(set(edges)):
            raise CurationSettingsError(
                f"difficulty_edges = {edges}; use increasing values inside (0, 1)"
            )

    @property
    def runs(self) -> int:
        """Fresh-sandbox runs per candidate (solution, untouched)."""
        return (
            self.reruns if self.reruns is not None else reruns_for(self.flake_rate, self.confidence)
        )

    @classmethod
    def from_env(cls, texts: Mapping[str, str] | None = None, **overrides: Any) -> CurationSettings:
        """Settings from `ROLLYARD_CURATE_<FIELD>` variables (read by `rollyard.settings`), or
        from `texts` by field name when given, then `overrides` (None values in `overrides` are
        ignored, so CLI options that were not given keep the environment's)."""
        texts = settings().curate if texts is None else texts
        values: dict[str, Any] = {}
        for field in dataclasses.fields(cls):
            text = texts.get(field.name)
            if text is None:
                continue
            try:
                if field.name == "difficulty_edges":
                    values[field.name] = tuple(float(p) for p in text.split(",") if p.strip())
                elif field.name in ("reruns",) or isinstance(field.default, int):
                    values[field.name] = int(text)
                else:
                    values[field.name] = float(text)
            except ValueError:
                raise CurationSettingsError(
                    f"{ENV_PREFIX}{field.name.upper()} = {text!r} is not a number"
                ) from None
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = set(overrides) - names
        if unknown:
            raise CurationSettingsError(f"unknown curation setting(s): {sorted(unknown)}")
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)
