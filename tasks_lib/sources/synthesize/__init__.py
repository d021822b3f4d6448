"""Task synthesis from real Python repositories: AST mutants that the project's own tests catch
reliably (run with the verifier's hardened pytest run), written as Harbor tasks through the one
writer. `project` reads the project's layout, `operators` finds mutations, `pipeline` decides
(`mutants`: each mutant's verdict and, when unstable, why), `task_writer` writes the kept ones.

    from tasks_lib.sources.synthesize import synthesize_tasks
    report = synthesize_tasks("path/to/project", "tasks/", max_tasks=10, seed=0)
    print(report.to_json())
"""

from tasks_lib.sources.synthesize.mutants import MutantResult
from tasks_lib.sources.synthesize.operators import OPERATORS, ModuleMutator, SourceMutation
from tasks_lib.sources.synthesize.pipeline import (
    SynthesisReport,
    evaluate_mutants,
    synthesize_tasks,
)
from tasks_lib.sources.synthesize.project import ProjectLayout, copy_clean, inspect_project
from tasks_lib.sources.synthesize.task_writer import FAMILY, write_synthesized_task

__all__ = [
    "FAMILY",
    "OPERATORS",
    "ModuleMutator",
    "MutantResult",
    "ProjectLayout",
    "SourceMutation",
    "SynthesisReport",
    "copy_clean",
    "evaluate_mutants",
    "inspect_project",
    "synthesize_tasks",
    "write_synthesized_task",
]
