"""The task-authoring kit: write Harbor task dirs (`writer`), scaffold a family (`scaffold`,
`rollyard tasks new`) and find weak tasks (`lint`, `rollyard tasks lint`)."""

from tasks_lib.authoring.lint import LINT_RULES, LintFinding, LintReport, lint_task
from tasks_lib.authoring.scaffold import ScaffoldError, scaffold_family
from tasks_lib.authoring.writer import TaskFiles, write_task

__all__ = [
    "LINT_RULES",
    "LintFinding",
    "LintReport",
    "ScaffoldError",
    "TaskFiles",
    "lint_task",
    "scaffold_family",
    "write_task",
]
