"""What a history says about the files: the agent's reads with its kept edits applied, and the
trials it reverted. Every candidate proposer (bug fixing and the other families') reads the
files through this one digest, so they agree on what the agent has seen and tried; and every
proposer writes its edits with `edit_between`."""

from __future__ import annotations

import dataclasses
import hashlib

from training.actions import Action, EditFile, History, Observation, ReadFile, TryEdit, trial_kept


def normalize_path(path: str) -> str:
    """A workspace path as the agent may write it (`/workspace/x`, `./x`, ` x `) as `x`."""
    path = path.strip().removeprefix("/workspace/")
    while path.startswith("./"):
        path = path[2:]
    return path


def digest(text: str) -> str:
    """A short content digest (not for security: it names contents already tried)."""
    return hashlib.sha1(text.encode(), usedforsecurity=False).hexdigest()[:16]


@dataclasses.dataclass(slots=True)
class Edits:
    """The files the agent read, with its kept edits applied, and the trials it reverted."""

    files: dict[str, str] = dataclasses.field(default_factory=dict)
    """Current content of every file read (kept edits since applied), by normalized path."""
    trials: int = 0
    """Trials (`TryEdit`) that ran."""
    kept: int = 0
    reverted: int = 0
    """Reverted trials on a file the agent had read."""
    last_trial_kept: bool = False
    tried: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(path, digest of the content a reverted trial made)."""
    tried_lines: set[tuple[str, str]] = dataclasses.field(default_factory=set)
    """(path, original line) of lines a reverted trial changed."""

    def record(self, action: Action, observation: Observation) -> bool:
        """Take one turn into account; True when it changed a file the agent had read (an edit
        or a kept trial applied, or a reverted trial remembered)."""
        if isinstance(action, ReadFile):
            if observation.exit_code == 0:
                self.files[normalize_path(action.path)] = observation.text
            return False
        if not isinstance(action, EditFile | TryEdit) or observation.exit_code is None:
            return False
        if isinstance(action, EditFile) and observation.exit_code != 0:
            return False  # the edit failed: the file is as it was
        kept = isinstance(action, EditFile) or trial_kept(observation.text)
        if isinstance(action, TryEdit):
            self.trials += 1
            self.kept += int(kept)
            self.last_trial_kept = kept
        path = normalize_path(action.path)
        content = self.files.get(path)
        if content is None or action.old_text not in content:
            return False
        changed = content.replace(action.old_text, action.new_text, 1)
        if kept:
            self.files[path] = changed
        else:
            self.reverted += 1
            self.tried.add((path, digest(changed)))
            self.tried_lines.update((path, line) for line in action.old_text.split("\n"))
        return True


def follow_edits(history: History) -> Edits:
    """Replay the history's reads and edits onto what the agent knows of the files."""
    edits = Edits()
    for turn in history.turns:
        edits.record(turn.action, turn.observation)
    return edits


def edit_between(path: str, current: str, target: str) -> EditFile | None:
    """The one `edit_file` call that turns `current` into `target`: the changed lines, widened
    by context until the old text occurs once (None when nothing differs or no anchor exists)."""
    if current == target:
        return None
    old_lines, new_lines = current.split("\n"), target.split("\n")
    prefix = 0
    while prefix < min(len(old_lines), len(new_lines)) and old_lines[prefix] == new_lines[prefix]:
        prefix += 1
    suffix = 0
    while (
        suffix < min(len(old_lines), len(new_lines)) - prefix
        and old_lines[-1 - suffix] == new_lines[-1 - suffix]
    ):
        suffix += 1
    first, old_end, new_end = prefix, len(old_lines) - suffix, len(new_lines) - suffix
    for _ in range(4):
        old_text = "\n".join(old_lines[first:old_end])
        if old_text.strip() and current.count(old_text) == 1:
            return EditFile(path, old_text, "\n".join(new_lines[first:new_end]))
        # widen: one more line of context on each side
        if first > 0:
            first -= 1
        if old_end < len(old_lines) and new_end < len(new_lines):
            old_end, new_end = old_end + 1, new_end + 1
    return None
