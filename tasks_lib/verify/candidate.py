"""A candidate solution as changes to a task's workspace: what the verifier applies to a fresh
sandbox. Build one from a directory (the workspace as the agent left it) or from the agent's
sandbox (its `diff()` plus the bytes of each changed file)."""

from __future__ import annotations

import dataclasses
import os
import stat
from collections.abc import Callable, Mapping
from pathlib import Path

from sandboxes import Sandbox, SandboxError, WorkspaceDiff
from tasks_lib.errors import CandidateError

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class CandidateChanges:
    """Changed files of a workspace against its snapshot, as workspace-relative POSIX paths."""

    files: Mapping[str, bytes] = dataclasses.field(default_factory=dict)
    """Added or modified regular files and their new bytes."""
    deleted: tuple[str, ...] = ()
    """Snapshot files that are gone."""
    symlinks: Mapping[str, str] = dataclasses.field(default_factory=dict)
    """Added or replaced symbolic links and their targets (never followed, never applied)."""

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
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> CandidateChanges:
        """Compare `candidate_dir` (the workspace as the agent left it) with `snapshot_dir`.

        Links are recorded, never followed: a link may point anywhere on this machine.
        """
        candidate = Path(candidate_dir)
        snapshot = Path(snapshot_dir)
        if not candidate.is_dir():
            raise CandidateError(
                f"candidate {candidate} is not a directory; pass the workspace the agent left"
            )
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
                if total_bytes > max_bytes:
                    raise CandidateError(
                        f"candidate {candidate} changes more than {max_bytes} bytes of files; "
                        "remove large generated files or raise max_bytes"
                    )
                files[rel] = data
        deleted: list[str] = []
        for dirpath, _dirnames, filenames in os.walk(snapshot, followlinks=False):
            for name in filenames:
                rel = (Path(dirpath) / name).relative_to(snapshot).as_posix()
                if rel not in seen:
                    deleted.append(rel)
        return cls(files=files, deleted=tuple(sorted(deleted)), symlinks=symlinks)

    @classmethod
    def from_diff(
        cls,
        diff: WorkspaceDiff,
        read_file: Callable[[str], bytes],
        *,
        symlinks: Mapping[str, str] | None = None,
        max_bytes: int = DEFAULT_MAX_BYTES,
    ) -> CandidateChanges:
        """Changes from a sandbox diff and a reader of the changed files' bytes."""
        links = dict(symlinks or {})
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
            if total_bytes > max_bytes:
                raise CandidateError(
                    f"candidate changes more than {max_bytes} bytes of files; raise max_bytes"
                )
            files[path] = data
        return cls(files=files, deleted=tuple(diff.deleted), symlinks=links)

    @classmethod
    def from_sandbox(
        cls, sandbox: Sandbox, *, max_bytes: int = DEFAULT_MAX_BYTES
    ) -> CandidateChanges:
        """Changes of an agent's sandbox against its snapshot (call it after the episode ended)."""
        diff = sandbox.diff()
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
        return cls.from_diff(diff, sandbox.read_file, symlinks=links, max_bytes=max_bytes)
