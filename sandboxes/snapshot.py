"""Snapshots: the immutable, digest-addressed initial workspace a sandbox starts from.

`prepare_snapshot(path)` validates a directory, computes its content digest, and installs a private
copy under the snapshot store (owned by the sandbox uid, so the sandbox can edit files through the
copy-on-write layer). The same content always yields the same digest and the same store entry, so
a task starts from exactly the same state every time, and a changed source is noticed.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass
from pathlib import Path

from sandboxes import host
from sandboxes.base import WorkspaceDiff
from sandboxes.errors import SnapshotError

DIGEST_PREFIX = "sha256:"


@dataclass(frozen=True, slots=True)
class PreparedSnapshot:
    source: Path
    """The directory the caller named."""
    digest: str
    """`sha256:<hex>` over paths, file types, executable bits, contents and link targets."""
    lower_dir: Path
    """The private, read-only copy the overlay uses as its lower layer."""


def _entries(root: Path) -> list[tuple[str, os.stat_result]]:
    """Every path under root (relative, POSIX, sorted), not following symlinks."""
    entries: list[tuple[str, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in [*dirnames, *filenames]:
            full = base / name
            entries.append((full.relative_to(root).as_posix(), full.lstat()))
    entries.sort(key=lambda item: item[0])
    return entries


def _check_entry(root: Path, relpath: str, st: os.stat_result) -> None:
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        target = os.readlink(root / relpath)
        resolved = os.path.normpath(os.path.join(os.path.dirname(relpath), target))
        # The lexical check misses chains such as `d/up -> ..` plus `e -> d/up/..`; resolving
        # the link on disk catches those.
        real_root = os.path.realpath(root)
        real = os.path.realpath(root / relpath)
        escapes = real != real_root and not real.startswith(real_root + os.sep)
        if os.path.isabs(target) or resolved == ".." or resolved.startswith("../") or escapes:
            raise SnapshotError(
                f"snapshot {root}: symlink {relpath} -> {target} points outside the snapshot; "
                "make it relative and inside, or replace it with the file it names"
            )
    elif not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise SnapshotError(
            f"snapshot {root}: {relpath} is not a regular file, directory or symlink; "
            "remove device files, sockets and FIFOs from the workspace"
        )


def _file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def snapshot_digest(root: Path) -> str:
    """Content digest of a directory tree (ownership and timestamps do not count)."""
    if not root.is_dir():
        raise SnapshotError(f"snapshot {root} is not a directory; pass the task's workspace dir")
    hasher = hashlib.sha256()
    for relpath, st in _entries(root):
        _check_entry(root, relpath, st)
        if stat.S_ISDIR(st.st_mode):
            record = f"d {relpath}"
        elif stat.S_ISLNK(st.st_mode):
            record = f"l {relpath} {os.readlink(root / relpath)}"
        else:
            executable = "x" if st.st_mode & 0o111 else "-"
            record = f"f{executable} {relpath} {_file_sha256(root / relpath)}"
        hasher.update(record.encode("utf-8", "surrogateescape") + b"\0")
    return DIGEST_PREFIX + hasher.hexdigest()


def _stat_signature(root: Path) -> tuple[tuple[str, int, int, int, int], ...]:
    # Cheap change detector: re-hashing thousands of files on every open would dominate start-up.
    return tuple(
        (rel, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino) for rel, st in _entries(root)
    )


_digest_cache: dict[Path, tuple[tuple[tuple[str, int, int, int, int], ...], str]] = {}


def cached_snapshot_digest(root: Path) -> str:
    root = root.resolve()
    signature = _stat_signature(root)
    cached = _digest_cache.get(root)
    if cached and cached[0] == signature:
        return cached[1]
    digest = snapshot_digest(root)
    _digest_cache[root] = (signature, digest)
    return digest


def prepare_snapshot(source: Path, store_dir: Path, *, owner_uid: int) -> PreparedSnapshot:
    """Validate `source`, and install its private copy in `store_dir` if not already there."""
    source = Path(source)
    if not source.exists():
        raise SnapshotError(f"snapshot {source} does not exist; pass an existing directory")
    digest = cached_snapshot_digest(source)
    lower = store_dir / digest.removeprefix(DIGEST_PREFIX)
    if lower.is_dir():
        return PreparedSnapshot(source=source, digest=digest, lower_dir=lower)
    store_dir.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=host.staging_prefix(), dir=store_dir))
    try:
        shutil.copytree(source, staging / "tree", symlinks=True)
        tree = staging / "tree"
        for dirpath, dirnames, filenames in os.walk(tree):
            for name in [dirpath, *(os.path.join(dirpath, n) for n in dirnames + filenames)]:
                os.lchown(name, owner_uid, owner_uid)
                if not os.path.islink(name):
                    # The sandbox user must be able to read everything and edit through the
                    # overlay, whatever modes the source had.
                    mode = os.lstat(name).st_mode
                    os.chmod(
                        name,
                        stat.S_IMODE(mode)
                        | stat.S_IRUSR
                        | stat.S_IWUSR
                        | (stat.S_IXUSR if stat.S_ISDIR(mode) else 0),
                    )
        if snapshot_digest(tree) != digest:
            raise SnapshotError(
                f"snapshot {source} changed while it was being copied; retry when it is stable"
            )
        try:
            tree.rename(lower)  # atomic publish: readers see a complete tree or none
        except OSError:
            if not lower.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return PreparedSnapshot(source=source, digest=digest, lower_dir=lower)


def diff_trees(base: Path, other: Path) -> WorkspaceDiff:
    """Files and symlinks added, modified (content, link target or exec bit) or deleted in
    `other` relative to `base`. Directories count only through the files they hold."""
    base_entries = {rel: st for rel, st in _entries(base) if not stat.S_ISDIR(st.st_mode)}
    other_entries = {rel: st for rel, st in _entries(other) if not stat.S_ISDIR(st.st_mode)}
    added = sorted(set(other_entries) - set(base_entries))
    deleted = sorted(set(base_entries) - set(other_entries))
    modified = sorted(
        rel
        for rel in set(base_entries) & set(other_entries)
        if not same_entry(base / rel, base_entries[rel], other / rel, other_entries[rel])
    )
    return WorkspaceDiff(added=tuple(added), modified=tuple(modified), deleted=tuple(deleted))


def same_entry(a: Path, a_st: os.stat_result, b: Path, b_st: os.stat_result) -> bool:
    if stat.S_IFMT(a_st.st_mode) != stat.S_IFMT(b_st.st_mode):
        return False
    if stat.S_ISLNK(a_st.st_mode):
        return os.readlink(a) == os.readlink(b)
    if (a_st.st_mode & 0o111 != 0) != (b_st.st_mode & 0o111 != 0):
        return False
    if a_st.st_size != b_st.st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        while True:
            chunk_a, chunk_b = fa.read(1 << 16), fb.read(1 << 16)
            if chunk_a != chunk_b:
                return False
            if not chunk_a:
                return True
