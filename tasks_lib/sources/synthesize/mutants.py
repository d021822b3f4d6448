"""What happened to each mutant: its verdict, the tests it breaks and how, and for an unstable
mutant the tests that flipped between two runs and why (read by `pipeline`, written into the
synthesis report)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from tasks_lib.sources.synthesize.operators import SourceMutation
from tasks_lib.verify import PytestRun

Verdict = Literal[
    "kept",
    "survived",
    "breaks_everything",
    "too_broad",
    "unstable",
    "timeout",
    "broken",
    "unverifiable",
]


@dataclasses.dataclass(frozen=True, slots=True)
class MutantResult:
    mutation: SourceMutation
    verdict: Verdict
    fail_to_pass: tuple[str, ...] = ()
    pass_to_pass: tuple[str, ...] = ()
    messages: tuple[tuple[str, str], ...] = ()
    """(test id, failure message) of the failing tests."""
    duration_s: float = 0.0
    flips: tuple[tuple[str, str, str], ...] = ()
    """For an unstable mutant: (test id, what the first run said, what a later run said) of the
    tests that differ between two runs of the same mutant."""
    why: str = ""
    """For an unstable mutant: why its runs differ, from what flipped (see `unstable_reason`)."""

    @property
    def signature(self) -> tuple[tuple[str, str], ...]:
        """Which tests break and how: two mutants with the same signature are one task."""
        return self.messages


def failing_tests(run: PytestRun, baseline: Sequence[str]) -> dict[str, str]:
    """Baseline-passing tests that no longer pass, with their (normalized) messages."""
    messages = run.report.messages if run.report is not None else {}
    failing = {}
    for test_id in baseline:
        outcome = run.outcomes.get(test_id, "missing")
        if outcome != "passed":
            failing[test_id] = f"{outcome}: {messages.get(test_id, '')}"
    return failing


def flipped_tests(
    first: Mapping[str, str], later: Mapping[str, str]
) -> tuple[tuple[str, str, str], ...]:
    """Tests whose state (`passed`, or `outcome: message`) differs between two runs' failures."""
    return tuple(
        (test_id, first.get(test_id, "passed"), later.get(test_id, "passed"))
        for test_id in sorted(first.keys() | later.keys())
        if first.get(test_id, "passed") != later.get(test_id, "passed")
    )


_TIMING_WORDS = re.compile(r"timeout|timed out|deadline|took \d|too slow|elapsed", re.IGNORECASE)


def unstable_reason(flips: Sequence[tuple[str, str, str]]) -> str:
    """Why two runs of one mutant differ, read from what flipped: a test missing from one run
    (its id changes from run to run), a time limit in a message, a test passing in one run and
    failing in the other, or the same failure told differently."""
    states = [state for _, *pair in flips for state in pair]
    if any(state.startswith("missing") for state in states):
        return (
            "ids_vary: a test present in one run is missing from the other "
            "(its id changes between runs, or the mutant makes collection nondeterministic)"
        )
    if any(_TIMING_WORDS.search(state) for state in states):
        return "timing: a failure names a time limit or duration (the mutant is slow or hangs)"
    if any("passed" in (first, later) for _, first, later in flips):
        return (
            "outcome_flips: a test passes in one run and fails in the other "
            "(nondeterministic under the mutant: randomness, hash or set order, time of day)"
        )
    return (
        "message_differs: the same tests fail with different messages "
        "(the message holds a value that changes between runs)"
    )


def unstable_entry(result: MutantResult) -> dict[str, Any]:
    return {
        "mutation": result.mutation.describe(),
        "why": result.why,
        "flips": [
            {"test": test_id, "first_run": first, "later_run": later}
            for test_id, first, later in result.flips
        ],
    }
