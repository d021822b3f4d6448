"""The human-review gate of curation: no more tasks of a family whose rewards reviewers distrust.

`blocked` comes from the store (`storage.reviews.blocked_families(review_gate(store))`); the
curation step calls `apply_review_gate(verdicts, blocked)` after `decide`, so tasks of a blocked
family are rejected with the reason, and the rest are untouched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from tasks_lib.curate.pipeline import TaskVerdict
from tasks_lib.curate.reasons import Reason


def apply_review_gate(
    verdicts: Sequence[TaskVerdict], blocked: Mapping[str, str]
) -> list[TaskVerdict]:
    """`verdicts` with every admitted task of a blocked family rejected (`low_review_agreement`)."""
    gated = []
    for verdict in verdicts:
        family = verdict.checks.family or "unknown"
        if verdict.admitted and family in blocked:
            reason = Reason("low_review_agreement", f"family {family!r}: {blocked[family]}")
            verdict = dataclasses.replace(
                verdict, verdict="rejected", reasons=(*verdict.reasons, reason)
            )
        gated.append(verdict)
    return gated
