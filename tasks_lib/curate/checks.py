"""Validity and flakiness verdicts from a task's oracle runs.

Validity (SWE-bench Verified's checks that need no annotator): the reference solution scores 1
without tamper flags, the untouched workspace scores 0, every fail_to_pass test fails and every
pass_to_pass test passes before the fix, every fail_to_pass id is collected, and the task does not
declare more fail_to_pass tests than the settings allow.

Flakiness: a test's flip rate is the share of runs of one candidate (the solution or the
untouched workspace, in order and reordered) whose outcome (passed or not) differs from that
candidate's majority outcome; the task's rate for a test is the larger of the two. Any flip
rejects the task.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence

from tasks_lib.curate.reasons import Reason
from tasks_lib.curate.runs import OracleRuns
from tasks_lib.curate.settings import CurationSettings
from tasks_lib.format.model import Task
from tasks_lib.verify import VerifyResult
from tasks_lib.verify.junit import Outcome

REWARD_KEY = "<reward>"
"""Pseudo test id under which a plain Harbor task (no per-test outcomes) reports reward flips."""


def validity_reasons(task: Task, runs: OracleRuns, settings: CurationSettings) -> list[Reason]:
    """Why the task is invalid, judged on its first in-order run of each candidate."""
    reasons: list[Reason] = []
    if len(task.fail_to_pass) > settings.max_fail_to_pass:
        reasons.append(Reason("too_many_fail_to_pass",
                              f"{len(task.fail_to_pass)} > {settings.max_fail_to_pass}"))  # fmt: skip
    solved, untouched = runs.solution[0], runs.untouched[0]
    for name, result in (("solution", solved), ("untouched workspace", untouched)):
        if not result.scored:
            reasons.append(Reason("not_scored", f"{name}: {result.status}: {result.detail}"))
    if solved.scored:
        if solved.reward != 1.0:
            failing = [t for t, o in solved.tests.items() if o != "passed"]
            reasons.append(Reason("solution_fails",
                                  f"reward {solved.reward}; not passing: {failing[:5]}"))  # fmt: skip
        elif solved.tampered:
            rules = sorted({f.rule for f in solved.flags if f.severity == "tamper"})
            reasons.append(Reason("solution_fails", f"tamper flags {rules}"))
    if untouched.scored:
        if untouched.reward != 0.0:
            reasons.append(Reason("untouched_passes",
                                  f"the untouched workspace scores {untouched.reward}"))  # fmt: skip
        if task.has_rollyard_table:
            missing = [t for t in task.fail_to_pass if untouched.tests.get(t) == "missing"]
            if missing:
                reasons.append(
                    Reason(
                        "fail_to_pass_not_collected",
                        f"{len(missing)} id(s) not in the report: {missing[:3]}",
                    )
                )
            passing = [t for t in task.fail_to_pass if untouched.tests.get(t) == "passed"]
            if passing:
                reasons.append(
                    Reason(
                        "untouched_passes",
                        f"fail_to_pass test(s) pass before the fix: {passing[:3]}",
                    )
                )
            broken = [t for t in task.pass_to_pass if untouched.tests.get(t) not in ("passed",)]
            if broken:
                outcomes = [f"{t} {untouched.tests.get(t)}" for t in broken[:3]]
                reasons.append(Reason("pass_to_pass_fails", f"before the fix: {outcomes}"))
    return reasons


def _binary(outcome: Outcome | None) -> bool:
    return outcome == "passed"


def _rates(observations: Mapping[str, Sequence[bool]]) -> dict[str, float]:
    rates: dict[str, float] = {}
    for test_id, seen in observations.items():
        if not seen:
            continue
        majority = Counter(seen).most_common(1)[0][0]
        rates[test_id] = sum(1 for value in seen if value != majority) / len(seen)
    return rates


def _observations(
    verdicts: Sequence[VerifyResult], orders: Sequence[object], expected: Sequence[str]
) -> dict[str, list[bool]]:
    seen: dict[str, list[bool]] = {test_id: [] for test_id in expected}
    for result in verdicts:
        if not result.scored:
            continue  # an infra failure says nothing about the test
        if not expected:
            seen.setdefault(REWARD_KEY, []).append(result.reward == 1.0)
        for test_id in expected:
            seen[test_id].append(_binary(result.tests.get(test_id)))
    for run in orders:
        tests = getattr(run, "tests", None)
        if tests is None:
            continue
        for test_id in expected:
            if test_id in tests:
                seen[test_id].append(_binary(tests[test_id]))
    return seen


def flip_rates(task: Task, runs: OracleRuns) -> dict[str, float]:
    """Per test id, the larger flip rate over the solution's and the untouched workspace's runs."""
    expected = task.expected_tests if task.has_rollyard_table else ()
    solution = _rates(_observations(runs.solution, runs.solution_orders, expected))
    untouched = _rates(_observations(runs.untouched, runs.untouched_orders, expected))
    return {
        test_id: max(solution.get(test_id, 0.0), untouched.get(test_id, 0.0))
        for test_id in sorted({*solution, *untouched})
    }


def flakiness_reasons(task: Task, rates: Mapping[str, float], runs: OracleRuns) -> list[Reason]:
    """One reason per flipping test (the worst five named), none for a stable task."""
    flipping = sorted(((r, t) for t, r in rates.items() if r > 0), reverse=True)
    if not flipping:
        return []
    total = len(runs.solution) + len(runs.solution_orders)
    rule = "flaky_reward" if flipping[0][1] == REWARD_KEY else "flaky_test"
    named = ", ".join(f"{t} flips in {r:.0%}" for r, t in flipping[:5])
    more = f" (+{len(flipping) - 5} more)" if len(flipping) > 5 else ""
    return [Reason(rule, f"{named}{more} of {total} runs per candidate")]
