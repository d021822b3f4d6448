"""What the family proposers share: reading instructions, and following the agent's own edits
through a history."""

from __future__ import annotations

import re

# The files as the agent knows them: one digest shared with the bug-fix proposer.
from training.builtin.edit_history import Edits, digest, follow_edits, normalize_path

STEP_HORIZON = 10
"""Steps after which a family's `*_step_fraction` saturates."""

_BACKTICKED = re.compile(r"`([^`\n]+)`")


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
    "follow_edits",
    "normalize_path",
    "paragraphs",
]
