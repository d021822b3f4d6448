"""What the domain proposers share: vectors in the one feature space, reading instructions, and
following the agent's own edits through a history."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import re
from collections.abc import Mapping

from training.actions import EditFile, History, ReadFile, TryEdit, trial_kept

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


def normalize_path(path: str) -> str:
    path = path.strip().removeprefix("/workspace/")
    while path.startswith("./"):
        path = path[2:]
    return path


def digest(text: str) -> str:
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


@dataclasses.dataclass(slots=True)
class Edits:
    """The files the agent read, with its kept edits applied, and the trials it reverted."""

    files: dict[str, str] = dataclasses.field(default_factory=dict)
    trials: int = 0
    reverted: int = 0
    kept: int = 0
    tried: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(path, digest of the content a reverted trial made)."""
    tried_lines: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(path, original line) of lines a reverted trial changed."""


def follow_edits(history: History) -> Edits:
    """Replay the history's reads and edits onto what the agent knows of the files."""
    edits = Edits()
    for turn in history.turns:
        action, observation = turn.action, turn.observation
        if isinstance(action, ReadFile) and observation.exit_code == 0:
            edits.files[normalize_path(action.path)] = observation.text
        elif isinstance(action, EditFile | TryEdit) and observation.exit_code is not None:
            path = normalize_path(action.path)
            kept = isinstance(action, EditFile) or trial_kept(observation.text)
            if isinstance(action, EditFile) and observation.exit_code != 0:
                continue
            if isinstance(action, TryEdit):
                edits.trials += 1
                edits.kept += int(kept)
            content = edits.files.get(path)
            if content is None or action.old_text not in content:
                continue
            changed = content.replace(action.old_text, action.new_text, 1)
            if kept:
                edits.files[path] = changed
            else:
                edits.reverted += 1
                edits.tried.add((path, digest(changed)))
                edits.tried_lines.update((path, line) for line in action.old_text.split("\n"))
    return edits
