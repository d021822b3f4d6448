"""A candidate solution as changes to a task's workspace: what the verifier applies to a fresh
sandbox. Build one from a directory (the workspace as the agent left it) or from the agent's
sandbox (its `diff()` plus the bytes of each changed file).

What an agent submits is bounded before anything of it is read (`CandidateBounds`): a candidate
directory is walked by `stat` alone within the workspace bounds (no sparse file, no tree too big,
too deep or with too many entries), the changed files are counted before one is read, and every
path is checked for hostility (absolute, `..`, control characters, bytes that are not UTF-8, too
long or too deep). A candidate out of bounds raises `CandidateBoundsError`, which the verifier
scores as a failed attempt, not as a broken verifier."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from sandboxes import Sandbox, SandboxError, WorkspaceDiff
from sandboxes.errors import SnapshotError
from sandboxes.snapshot import MAX_DEPTH, MAX_PATH_BYTES, TreeBounds, check_plain_tree
from tasks_lib.errors import CandidateBoundsError, CandidateError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_FILES = 10_000


@dataclasses.dataclass(frozen=True, slots=True)
class CandidateBounds:
    """What a candidate may change, checked before its files are read."""

    max_bytes: int = DEFAULT_MAX_BYTES
    """Bytes of added and modified files, together."""
    max_files: int = DEFAULT_MAX_FILES
    """Added, modified, deleted files and links, together."""
    tree: TreeBounds = dataclasses.field(default_factory=TreeBounds)
    """The whole candidate directory (`from_directory`), walked by `stat` before any read."""


def check_candidate_path(path: str) -> None:
    """Raise `CandidateBoundsError` unless `path` is a plain workspace-relative POSIX path: not
    absolute, no `.`/`..`/empty component, no control character, valid UTF-8, within
    `MAX_PATH_BYTES` and `MAX_DEPTH`."""
    shown = repr(path[:80])
    reason = None
    try:
        encoded = path.encode("utf-8")
    except UnicodeEncodeError:  # a name that was not UTF-8 on disk (surrogate-escaped)
        encoded, reason = b"", "is not valid UTF-8"
    parts = path.split("/")
    if reason is not None:
        pass
    elif not path or path.startswith("/"):
        reason = "is empty or absolute"
    elif any(part in ("", ".", "..") for part in parts):
        reason = "has an empty, '.' or '..' component"
    elif any(ord(char) < 0x20 or ord(char) == 0x7F for char in path):
        reason = "holds a control character"
    elif len(encoded) > MAX_PATH_BYTES:
        reason = f"is longer than {MAX_PATH_BYTES} bytes"
    elif len(parts) > MAX_DEPTH:
        reason = f"is nested deeper than {MAX_DEPTH} directories"
    if reason is not None:
        raise CandidateBoundsError(f"candidate path {shown} {reason}; the candidate is not run")


@dataclasses.dataclass(frozen=True, slots=True)
class CandidateChanges:
    """Changed files of a workspace against its snapshot, as workspace-relative POSIX paths."""

    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    """Added or modified regular files and their new bytes."""
    deleted: tuple[str, ...] = ()
    """Snapshot files that are gone."""
    symlinks: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Added or replaced symbolic links and their targets (never followed, never applied)."""

    def __post_init__(self) -> None:
        for path in (*self.files, *self.deleted, *self.symlinks):
            check_candidate_path(path)

    @property
    def changed_paths(self) -> tuple[str, ...]:
        return tuple(sorted({*self.files, *self.deleted, *self.symlinks}))

    def __bool__(self) -> bool:
        return bool(self.files or self.deleted or self.symlinks)

    @classmethod
    def empty(cls) -> CandidateChanges:
        return cls()

    @classmethod
    def from_directory(
        cls,
        candidate_dir: str | Path,
        snapshot_dir: str | Path,
        *,
        bounds: CandidateBounds = CandidateBounds(),
    ) -> CandidateChanges:
        """Compare `candidate_dir` (the workspace as the agent left it) with `snapshot_dir`.

        The directory is walked by `stat` within `bounds.tree` before any file is read, and
        refused as a sandbox refuses a tree (a system path, device files, FIFOs, sockets). Links
        are recorded, never followed: a link may point anywhere on this machine.
        """
        candidate = Path(candidate_dir)
        snapshot = Path(snapshot_dir)
        if not candidate.is_dir():
            raise CandidateError(
                f"candidate {candidate} is not a directory; pass the workspace the agent left"
            )
        try:
            # The refusals of `sandbox run` (/dev, /proc, /, FIFOs, ...): one check for both.
            check_plain_tree(candidate, bounds.tree)
        except SnapshotError as error:
            message = str(error).split(" ", 1)[1]  # "snapshot X: ..." / "workspace X is ..."
            raise CandidateBoundsError(f"candidate {message}") from None
        files: dict[str, bytes] = {}
        symlinks: dict[str, str] = {}
        seen: set[str] = set()
        total_bytes = 0
        for dirpath, dirnames, filenames in os.walk(candidate, followlinks=False):
            base = Path(dirpath)
            for name in [*dirnames, *filenames]:
                full = base / name
                rel = full.relative_to(candidate).as_posix()
                info = full.lstat()
                if stat.S_ISLNK(info.st_mode):
                    seen.add(rel)
                    symlinks[rel] = os.readlink(full)
                    continue
                if not stat.S_ISREG(info.st_mode):
                    continue
                seen.add(rel)
                original = snapshot / rel
                if original.is_file() and not original.is_symlink():
                    if original.stat().st_size == info.st_size:
                        data = full.read_bytes()
                        if data == original.read_bytes():
                            continue
                    else:
                        data = full.read_bytes()
                else:
                    data = full.read_bytes()
                total_bytes += len(data)
                if total_bytes > bounds.max_bytes:
                    raise CandidateBoundsError(
                        f"candidate {candidate} changes more than {bounds.max_bytes} bytes of "
                        "files; remove large generated files or raise CandidateBounds.max_bytes"
                    )
                files[rel] = data
        deleted: list[str] = []
        for dirpath, _dirnames, filenames in os.walk(snapshot, followlinks=False):
            for name in filenames:
                rel = (Path(dirpath) / name).relative_to(snapshot).as_posix()
                if rel not in seen:
                    deleted.append(rel)
        _check_count(len(files) + len(deleted) + len(symlinks), bounds)
        return cls(files=files, deleted=tuple(sorted(deleted)), symlinks=symlinks)

    @classmethod
    def from_diff(
        cls,
        diff: WorkspaceDiff,
        read_file: Callable[[str], bytes],
        *,
        symlinks: Mapping[str, str] | None = None,
        bounds: CandidateBounds = CandidateBounds(),
    ) -> CandidateChanges:
        """Changes from a sandbox diff and a reader of the changed files' bytes; the paths are
        counted and checked before the first file is read."""
        links = dict(symlinks or {})
        _check_count(len(diff.changed_paths), bounds)
        for path in diff.changed_paths:
            check_candidate_path(path)
        files: dict[str, bytes] = {}
        total_bytes = 0
        for path in (*diff.added, *diff.modified):
            if path in links:
                continue
            try:
                data = read_file(path)
            except (SandboxError, OSError) as error:
                raise CandidateError(f"cannot read changed file {path!r}: {error}") from error
            total_bytes += len(data)
            if total_bytes > bounds.max_bytes:
                raise CandidateBoundsError(
                    f"candidate changes more than {bounds.max_bytes} bytes of files; the "
                    "candidate is not run"
                )
            files[path] = data
        return cls(files=files, deleted=tuple(diff.deleted), symlinks=links)

    @classmethod
    def from_sandbox(
        cls, sandbox: Sandbox, *, bounds: CandidateBounds = CandidateBounds()
    ) -> CandidateChanges:
        """Changes of an agent's sandbox against its snapshot (call it after the episode ended)."""
        diff = sandbox.diff()
        _check_count(len(diff.changed_paths), bounds)
        links: dict[str, str] = {}
        changed = {*diff.added, *diff.modified}
        if changed:
            # The interface reads through links; list them so they are recorded, not followed.
            listing = sandbox.execute(
                ["find", ".", "-type", "l", "-printf", "%P\\t%l\\n"], timeout_s=30
            )
            if not listing.ok:
                raise CandidateError(
                    f"cannot list links of the sandbox (exit {listing.exit_code}): "
                    f"{listing.stderr.strip()[:200]}"
                )
            for line in listing.stdout.splitlines():
                path, _, target = line.partition("\t")
                if path in changed:
                    links[path] = target

        def read_within_bounds(path: str) -> bytes:
            # Only as much as the candidate may hold is read: a huge file the agent wrote is
            # refused by its size, never read whole into the verifier's memory.
            try:
                ends = sandbox.read_file_ends(path, max_bytes=bounds.max_bytes)
            except PermissionError as error:  # a mode the agent set (docker reads as its uid)
                raise CandidateBoundsError(f"{error}; the candidate is not run") from None
            if ends.truncated:
                raise CandidateBoundsError(
                    f"changed file {path[:80]!r} is {ends.size_bytes} bytes, more than the "
                    f"{bounds.max_bytes} a candidate may change; the candidate is not run"
                )
            return ends.head

        return cls.from_diff(diff, read_within_bounds, symlinks=links, bounds=bounds)


def _check_count(count: int, bounds: CandidateBounds) -> None:
    if count > bounds.max_files:
        raise CandidateBoundsError(
            f"candidate changes {count} files, more than {bounds.max_files}; the candidate is "
            "not run"
        )
