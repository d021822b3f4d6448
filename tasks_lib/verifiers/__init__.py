"""Verifier kinds beyond test suites: artifact comparison and rule validation.

A task picks its kind with `verifier = "tests" | "artifact" | "rules"` in `[rollyard]`; `spec`
parses the kind's table, `compare` holds the artifact comparisons, `run` the two verifiers that
`tasks_lib.verify.verify` dispatches to.
"""

from tasks_lib.verifiers.spec import (
    ARTIFACT_FORMATS,
    COMPARE_MODES,
    RULE_KINDS,
    VERIFIER_KINDS,
    ArtifactSpec,
    OutputSpec,
    RuleCheck,
    RulesSpec,
    VariantSpec,
)

__all__ = [
    "ARTIFACT_FORMATS",
    "COMPARE_MODES",
    "RULE_KINDS",
    "VERIFIER_KINDS",
    "ArtifactSpec",
    "OutputSpec",
    "RuleCheck",
    "RulesSpec",
    "VariantSpec",
]
