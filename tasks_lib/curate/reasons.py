"""Why a task is rejected: a short rule name, the details behind it and, for a rule that
compares tasks, the other task and the similarity of each part compared."""

from __future__ import annotations

import dataclasses
from typing import Any

RULES = {
    "invalid_task": "the task directory does not load (Harbor layout or [rollyard] schema)",
    "solution_error": "solution/solve.sh is missing or fails",
    "solution_fails": "the reference solution does not score 1 (or raises tamper flags)",
    "untouched_passes": "the untouched workspace scores more than 0 or fail_to_pass tests pass",
    "pass_to_pass_fails": "a pass_to_pass test does not pass before the fix",
    "fail_to_pass_not_collected": "a fail_to_pass test id is not collected by pytest",
    "too_many_fail_to_pass": "more fail_to_pass tests than the settings allow",
    "not_scored": "a verification run ended without a verdict (infra or verifier error)",
    "flaky_test": "a test's outcome changed between identical runs or test orders",
    "flaky_reward": "the reward changed between identical runs (plain Harbor task)",
    "exact_duplicate": "the same task as another (every distinguishing part equal after "
    "normalising: instruction, change, failing and hidden tests)",
    "near_duplicate": "the same task as another: the change and one more part match "
    "(MinHash-estimated Jaccard at or above the threshold)",
    "contaminated": "the same task as an evaluation task (decontamination instance or repository)",
    "eval_repository": "the task's code base appears in the evaluation set (decontamination "
    "repository)",
    "fix_in_instruction": "a line of the reference fix appears in the instruction",
    "low_review_agreement": "human reviewers disagree with too many rewards of the task's family",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    """One reason a task is rejected."""

    rule: str
    detail: str
    other: str | None = None
    """The task this one was compared with (a duplicate's original, an evaluation task)."""
    evidence: tuple[tuple[str, float], ...] = ()
    """(part, similarity) of every part compared, e.g. `("change", 1.0)`."""

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown curation rule {self.rule!r}; known: {', '.join(RULES)}")

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = {"rule": self.rule, "detail": self.detail}
        if self.other is not None:
            data["other"] = self.other
        if self.evidence:
            data["evidence"] = dict(self.evidence)
        return data

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"
