"""Candidate proposers of the built-in policy for task families beyond bug fixing.

`training.candidates.propose_candidates` hands a history to one of these when its instruction is
of their kind (`domain_proposer_for`): a question about a data file answered by a script
(`training.proposers.data_analysis`), or a failing service with criteria to meet
(`training.proposers.ops`). They speak the same actions as the bug-fix proposer and describe
each candidate in the same fixed-length feature space, in a block of their own
(`DOMAIN_FEATURE_NAMES`, appended to the bug-fix features).

The proposer modules are imported lazily: they import `training.candidates`, which imports this
package for the feature names.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from training.proposers.features import DOMAIN_FEATURE_NAMES

if TYPE_CHECKING:
    from training.actions import History
    from training.candidates import Candidate

Proposer = Callable[["History"], list["Candidate"]]


def domain_proposer_for(history: History) -> Proposer | None:
    """The proposer for the history's kind of task; None for bug fixing (or anything else)."""
    from training.proposers import data_analysis, ops

    if data_analysis.applies(history.instruction):
        return data_analysis.propose
    if ops.applies(history.instruction):
        return ops.propose
    return None


__all__ = ["DOMAIN_FEATURE_NAMES", "Proposer", "domain_proposer_for"]
