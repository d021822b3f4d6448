"""Snapshots: the immutable, digest-addressed initial workspace a sandbox starts from.

`prepare_snapshot(path)` validates a directory, computes its content digest, and installs a private
copy under the snapshot store (owned by the sandbox uid, so the sandbox can edit files through the
copy-on-write layer). The same content always yields the same digest and the same store entry, so
a task starts from exactly the same state every time, and a changed source is noticed.

Every tree is walked by `stat` alone first, within `TreeBounds` (bytes apparent and allocated,
entries, path length, depth; no sparse files), so nothing is read or copied from a tree that is too
big. The store is a cache with a byte budget (`SnapshotCache`): least recently used entries that no
sandbox has mounted are evicted.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rollyard.settings import settings
from sandboxes import host
from sandboxes.base import Limits, WorkspaceDiff
from sandboxes.errors import SnapshotError

DIGEST_PREFIX = "sha256:"

MAX_PATH_BYTES = 1024
"""Longest path inside a workspace, in bytes (relative to its root)."""
MAX_DEPTH = 64
"""Deepest nesting of a workspace (`a/b/c` is 3 deep)."""
SPARSE_SLACK_BYTES = 1 << 20
"""Unallocated bytes a file may have before it counts as sparse (filesystems round, compress)."""

# Never a workspace: the root, the top-level system directories, and anything in the kernel's
# pseudo file systems, which a walk cannot bound (files that change size as they are read).
_SYSTEM_DIRS = frozenset(
    Path(p)
    for p in (
        "/", "/bin", "/boot", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
        "/mnt", "/opt", "/root", "/sbin", "/srv", "/tmp", "/usr", "/usr/bin", "/usr/lib",
        "/usr/local", "/usr/share", "/var", "/var/lib", "/var/tmp",
    )
)  # fmt: skip
_PSEUDO_FILESYSTEMS = tuple(Path(p) for p in ("/proc", "/sys", "/dev", "/run"))

CACHE_GRACE_S = 600.0
"""Entries used this recently are never evicted automatically: an opener between its cache hit
and its mount is not yet visible as a mount."""


@dataclass(frozen=True, slots=True)
class TreeBounds:
    """What a workspace tree may hold; checked while it is walked, by `stat` alone."""

    max_bytes: int = 1024 << 20
    """Bytes of regular files, apparent (`st_size`) and allocated (`st_blocks`), each."""
    max_entries: int = 50_000
    """Files, directories and links."""
    max_path_bytes: int = MAX_PATH_BYTES
    max_depth: int = MAX_DEPTH

    @classmethod
    def of(cls, limits: Limits) -> TreeBounds:
        return cls(max_bytes=limits.workspace_mb << 20, max_entries=limits.workspace_files)


# For measuring entries already in the store (they passed their bounds when they were made).
_UNBOUNDED = TreeBounds(max_bytes=1 << 62, max_entries=1 << 62, max_path_bytes=1 << 16,
                        max_depth=1 << 16)  # fmt: skip


@dataclass(frozen=True, slots=True)
class TreeSize:
    entries: int
    apparent_bytes: int
    allocated_bytes: int


@dataclass(frozen=True, slots=True)
class PreparedSnapshot:
    source: Path
    """The directory the caller named."""
    digest: str
    """`sha256:<hex>` over paths, file types, executable bits, contents and link targets."""
    lower_dir: Path
    """The private, read-only copy the overlay uses as its lower layer."""


def check_workspace_root(source: Path, *, state_root: Path | None = None) -> None:
    """Refuse a workspace that is a system path, lies in a pseudo file system (/proc, /sys, ...)
    or inside the sandboxes' own state directory `state_root`."""
    real = Path(os.path.realpath(source))

    def inside(parent: Path) -> bool:
        return real == parent or parent in real.parents

    if real in _SYSTEM_DIRS or any(inside(p) for p in _PSEUDO_FILESYSTEMS):
        raise SnapshotError(
            f"workspace {source} is a system path ({real}); give the directory of a task's "
            "workspace"
        )
    if state_root is not None and inside(Path(os.path.realpath(state_root))):
        raise SnapshotError(
            f"workspace {source} lies in the sandboxes' own state directory {state_root}; "
            "give the directory of a task's workspace"
        )


def _walk(root: Path, bounds: TreeBounds) -> tuple[list[tuple[str, os.stat_result]], TreeSize]:
    """Every path under root (relative, POSIX, sorted) with its lstat, and the tree's size.

    Raises `SnapshotError` as soon as the tree leaves `bounds`, before anything is read: no file
    is opened here, and a directory is listed only while the entries so far are in bounds.
    """
    entries: list[tuple[str, os.stat_result]] = []
    apparent = allocated = 0
    pending = [""]
    while pending:
        directory = pending.pop()
        relpath = directory or "."
        try:
            # Entry by entry, not listed whole first: a directory of millions of files stops
            # the walk at the bound, not after it was read.
            with os.scandir(root / directory) as listing:
                for child in listing:
                    relpath = f"{directory}/{child.name}" if directory else child.name
                    st = child.stat(follow_symlinks=False)
                    entries.append((relpath, st))
                    _check_bounds(root, relpath, st, len(entries), bounds)
                    if stat.S_ISDIR(st.st_mode):
                        pending.append(relpath)
                    elif stat.S_ISREG(st.st_mode):
                        apparent += st.st_size
                        allocated += st.st_blocks * 512
                        if apparent > bounds.max_bytes or allocated > bounds.max_bytes:
                            raise SnapshotError(
                                f"snapshot {root}: more than {bounds.max_bytes >> 20} MB of "
                                f"files (at {relpath}: {apparent >> 20} MB apparent, "
                                f"{allocated >> 20} MB allocated); leave build output and data "
                                "out of the workspace, or raise Limits.workspace_mb"
                            )
        except OSError as error:
            raise SnapshotError(
                f"snapshot {root}: cannot read {relpath} ({error.strerror}); make the workspace "
                "readable"
            ) from None
    entries.sort(key=lambda item: item[0])
    return entries, TreeSize(len(entries), apparent, allocated)


def _check_bounds(root: Path, relpath: str, st: os.stat_result, count: int,
                  bounds: TreeBounds) -> None:  # fmt: skip
    if count > bounds.max_entries:
        raise SnapshotError(
            f"snapshot {root}: more than {bounds.max_entries} files and directories; leave "
            "build output and caches out of the workspace, or raise Limits.workspace_files"
        )
    if len(os.fsencode(relpath)) > bounds.max_path_bytes:
        raise SnapshotError(
            f"snapshot {root}: path {relpath[:80]}... is longer than "
            f"{bounds.max_path_bytes} bytes; shorten it"
        )
    if relpath.count("/") + 1 > bounds.max_depth:
        raise SnapshotError(
            f"snapshot {root}: {relpath[:80]}... is nested deeper than {bounds.max_depth} "
            "directories; flatten it"
        )
    if stat.S_ISREG(st.st_mode):
        unallocated = st.st_size - st.st_blocks * 512
        if unallocated > max(SPARSE_SLACK_BYTES, st.st_size // 2):
            raise SnapshotError(
                f"snapshot {root}: {relpath} is a sparse file ({st.st_size} bytes apparent, "
                f"{st.st_blocks * 512} allocated); workspaces hold plain files: remove it or "
                "write it out in full"
            )


def tree_size(root: Path, bounds: TreeBounds | None = None) -> TreeSize:
    """The size of the tree at `root`, by `stat` alone; `SnapshotError` beyond `bounds`."""
    return _walk(root, bounds or TreeBounds())[1]


def check_tree(root: Path, bounds: TreeBounds | None = None) -> TreeSize:
    """Everything a snapshot of `root` would refuse, found by `stat` and `readlink` alone, without
    reading or copying a file: the tree's bounds, links leaving it, device files, FIFOs and
    sockets. Raises `SnapshotError`; returns the tree's size. What task validation runs."""
    entries, size = _walk(root, bounds or TreeBounds())
    for relpath, st in entries:
        _check_entry(root, relpath, st)
    return size


def check_plain_tree(root: Path, bounds: TreeBounds | None = None) -> TreeSize:
    """What a sandbox refuses of any tree it is handed, found by `stat` alone before a file is
    read: a system path or pseudo file system (/, /dev, /proc, /sys), a tree beyond `bounds`,
    device files, FIFOs and sockets. Links are left to the caller. Returns the tree's size."""
    check_workspace_root(root)
    entries, size = _walk(root, bounds or TreeBounds())
    for relpath, st in entries:
        check_file_type(root, relpath, st)
    return size


def _entries(root: Path, bounds: TreeBounds | None = None) -> list[tuple[str, os.stat_result]]:
    return _walk(root, bounds or TreeBounds())[0]


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
    else:
        check_file_type(root, relpath, st)


def check_file_type(root: Path, relpath: str, st: os.stat_result) -> None:
    """Refuse a device file, FIFO or socket: opening one can block or read without end."""
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise SnapshotError(
            f"snapshot {root}: {relpath} is not a regular file, directory or symlink; "
            "remove device files, sockets and FIFOs from the workspace"
        )


def _file_sha256(path: Path) -> str:
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()


def snapshot_digest(root: Path, bounds: TreeBounds | None = None) -> str:
    """Content digest of a directory tree (ownership and timestamps do not count)."""
    if not root.is_dir():
        raise SnapshotError(f"snapshot {root} is not a directory; pass the task's workspace dir")
    hasher = hashlib.sha256()
    for relpath, st in _entries(root, bounds):
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


Signature = tuple[tuple[str, int, int, int, int], ...]


def _stat_signature(root: Path, bounds: TreeBounds) -> tuple[Signature, TreeSize]:
    # Cheap change detector: re-hashing thousands of files on every open would dominate start-up.
    entries, size = _walk(root, bounds)
    signature = tuple(
        (rel, st.st_mode, st.st_size, st.st_mtime_ns, st.st_ino) for rel, st in entries
    )
    return signature, size


_digest_cache: dict[Path, tuple[Signature, str]] = {}


def cached_snapshot_digest(root: Path, bounds: TreeBounds | None = None) -> tuple[str, TreeSize]:
    """The digest of `root`, recomputed only when a `stat` of its entries changed; and its size.
    The bounded walk runs every time, before anything is read."""
    root = root.resolve()
    signature, size = _stat_signature(root, bounds or TreeBounds())
    cached = _digest_cache.get(root)
    if cached and cached[0] == signature:
        return cached[1], size
    digest = snapshot_digest(root, bounds)
    _digest_cache[root] = (signature, digest)
    return digest, size


def prepare_snapshot(source: Path, store_dir: Path, *, owner_uid: int,
                     bounds: TreeBounds | None = None,
                     cache_budget_bytes: int | None = None) -> PreparedSnapshot:  # fmt: skip
    """Validate `source` (within `bounds`), and install its private copy in `store_dir` if not
    already there; then, with a `cache_budget_bytes`, evict least recently used entries of the
    store beyond it."""
    source = Path(source)
    if not source.exists():
        raise SnapshotError(f"snapshot {source} does not exist; pass an existing directory")
    check_workspace_root(source, state_root=store_dir.parent)
    digest, size = cached_snapshot_digest(source, bounds)
    cache = SnapshotCache(store_dir)
    lower = store_dir / digest.removeprefix(DIGEST_PREFIX)
    if lower.is_dir():
        cache.touch(lower.name)
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
        if snapshot_digest(tree, bounds) != digest:
            raise SnapshotError(
                f"snapshot {source} changed while it was being copied; retry when it is stable"
            )
        cache.record(lower.name, size.allocated_bytes)
        try:
            tree.rename(lower)  # atomic publish: readers see a complete tree or none
        except OSError:
            if not lower.is_dir():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    if cache_budget_bytes is not None:
        cache.prune(cache_budget_bytes, grace_s=CACHE_GRACE_S)
    return PreparedSnapshot(source=source, digest=digest, lower_dir=lower)


# -- the snapshot cache -----------------------------------------------------------------------------


def default_cache_budget_bytes() -> int:
    """The bwrap snapshot store's byte budget: `ROLLYARD_SNAPSHOT_CACHE_MB`, default 4096 MB."""
    megabytes = settings().snapshot_cache_mb
    return megabytes << 20


@dataclass(frozen=True, slots=True)
class CacheEntry:
    name: str
    """The digest's hex: the entry is `<store>/<name>/`."""
    size_bytes: int
    last_used: float
    """Unix time of the last sandbox opened over it."""
    mounted: bool


class SnapshotCache:
    """The snapshot store seen as a cache. Beside each entry `<hex>/`, a file `<hex>.used` holds
    the entry's allocated bytes, and its mtime is when a sandbox last opened over the entry."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def _usage(self, name: str) -> Path:
        return self.directory / f"{name}.used"

    def record(self, name: str, size_bytes: int) -> None:
        self._usage(name).write_text(f"{size_bytes}\n")

    def touch(self, name: str) -> None:
        usage = self._usage(name)
        try:
            os.utime(usage)
        except FileNotFoundError:  # an entry from before usage files: measure it once
            self.record(name, tree_size(self.directory / name, _UNBOUNDED).allocated_bytes)

    def entries(self) -> list[CacheEntry]:
        """Every entry, least recently used first."""
        if not self.directory.is_dir():
            return []
        mounted = _mounted_lower_dirs()
        found = []
        for entry in self.directory.iterdir():
            if entry.name.startswith(".") or not entry.is_dir() or entry.is_symlink():
                continue
            usage = self._usage(entry.name)
            if not usage.exists():
                self.touch(entry.name)
            with contextlib.suppress(FileNotFoundError, ValueError):
                found.append(
                    CacheEntry(
                        name=entry.name,
                        size_bytes=int(usage.read_text()),
                        last_used=usage.stat().st_mtime,
                        mounted=str(entry) in mounted,
                    )
                )
        return sorted(found, key=lambda e: (e.last_used, e.name))

    def prune(self, budget_bytes: int, *, grace_s: float = CACHE_GRACE_S) -> list[CacheEntry]:
        """Evict least recently used entries until the store holds at most `budget_bytes`;
        entries a sandbox has mounted, or used within `grace_s`, stay. Returns the evicted."""
        for doomed in self.directory.glob(".evicting-*"):
            if not host.owner_alive(doomed.name.rsplit("-", 1)[-1]):
                shutil.rmtree(doomed, ignore_errors=True)  # its pruner died mid-way
        entries = self.entries()
        total = sum(e.size_bytes for e in entries)
        evicted = []
        now = time.time()
        for entry in entries:
            if total <= budget_bytes:
                break
            if entry.mounted or now - entry.last_used < grace_s:
                continue
            # Rename first (atomic): an opener either finds the whole entry or none, and a
            # half-deleted tree is never a lower layer.
            doomed = self.directory / f".evicting-{entry.name}-{host.owner_token()}"
            try:
                (self.directory / entry.name).rename(doomed)
            except OSError:
                continue  # evicted by another process just now
            self._usage(entry.name).unlink(missing_ok=True)
            shutil.rmtree(doomed, ignore_errors=True)
            total -= entry.size_bytes
            evicted.append(entry)
        return evicted


def _mounted_lower_dirs() -> set[str]:
    """Lower directories of the overlay mounts on this host (the mount namespace's table)."""
    lower: set[str] = set()
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            fields = line.split()
            if len(fields) < 4 or fields[2] != "overlay":
                continue
            for option in fields[3].split(","):
                if option.startswith("lowerdir="):
                    for directory in option.removeprefix("lowerdir=").split(":"):
                        lower.add(directory.replace("\\040", " "))
    return lower


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
