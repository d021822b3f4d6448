"""Why a task is rejected: a short rule name and the details behind it."""

from __future__ import annotations

import dataclasses

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
    "exact_duplicate": "same normalized instruction, tests and solution as another task",
    "near_duplicate": "MinHash-estimated Jaccard similarity above the threshold",
    "eval_duplicate": "an exact or near duplicate of an evaluation task",
    "contaminated": "shares 13-grams with an evaluation task",
    "fix_in_instruction": "a line of the reference fix appears in the instruction",
    "low_review_agreement": "human reviewers disagree with too many rewards of the task's family",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Reason:
    """One reason a task is rejected."""

    rule: str
    detail: str

    def __post_init__(self) -> None:
        if self.rule not in RULES:
            raise ValueError(f"unknown curation rule {self.rule!r}; known: {', '.join(RULES)}")

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "detail": self.detail}

    def __str__(self) -> str:
        return f"{self.rule}: {self.detail}"
