"""Every path a command writes against hostile targets: a device node, a FIFO, a directory and
symbolic links (to a file, to a directory, dangling) under each file `--out`, and the directory
rules (new or empty; a link, a file or a non-empty directory refused; nothing half-written) under
each directory `--out`. Each refusal is one line on stderr, exit 2, and the target and its
directory are exactly as they were. Device nodes are made with mknod in a scratch directory."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable
from pathlib import Path

import pytest

from flows.cli import main
from rollyard.errors import OutPathError
from rollyard.out_paths import PARTIAL_SUFFIX, filling_directory, replacing_file
from storage import TrajectoryStore
from tests.storage.shard_data import make_shard

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(300)]

FILE_TARGETS = ("device", "fifo", "directory", "link_to_file", "link_to_directory", "dangling")
DIRECTORY_TARGETS = (
    "device",
    "fifo",
    "file",
    "full_directory",
    "link_to_file",
    "link_to_directory",
    "dangling",
)


def make_target(kind: str, scratch: Path) -> Path:
    """A hostile `--out` of `kind` in `scratch` (links point inside it too)."""
    target = scratch / f"target-{kind}"
    if kind == "device":
        try:  # a char device like /dev/null's (1, 3), but a node of our own, never the host's
            os.mknod(target, stat.S_IFCHR | 0o600, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("mknod needs CAP_MKNOD")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "file":
        target.write_text("keep me\n")
    elif kind in ("directory", "full_directory"):
        target.mkdir()
        (target / "keep.txt").write_text("keep me\n")
    elif kind == "link_to_file":
        (scratch / "pointed.txt").write_text("keep me\n")
        target.symlink_to(scratch / "pointed.txt")
    elif kind == "link_to_directory":
        (scratch / "pointed").mkdir()  # empty: a directory --out would accept it by its name
        target.symlink_to(scratch / "pointed")
    elif kind == "dangling":
        target.symlink_to(scratch / "nowhere")
    return target


def state_of(scratch: Path) -> dict[str, tuple[int, int, int, int]]:
    """Every entry under `scratch`, links not followed: (inode, mode, size, device number)."""
    found = {}
    for path in [scratch, *scratch.rglob("*")]:
        info = path.lstat()
        key = path.relative_to(scratch).as_posix()
        found[key] = (info.st_ino, info.st_mode, info.st_size, info.st_rdev)
    return found


def refused(argv: list[str], capsys: pytest.CaptureFixture[str], phrase: str) -> str:
    code = main(argv)
    err = capsys.readouterr().err.strip()
    assert code == 2, (code, err)
    assert len(err.splitlines()) == 1 and phrase in err, err
    return err


@pytest.fixture(scope="module")
def store_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("out-paths") / "store"
    store = TrajectoryStore(root)
    for shard in range(2):
        episodes, steps = make_shard("run", 0, shard)
        store.commit_iteration_shard("run", 0, shard, episodes=episodes, steps=steps)
    return root


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tasks_lib.sources.families.demo.generate import generate_demo_tasks

    directory = tmp_path_factory.mktemp("tasks")
    return generate_demo_tasks(directory, 1, seed=3)[0]


# ---- file --out ---------------------------------------------------------------------------

FILE_COMMANDS: dict[str, Callable[[Path, Path], list[str]]] = {
    "report": lambda store, out: ["report", "--store", str(store), "--out", str(out)],
    "store duckdb-file": lambda store, out: [
        "store",
        "duckdb-file",
        str(out),
        "--store",
        str(store),
    ],
}


@pytest.mark.parametrize("kind", FILE_TARGETS)
@pytest.mark.parametrize("command", sorted(FILE_COMMANDS))
def test_a_file_out_that_is_not_a_regular_file_is_refused_and_left_alone(
    command: str, kind: str, store_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = make_target(kind, tmp_path)
    before = state_of(tmp_path)
    expected = "symbolic link" if kind.startswith("link") or kind == "dangling" else "is a"
    refused(FILE_COMMANDS[command](store_root, target), capsys, expected)
    assert state_of(tmp_path) == before  # the node, the link and its target; no partial file


@pytest.mark.parametrize("command", sorted(FILE_COMMANDS))
def test_a_file_out_that_is_a_regular_file_is_replaced_whole(
    command: str, store_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    target = tmp_path / "out.file"
    target.write_text("old\n")
    old_inode = target.stat().st_ino
    assert main(FILE_COMMANDS[command](store_root, target)) == 0, capsys.readouterr().err
    assert target.stat().st_ino != old_inode and target.read_bytes() != b"old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.file"]  # nothing beside it


def test_a_file_out_whose_directory_does_not_exist_is_refused(
    store_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    refused(FILE_COMMANDS["report"](store_root, tmp_path / "no" / "r.html"), capsys, "create it")
    assert not (tmp_path / "no").exists()


# ---- directory --out ----------------------------------------------------------------------


def directory_commands(store: Path, task: Path, scratch: Path) -> dict[str, list[str]]:
    """argv per command with a directory output, `{out}` standing for it. Each is refused on
    its output before anything else runs, so the other arguments need only exist."""
    instances = scratch / "instances.jsonl"
    instances.write_text("{}\n")
    return {
        "export": ["export", "--store", str(store), "--out", "{out}"],
        "tasks demo": ["tasks", "demo", "--out", "{out}", "--count", "1"],
        "tasks generate": ["tasks", "generate", "flags", "--out", "{out}", "--count", "1"],
        "tasks synthesize": ["tasks", "synthesize", str(task), "--out", "{out}"],
        "tasks import-swebench": [
            "tasks",
            "import-swebench",
            str(instances),
            "--repos",
            str(task),
            "--out",
            "{out}",
        ],
        "tasks checkout": ["tasks", "checkout", str(task), "{out}"],
        "sft": [
            "sft",
            "--tasks",
            str(task.parent),
            "--policy",
            f"hf:{task}",
            "--out",
            "{out}",
            "--store",
            str(scratch / "sft-store"),
        ],
    }


DIRECTORY_COMMANDS = (
    "export",
    "tasks demo",
    "tasks generate",
    "tasks synthesize",
    "tasks import-swebench",
    "tasks checkout",
    "sft",
)


@pytest.mark.parametrize("kind", DIRECTORY_TARGETS)
@pytest.mark.parametrize("command", DIRECTORY_COMMANDS)
def test_a_directory_out_that_is_not_new_or_empty_is_refused_and_left_alone(
    command: str,
    kind: str,
    store_root: Path,
    task_dir: Path,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    target = make_target(kind, scratch)
    argv = directory_commands(store_root, task_dir, tmp_path)[command]
    before = state_of(scratch)
    expected = {
        "full_directory": "not empty",
        "link_to_file": "symbolic link",
        "link_to_directory": "symbolic link",
        "dangling": "symbolic link",
    }.get(kind, "name a new or empty directory")
    refused([str(target) if a == "{out}" else a for a in argv], capsys, expected)
    assert state_of(scratch) == before  # no staging directory left, the link's target empty


def test_a_directory_out_may_be_an_empty_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "tasks"
    out.mkdir()
    assert main(["tasks", "demo", "--out", str(out), "--count", "2"]) == 0
    assert len(list(out.iterdir())) == 2
    assert [p.name for p in tmp_path.iterdir()] == ["tasks"]  # the staging directory is gone


def test_a_failed_export_leaves_no_directory_and_nothing_beside_it(
    store_root: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "export"
    refused(
        ["export", "--store", str(store_root), "--run", "no-such-run", "--out", str(out)],
        capsys,
        "no committed, non-quarantined episodes",
    )
    assert list(tmp_path.iterdir()) == []


def test_what_a_failing_writer_wrote_is_removed_and_the_target_kept(tmp_path: Path) -> None:
    out = tmp_path / "out"
    with pytest.raises(RuntimeError), filling_directory(out) as staged:
        staged.path.mkdir()
        (staged.path / "half.txt").write_text("half")
        raise RuntimeError("the writer died half-way")
    assert list(tmp_path.iterdir()) == []
    kept = tmp_path / "kept.txt"
    kept.write_text("old")
    with pytest.raises(RuntimeError), replacing_file(kept) as partial:
        partial.write_text("half")
        raise RuntimeError("the writer died half-way")
    assert kept.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["kept.txt"]


def test_a_target_swapped_for_a_fifo_while_writing_is_not_replaced(tmp_path: Path) -> None:
    """The target is checked again just before the rename: a FIFO put there meanwhile stays."""
    out = tmp_path / "out.html"
    with pytest.raises(OutPathError, match="FIFO"), replacing_file(out) as partial:
        partial.write_text("page")
        os.mkfifo(out)
    assert stat.S_ISFIFO(out.lstat().st_mode)
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(PARTIAL_SUFFIX)]
