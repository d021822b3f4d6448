"""The task-authoring kit: the one Harbor task writer every source calls (`writer`), a family to
start from (`scaffold`, `rollyard tasks new`) and the finder of weak tasks (`lint`, `rollyard
tasks lint`); `harbor_check.py` is the stdlib checker the writer copies into artifact and rule
tasks."""

from tasks_lib.sources.authoring.lint import LINT_RULES, LintFinding, LintReport, lint_task
from tasks_lib.sources.authoring.scaffold import scaffold_family
from tasks_lib.sources.authoring.writer import TaskFiles, write_task

__all__ = [
    "LINT_RULES",
    "LintFinding",
    "LintReport",
    "TaskFiles",
    "lint_task",
    "scaffold_family",
    "write_task",
]
