"""The verifier: scores a candidate against a task in a fresh sandbox it alone controls.

candidate.py  a candidate as changes to the workspace (from a directory or an agent's sandbox)
guard.py      which changes reach the verifier, and the reward-hack rules that flag them
context.py    the run context every kind works through, and the verdict (`VerifyResult`)
run.py        `verify`: one dispatch keyed by the task's verifier kind
pytest.py     the one hardened pytest run (verifier, curation and synthesis) and `tests` tasks
harbor.py     plain Harbor tasks: tests/test.sh and its reward.txt
artifact.py   outputs against references (`compare.py` holds the comparisons)
rules.py      declarative checks over the final state
junit.py      per-test outcomes from a JUnit report
oracle.py     the reference solution as a candidate, checkouts, the oracle check
"""

from tasks_lib.verify.candidate import CandidateChanges
from tasks_lib.verify.context import SCORED_STATUSES, Status, VerifyResult, VerifyRun
from tasks_lib.verify.guard import RULES, Flag, GuardPolicy
from tasks_lib.verify.oracle import CheckResult, check_task, checkout, solution_changes
from tasks_lib.verify.pytest import PytestRun, run_pytest, run_task_tests
from tasks_lib.verify.run import VERIFIERS, rejected_candidate, verify, verify_sandbox

__all__ = [
    "RULES",
    "SCORED_STATUSES",
    "VERIFIERS",
    "CandidateChanges",
    "CheckResult",
    "Flag",
    "GuardPolicy",
    "PytestRun",
    "Status",
    "VerifyResult",
    "VerifyRun",
    "check_task",
    "checkout",
    "rejected_candidate",
    "run_pytest",
    "run_task_tests",
    "solution_changes",
    "verify",
    "verify_sandbox",
]
