"""What the domain proposers share: vectors in the one feature space, reading instructions, and
following the agent's own edits through a history."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping

# The files as the agent knows them: one digest shared with the bug-fix proposer.
from training.edit_history import Edits, digest, follow_edits, normalize_path

STEP_HORIZON = 10
"""Steps after which a domain's `*_step_fraction` saturates."""

_BACKTICKED = re.compile(r"`([^`\n]+)`")


@functools.cache
def _feature_index() -> dict[str, int]:
    # Imported here: `training.candidates` imports this package for the feature names.
    from training.candidates import FEATURE_NAMES

    return {name: index for index, name in enumerate(FEATURE_NAMES)}


def feature_vector(active: Mapping[str, float]) -> tuple[float, ...]:
    """A vector of the full feature space with `active` set and every other feature 0."""
    index = _feature_index()
    values = [0.0] * len(index)
    for name, value in active.items():
        values[index[name]] = float(value)
    return tuple(values)


def backticked(text: str) -> list[str]:
    """The `quoted` spans of a text, in order."""
    return _BACKTICKED.findall(text)


def paragraphs(text: str) -> list[str]:
    return [p.strip() for p in re.split(r"\n\s*\n", text) if p.strip()]


__all__ = [
    "STEP_HORIZON",
    "Edits",
    "backticked",
    "digest",
    "feature_vector",
    "follow_edits",
    "normalize_path",
    "paragraphs",
]
