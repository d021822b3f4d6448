"""The rules for every path a command writes (`--out` and the like), in one place: a command
replaces nothing but a regular file, never follows or replaces a symbolic link, and leaves
nothing half-written when it fails.

- A file target (`replacing_file`) is a new path in an existing directory, or a regular file,
  which is replaced whole: the content is written beside it and renamed over it at the end. A
  directory, a device node, a FIFO, a socket or a symbolic link (to anything, or dangling) is
  refused before anything is written.
- A directory target (`filling_directory`) is a new path in an existing directory, or an empty
  directory. The content is written into a hidden staging directory beside it and renamed into
  place once complete; on failure the staging directory is removed and the target is as before.
  A file, a non-empty directory, anything else and a symbolic link are refused.

Refusals raise `OutPathError` (exit 2), one line naming the path and what to pass instead.
"""

from __future__ import annotations

import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from rollyard.errors import OutPathError

PARTIAL_SUFFIX = ".partial"
"""Staging files and directories are `.NAME.<random>.partial` beside their target."""


def _kind(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device node"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _link_refusal(path: Path, what: str, wanted: str) -> OutPathError:
    try:
        pointed = f"a link to {_kind(path.stat().st_mode)}"
    except OSError:
        pointed = "a dangling link"
    return OutPathError(
        f"{what} {path}: is a symbolic link ({pointed}); rollyard never writes through or "
        f"replaces a link: name {wanted} by its real path"
    )


def _check_parent(path: Path, what: str) -> None:
    if not path.parent.is_dir():
        raise OutPathError(f"{what} {path}: its directory {path.parent} does not exist; create it")


def check_file_target(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """`path` as an absolute path if a command may write a file there (see the module doc);
    raises `OutPathError` otherwise."""
    target = Path(path).absolute()
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        _check_parent(target, what)
        return target
    if stat.S_ISLNK(mode):
        raise _link_refusal(target, what, "a new file or a regular file")
    if stat.S_ISDIR(mode):
        raise OutPathError(
            f"{what} {path}: is a directory; name a file, e.g. {Path(path) / 'report.html'}"
        )
    if not stat.S_ISREG(mode):
        raise OutPathError(
            f"{what} {path}: is {_kind(mode)}, not a regular file; rollyard replaces only "
            "regular files: name a new path"
        )
    return target


def check_directory_target(path: str | os.PathLike[str], what: str = "--out") -> Path:
    """`path` as an absolute path if a command may write a directory there (see the module
    doc); raises `OutPathError` otherwise."""
    target = Path(path).absolute()
    try:
        mode = target.lstat().st_mode
    except FileNotFoundError:
        _check_parent(target, what)
        return target
    if stat.S_ISLNK(mode):
        raise _link_refusal(target, what, "a new or empty directory")
    if not stat.S_ISDIR(mode):
        raise OutPathError(f"{what} {path}: is {_kind(mode)}; name a new or empty directory")
    if any(target.iterdir()):
        raise OutPathError(f"{what} {path}: is a directory that is not empty; name a new one")
    return target


@contextmanager
def replacing_file(
    path: str | os.PathLike[str], what: str = "--out", *, create: bool = True
) -> Iterator[Path]:
    """Yields a staging path beside `path` (checked by `check_file_target`) to write the whole
    content to; when the block ends without an error the staging file replaces `path` in one
    rename, else it is removed. With `create=False` the staging path does not exist yet (for a
    writer that must create its file itself, such as DuckDB)."""
    target = check_file_target(path, what)
    partial = target.with_name(f".{target.name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")
    if create:
        # O_EXCL | O_NOFOLLOW: the staging name is ours alone, whatever else is in the directory.
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            os.close(os.open(partial, flags, 0o666))
        except OSError as error:
            raise OutPathError(
                f"{what} {path}: cannot write beside it: {error.strerror}"
            ) from error
    try:
        yield partial
        try:
            staged_mode = partial.lstat().st_mode
        except FileNotFoundError:
            staged_mode = 0
        if not stat.S_ISREG(staged_mode):
            raise OutPathError(f"{what} {path}: the staged file {partial} is not a regular file")
        check_file_target(target, what)  # again: the target may have changed meanwhile
        try:
            os.replace(partial, target)
        except OSError as error:
            raise OutPathError(
                f"{what} {path}: cannot put it in place: {error.strerror}"
            ) from error
    finally:
        partial.unlink(missing_ok=True)


class StagedDirectory:
    """Where a command writes a directory's content (`path`) before `filling_directory`
    renames it to `target`."""

    def __init__(self, target: Path, path: Path, given: Path) -> None:
        self.target = target
        self.path = path
        self.given = given
        self.discarded = False

    def final(self, staged: str | os.PathLike[str]) -> Path:
        """Where a path under `path` will be once the directory is in place (under the target
        as the caller named it)."""
        return self.given / Path(staged).absolute().relative_to(self.path)

    def discard(self) -> None:
        """Publish nothing (a command that failed without raising); the target stays as it was."""
        self.discarded = True


@contextmanager
def filling_directory(
    path: str | os.PathLike[str], what: str = "--out"
) -> Iterator[StagedDirectory]:
    """Yields a `StagedDirectory` whose `path` (not created yet, in a hidden staging directory
    beside `path`) the block writes; when the block ends without an error and without
    `discard`, it is renamed to `path` (checked by `check_directory_target`), else removed."""
    target = check_directory_target(path, what)
    staging = target.with_name(f".{target.name}.{secrets.token_hex(6)}{PARTIAL_SUFFIX}")
    try:
        staging.mkdir(mode=0o700)
    except OSError as error:
        raise OutPathError(f"{what} {path}: cannot write beside it: {error.strerror}") from error
    try:
        staged = StagedDirectory(target, staging / target.name, Path(path))
        yield staged
        if staged.discarded:
            return
        if not staged.path.exists():
            staged.path.mkdir()  # a command that wrote nothing still leaves its directory
        check_directory_target(target, what)
        # rename(2) replaces an empty directory and refuses anything else (ENOTEMPTY, ENOTDIR).
        try:
            os.rename(staged.path, target)
        except OSError as error:
            raise OutPathError(
                f"{what} {path}: cannot put it in place: {error.strerror}"
            ) from error
    finally:
        shutil.rmtree(staging, ignore_errors=True)
