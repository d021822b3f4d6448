"""The built-in policy: a small torch network scoring the candidate actions its proposers offer.

`scorer_policy` (the policy and its network) · `proposers/` (`propose_candidates`, and one
proposer per task family beyond bug fixing) · `bugfix` (the bug-fix proposer) · `features` (the
one feature space every candidate is described in) · `edit_history` (what a history says about
the files, shared by every proposer). The loop in `training` knows only the `Policy` interface.
"""

from training.builtin.features import FEATURE_COUNT, FEATURE_NAMES, Candidate
from training.builtin.proposers import propose_candidates
from training.builtin.scorer_policy import CandidateScorerPolicy, ScorerConfig

__all__ = [
    "FEATURE_COUNT",
    "FEATURE_NAMES",
    "Candidate",
    "CandidateScorerPolicy",
    "ScorerConfig",
    "propose_candidates",
]
