"""A Python project as a clean task workspace: copied without anything that could hold a fix
(VCS history, caches, build output, editor backups), with its test paths and mutable modules found.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import os
import shutil
import stat
from pathlib import Path

from tasks_lib.errors import GenerationError

# Names dropped anywhere in the tree. VCS dirs hold history (the fix), caches hold bytecode of the
# original code, backups hold the original text next to the mutant.
EXCLUDED_DIR_NAMES = (
    ".git", ".hg", ".svn", ".bzr", "_darcs", ".jj", "CVS",
    "__pycache__", ".pytest_cache", ".mypy_cache", ".ruff_cache", ".hypothesis", ".tox", ".nox",
    ".eggs", ".venv", "venv", ".idea", ".vscode", "build", "dist", "htmlcov", ".benchmarks",
)  # fmt: skip
EXCLUDED_FILE_GLOBS = (
    "*.pyc", "*.pyo", "*.so", "*.pyd", "*~", "*.orig", "*.rej", "*.bak", "*.swp", "*.swo",
    ".#*", "#*#", "*.egg-info", ".gitignore", ".gitattributes", ".gitmodules", ".hgignore",
    ".coverage", ".coverage.*", "*.patch", "*.diff", ".DS_Store",
)  # fmt: skip
EXCLUDED_DIR_GLOBS = ("*.egg-info", "*.dist-info")

TEST_DIR_NAMES = ("tests", "test", "testing")
NON_LIBRARY_FILES = ("setup.py", "conftest.py", "noxfile.py", "fabfile.py", "tasks.py")
NON_LIBRARY_DIRS = ("docs", "doc", "examples", "example", "benchmarks", "bench", "scripts", "tools")

SRC_SHIM_MARKER = "# rollyard: src layout"
_SRC_SHIM = f"""{SRC_SHIM_MARKER}: the package lives under src/, which pytest does not import from
import os as _os
import sys as _sys

_sys.path.insert(0, _os.path.join(_os.path.dirname(_os.path.abspath(__file__)), "src"))
"""


def _excluded(name: str, is_dir: bool) -> bool:
    if is_dir:
        return name in EXCLUDED_DIR_NAMES or any(
            fnmatch.fnmatch(name, pattern) for pattern in EXCLUDED_DIR_GLOBS
        )
    return any(fnmatch.fnmatch(name, pattern) for pattern in EXCLUDED_FILE_GLOBS)


def is_test_file(relative: str) -> bool:
    name = relative.rsplit("/", 1)[-1]
    parts = relative.split("/")[:-1]
    return (
        (name.startswith("test_") and name.endswith(".py"))
        or name.endswith("_test.py")
        or name == "conftest.py"
        or any(part in TEST_DIR_NAMES for part in parts)
    )


def copy_clean(source: Path, dest: Path, *, skip: tuple[Path, ...] = ()) -> tuple[str, ...]:
    """Copy `source` to the new directory `dest` without VCS, caches, backups or build output.

    Symlinks are kept only when they stay inside the tree; special files are skipped, and so are
    the directories in `skip` (an output directory inside the project). A file with more hard
    links than the copied tree holds of it is left out: its other names lie outside the project,
    and its bytes may be any file of this machine. Returns the relative paths left out so."""
    if not source.is_dir():
        raise GenerationError(f"project {source} is not a directory; pass a Python project root")
    planned = _planned_copies(source, dest, skip)
    # The names of each inode inside the tree: distinct real paths, so a symlink's copy names
    # its target once more and no further link.
    names: dict[tuple[int, int], set[str]] = {}
    for _, full, info in planned:
        names.setdefault((info.st_dev, info.st_ino), set()).add(full)
    hardlinked: list[str] = []
    for target, full, info in planned:
        if not _copy_unlinked(full, target, info, len(names[(info.st_dev, info.st_ino)])):
            hardlinked.append(target.relative_to(dest).as_posix())
    return tuple(hardlinked)


def _planned_copies(
    source: Path, dest: Path, skip: tuple[Path, ...]
) -> list[tuple[Path, str, os.stat_result]]:
    """(target in `dest`, real path of the file to read, its stat) of every file to copy; makes
    `dest`'s directories."""
    skipped = {os.path.realpath(path) for path in (*skip, dest)}
    real_root = os.path.realpath(source)
    dest.mkdir(parents=True)
    planned: list[tuple[Path, str, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(source):
        here = Path(dirpath)
        rel_dir = here.relative_to(source)
        dirnames[:] = sorted(
            name
            for name in dirnames
            if not _excluded(name, True)
            and not (here / name).is_symlink()
            and os.path.realpath(here / name) not in skipped
        )
        for name in dirnames:
            (dest / rel_dir / name).mkdir()
        for name in sorted(filenames):
            if _excluded(name, False):
                continue
            # Directory links are not followed, so this is the file's real path.
            full = os.path.normpath(os.path.join(real_root, rel_dir, name))
            info = os.lstat(full)
            if stat.S_ISLNK(info.st_mode):
                full = os.path.realpath(full)
                if not (full.startswith(real_root + os.sep) and os.path.isfile(full)):
                    continue
                info = os.stat(full)  # inside the tree: kept as a plain file
            if stat.S_ISREG(info.st_mode):
                planned.append((dest / rel_dir / name, full, info))
    return planned


def _copy_unlinked(full: str, target: Path, planned: os.stat_result, names_inside: int) -> bool:
    """Copy the file at `full` unless it has a hard link outside the tree (False then). Checked
    on the opened file, so one swapped in after the walk is refused too."""
    try:
        fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        raise GenerationError(
            f"project file {full} cannot be read ({error.strerror}); make the project readable"
        ) from None
    with os.fdopen(fd, "rb") as handle:
        info = os.fstat(fd)
        same = (info.st_dev, info.st_ino) == (planned.st_dev, planned.st_ino)
        if not (same and stat.S_ISREG(info.st_mode)) or info.st_nlink > names_inside:
            return False
        with target.open("wb") as out:
            shutil.copyfileobj(handle, out)
    if info.st_mode & 0o111:
        target.chmod(0o755)
    return True


@dataclasses.dataclass(frozen=True, slots=True)
class ProjectLayout:
    """What synthesis needs to know about a project's workspace."""

    name: str
    test_paths: tuple[str, ...]
    """Workspace-relative paths pytest is run on (dirs or files)."""
    library_files: tuple[str, ...]
    """Modules mutations may touch: Python files that are not tests, conftest or tooling."""
    protected: tuple[str, ...]
    """Task-specific protected globs (test dirs the built-in globs do not cover, the shim)."""
    src_layout: bool


def _top_level_test_paths(workspace: Path, test_files: list[str]) -> tuple[str, ...]:
    paths: list[str] = []
    for relative in test_files:
        parts = relative.split("/")
        # The outermost test-named directory holding the file, else the file itself: its
        # directory may be the library (markdown's `markdown/test_tools.py`), and a test path
        # directory is protected, so a fix there would be dropped.
        cut = next((i for i, part in enumerate(parts[:-1]) if part in TEST_DIR_NAMES), None)
        paths.append("/".join(parts[: cut + 1]) if cut is not None else relative)
    minimal: list[str] = []
    for path in sorted(set(paths), key=lambda p: (p.count("/"), p)):
        if not any(path == kept or path.startswith(kept + "/") for kept in minimal):
            minimal.append(path)
    return tuple(sorted(minimal))


def inspect_project(workspace: Path, name: str | None = None) -> ProjectLayout:
    """Find test paths and library modules of the clean workspace."""
    test_files: list[str] = []
    library: list[str] = []
    for dirpath, dirnames, filenames in os.walk(workspace):
        dirnames.sort()
        rel_dir = Path(dirpath).relative_to(workspace).as_posix()
        for filename in sorted(filenames):
            if not filename.endswith(".py"):
                continue
            relative = filename if rel_dir == "." else f"{rel_dir}/{filename}"
            name_only = filename
            is_test = is_test_file(relative) and name_only != "conftest.py"
            if is_test and (name_only.startswith("test_") or name_only.endswith("_test.py")):
                test_files.append(relative)
            top = relative.split("/")[0] if "/" in relative else ""
            if (
                not is_test_file(relative)
                and name_only not in NON_LIBRARY_FILES
                and top not in NON_LIBRARY_DIRS
            ):
                library.append(relative)
    if not test_files:
        raise GenerationError(
            f"project {name or workspace} has no pytest test files (test_*.py or *_test.py); "
            "synthesis needs a test suite to decide which mutants break behaviour"
        )
    if not library:
        raise GenerationError(f"project {name or workspace} has no library modules to mutate")
    test_paths = _top_level_test_paths(workspace, test_files)
    protected = [f"{path}/**" for path in test_paths if (workspace / path).is_dir()]
    src_layout = (workspace / "src").is_dir() and any(p.startswith("src/") for p in library)
    return ProjectLayout(
        name=name or workspace.name,
        test_paths=test_paths,
        library_files=tuple(library),
        protected=tuple(protected),
        src_layout=src_layout,
    )


def add_src_shim(workspace: Path) -> None:
    """Make a src-layout package importable under the verifier's pytest (which ignores the
    project's own pytest configuration): prepend a sys.path line to the root conftest.py,
    which is a protected path, so a candidate cannot change it."""
    conftest = workspace / "conftest.py"
    existing = conftest.read_text(encoding="utf-8") if conftest.is_file() else ""
    if SRC_SHIM_MARKER in existing:
        return
    conftest.write_text(_SRC_SHIM + ("\n" + existing if existing else ""), encoding="utf-8")
