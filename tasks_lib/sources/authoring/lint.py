"""`rollyard tasks lint`: what makes a task weak, found by loading and verifying it.

A weak task rewards the wrong thing: nothing is checked that the agent cannot see (so a
hard-coded answer passes), the untouched workspace already scores, the instruction quotes the
answer or the fix, or verifying takes longer than the budget the task declares.
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from pathlib import Path
from typing import Any, Literal

from sandboxes import SandboxError
from tasks_lib.errors import ArtifactError, SolutionError, TaskError, TaskValidationError
from tasks_lib.format.loader import load_task
from tasks_lib.format.model import Task
from tasks_lib.verify import verify
from tasks_lib.verify.candidate import CandidateChanges
from tasks_lib.verify.compare import read_table
from tasks_lib.verify.oracle import solution_changes

Severity = Literal["weak", "warning"]

LINT_RULES: dict[str, tuple[Severity, str]] = {
    "invalid_task": ("weak", "the task does not load"),
    "no_hidden_checks": (
        "weak",
        "nothing is checked that the agent cannot see: a hard-coded "
        "answer or a fix for the visible inputs only passes",
    ),
    "empty_action_solves": ("weak", "the untouched workspace scores above 0"),
    "solution_fails": ("weak", "the reference solution does not score 1"),
    "answer_in_instruction": ("weak", "the instruction quotes the expected answer or the fix"),
    "slow_verifier": ("weak", "verifying the solution takes longer than the verify budget"),
    "verifier_near_budget": ("warning", "verifying the solution takes over half the verify budget"),
    "unknown_hidden_checks": ("warning", "a plain Harbor task: hidden checks cannot be told apart"),
}
MIN_ANSWER_CHARS = 4
MEASURE_TIMEOUT_S = 300.0


@dataclasses.dataclass(frozen=True, slots=True)
class LintFinding:
    rule: str
    severity: Severity
    detail: str

    def to_json(self) -> dict[str, str]:
        return {"rule": self.rule, "severity": self.severity, "detail": self.detail}


@dataclasses.dataclass(frozen=True, slots=True)
class LintReport:
    task_dir: str
    task_id: str
    verifier: str
    findings: tuple[LintFinding, ...]
    verify_s: float | None
    """Seconds the verifier took on the reference solution."""
    budget_s: float | None

    @property
    def weak(self) -> bool:
        return any(f.severity == "weak" for f in self.findings)

    def to_json(self) -> dict[str, Any]:
        return {
            "task_id": self.task_id, "task_dir": self.task_dir, "verifier": self.verifier,
            "weak": self.weak, "findings": [f.to_json() for f in self.findings],
            "verify_s": None if self.verify_s is None else round(self.verify_s, 3),
            "budget_s": self.budget_s,
        }  # fmt: skip


def _finding(rule: str, detail: str) -> LintFinding:
    return LintFinding(rule, LINT_RULES[rule][0], detail)


def lint_task(task_dir: str | Path, *, run_verifier: bool = True) -> LintReport:
    """Lint one task directory; with `run_verifier`, verify its solution and its untouched
    workspace (two fresh-sandbox runs) for the checks that need a verdict."""
    try:
        task = load_task(task_dir)
    except TaskValidationError as error:
        first = str(error.issues[0]) if error.issues else str(error)
        return LintReport(str(task_dir), Path(task_dir).name, "?",
                          (_finding("invalid_task", f"{len(error.issues)} problem(s), first: {first}"),),
                          None, None)  # fmt: skip
    except TaskError as error:
        return LintReport(str(task_dir), Path(task_dir).name, "?",
                          (_finding("invalid_task", str(error)),), None, None)  # fmt: skip
    findings = list(_hidden_findings(task))
    solution: CandidateChanges | None = None
    verify_s = None
    if run_verifier:
        # Measured under a generous limit, so a verifier over its budget shows its real duration
        # instead of stopping at the budget.
        measured = dataclasses.replace(
            task, verify_timeout_s=max(MEASURE_TIMEOUT_S, task.verify_timeout_s)
        )
        try:
            solution = solution_changes(measured)
        except (SolutionError, SandboxError) as error:
            findings.append(_finding("solution_fails", f"solution/solve.sh: {str(error)[:200]}"))
        if solution is not None:
            started = time.monotonic()
            solved = verify(measured, solution)
            verify_s = time.monotonic() - started
            if solved.reward != 1.0:
                findings.append(
                    _finding(
                        "solution_fails",
                        f"reward {solved.reward} ({solved.status}: {solved.detail[:200]})",
                    )
                )
            if verify_s > task.verify_timeout_s:
                findings.append(
                    _finding(
                        "slow_verifier", f"{verify_s:.1f}s > budget {task.verify_timeout_s:.0f}s"
                    )
                )
            elif verify_s > task.verify_timeout_s / 2:
                findings.append(
                    _finding(
                        "verifier_near_budget", f"{verify_s:.1f}s of {task.verify_timeout_s:.0f}s"
                    )
                )
        untouched = verify(task, CandidateChanges.empty())
        if untouched.reward is not None and untouched.reward > 0:
            findings.append(
                _finding(
                    "empty_action_solves", f"the untouched workspace scores {untouched.reward}"
                )
            )
    findings += _leak_findings(task, solution)
    return LintReport(
        str(task_dir), task.id, task.verifier, tuple(findings), verify_s, task.verify_timeout_s
    )


def _hidden_findings(task: Task) -> list[LintFinding]:
    if not task.has_rollyard_table:
        return [
            _finding("unknown_hidden_checks", "no [rollyard] table; tests/test.sh decides alone")
        ]
    if task.verifier == "tests" and not task.hidden_tests:
        return [_finding("no_hidden_checks", "no hidden_tests")]
    if task.verifier == "artifact":
        assert task.artifact is not None
        if task.artifact.command is None:
            return [
                _finding(
                    "no_hidden_checks", "no command: the outputs are read as the agent left them"
                )
            ]
        if not any(variant.hidden for variant in task.artifact.variants):
            return [_finding("no_hidden_checks", "no variant with its own data (an overlay/ dir)")]
    if task.verifier == "rules":
        assert task.rules is not None
        if task.rules.overlay_dir is None and not any(check.hidden for check in task.rules.checks):
            return [_finding("no_hidden_checks", "no overlay_dir and no check marked hidden")]
    return []


def _answer_strings(task: Task) -> list[str]:
    """Values the agent must find out, not be told."""
    values: list[str] = []
    if task.verifier == "artifact" and task.artifact is not None:
        visible = task.artifact.variants[0]
        for output in task.artifact.outputs:
            try:
                data = (visible.expected_dir / output.path).read_bytes()
            except OSError:
                continue
            if output.format in ("csv", "parquet"):
                try:
                    table = read_table(data, output.format)
                except ArtifactError:
                    continue
                values += [str(v) for column in table.columns for v in column.to_pylist()]
            elif output.format == "json":
                try:
                    values += _leaves(json.loads(data))
                except ValueError:
                    continue
            else:
                values += re.findall(r"[A-Za-z0-9_.-]+", data.decode("utf-8", errors="replace"))
    if task.verifier == "rules" and task.rules is not None:
        for check in task.rules.checks:
            if check.hidden:
                values += [
                    v for v in (check.text, check.expect_contains, check.stdout_contains) if v
                ]
    return [v.strip() for v in values if len(v.strip()) >= MIN_ANSWER_CHARS]


def _leaves(value: Any) -> list[str]:
    """Leaf values of a JSON document (its keys are the format, not the answer)."""
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    if isinstance(value, list):
        return [leaf for item in value for leaf in _leaves(item)]
    return [str(value)]


def _leak_findings(task: Task, solution: CandidateChanges | None) -> list[LintFinding]:
    text = task.instruction
    answers = sorted(set(_answer_strings(task)))
    if task.verifier in ("artifact", "rules") and answers:
        quoted = [a for a in answers if a in text]
        if quoted and len(quoted) * 2 >= len(answers):
            return [
                _finding(
                    "answer_in_instruction",
                    f"{len(quoted)}/{len(answers)} answer values quoted, e.g. {quoted[0][:40]!r}",
                )
            ]
    if solution is not None:
        added = []
        for path, data in solution.files.items():
            original = task.snapshot_dir / path
            before = (
                set(original.read_text(errors="replace").splitlines())
                if original.is_file()
                else set()
            )
            added += [line.strip() for line in data.decode("utf-8", errors="replace").splitlines()
                      if line.strip() not in before and len(line.strip()) >= 12]  # fmt: skip
        quoted = [line for line in added if line in text]
        if quoted and task.verifier == "tests":
            return [_finding("answer_in_instruction", f"fix line quoted: {quoted[0][:60]!r}")]
        if quoted and len(quoted) * 2 >= len(added):
            return [
                _finding(
                    "answer_in_instruction", f"{len(quoted)}/{len(added)} solution lines quoted"
                )
            ]
    return []
