"""The built-in policy's candidate proposers, one per task family, and the one entry point.

`propose_candidates` hands a history to the proposer of its kind of task (`family_proposer_for`):
a question about a data file answered by a script (`data_analysis`), a failing service with
criteria to meet (`ops`), and anything else to the bug-fix proposer (`training.builtin.bugfix`).
They speak the same actions and describe each candidate in the one feature space of
`training.builtin.features`, each family in a block of its own.
"""

from __future__ import annotations

from collections.abc import Callable

from training.actions import History
from training.builtin import bugfix
from training.builtin.features import Candidate
from training.builtin.proposers import data_analysis, ops

Proposer = Callable[[History], list[Candidate]]


def family_proposer_for(history: History) -> Proposer | None:
    """The proposer for the history's family of task; None for bug fixing (or anything else)."""
    if data_analysis.applies(history.instruction):
        return data_analysis.propose
    if ops.applies(history.instruction):
        return ops.propose
    return None


def propose_candidates(history: History) -> list[Candidate]:
    """Every action worth considering after `history`, each with its feature vector.

    Deterministic: the same history gives the same candidates in the same order (the trainer
    and the tests rely on it). Never empty."""
    proposer = family_proposer_for(history) or bugfix.propose
    return proposer(history)


__all__ = ["Proposer", "family_proposer_for", "propose_candidates"]
