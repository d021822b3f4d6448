"""SWE-bench rows with a local clone -> Harbor tasks: history sanitized, tests protected, per-row
errors that leave the other rows imported."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tasks_lib import check_task, load_task
from tasks_lib.sources.swebench import import_swebench

BUGGY = "def area(width, height):\n    return width + height\n"
FIXED = "def area(width, height):\n    return width * height\n"
TESTS = "from geometry import area\n\n\ndef test_square():\n    assert area(2, 2) == 4\n"
NEW_TEST = "\n\ndef test_rectangle():\n    assert area(2, 5) == 10\n"


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.org",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.org"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env=env, check=True)  # fmt: skip
    return done.stdout.strip()


def _diff(repo: Path, path: str, new_text: str) -> str:
    """A git diff of `path` changed to `new_text` (the working tree is restored)."""
    target = repo / path
    old = target.read_text()
    target.write_text(new_text)
    patch = _git(repo, "diff", "--", path) + "\n"
    target.write_text(old)
    return patch


@pytest.fixture
def clone(tmp_path: Path) -> tuple[Path, str, dict[str, str]]:
    repo = tmp_path / "repos" / "acme__geometry"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "geometry.py").write_text(BUGGY)
    (repo / "tests").mkdir()
    (repo / "tests" / "test_geometry.py").write_text(TESTS.replace("4", "4 or True"))
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    patches = {
        "patch": _diff(repo, "geometry.py", FIXED),
        "test_patch": _diff(repo, "tests/test_geometry.py", TESTS + NEW_TEST),
    }
    # A later commit holds the fix: it must not reach the workspace through history.
    (repo / "geometry.py").write_text(FIXED)
    _git(repo, "commit", "-qam", "fix area")
    return tmp_path / "repos", base, patches


def _row(base: str, patches: dict[str, str], **changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "instance_id": "acme__geometry-1",
        "repo": "acme/geometry",
        "base_commit": base,
        "patch": patches["patch"],
        "test_patch": patches["test_patch"],
        "FAIL_TO_PASS": json.dumps(["tests/test_geometry.py::test_rectangle"]),
        "PASS_TO_PASS": json.dumps(["tests/test_geometry.py::test_square"]),
        "problem_statement": "area() returns the perimeter-ish sum instead of the area.",
    }
    row.update(changes)
    return row


def test_rows_import_with_history_sanitized_and_bad_rows_reported(
    clone: tuple[Path, str, dict[str, str]], tmp_path: Path
) -> None:
    repos, base, patches = clone
    lines = [
        json.dumps(_row(base, patches)),
        "{not json",
        json.dumps(_row(base, patches, instance_id="acme__geometry-2", base_commit="0" * 40)),
        json.dumps(_row(base, patches, instance_id="acme__geometry-3", test_patch="garbage\n")),
        json.dumps({"instance_id": "acme__geometry-4"}),
        json.dumps(_row(base, patches, instance_id="acme__geometry-5", repo="acme/missing")),
        json.dumps(
            _row(
                base,
                patches,
                instance_id="acme__geometry-6",
                FAIL_TO_PASS=["test_area (tests.GeometryTest)"],
            )
        ),
    ]
    instances = tmp_path / "instances.jsonl"
    instances.write_text("\n".join(lines) + "\n")
    report = import_swebench(instances, repos, tmp_path / "tasks")
    assert (report.imported, report.failed) == (1, 6)
    errors = [row.error for row in report.rows if not row.ok]
    assert "line 2: not valid JSON" in errors[0]
    assert "base_commit 0000000000000000000000000000000000000000 is not in the clone" in errors[1]
    assert "test_patch does not apply" in errors[2]
    assert "missing field(s) repo, base_commit" in errors[3]
    assert "no local clone of acme/missing" in errors[4]
    assert "not pytest node ids" in errors[5]
    assert not list((tmp_path / "tasks").glob("*.partial"))

    task = load_task(report.rows[0].task_dir)
    workspace = task.snapshot_dir
    assert sorted(p.name for p in workspace.iterdir()) == ["geometry.py", "tests"]  # no .git
    assert (workspace / "geometry.py").read_text() == BUGGY  # the base tree, not the fix
    assert "test_rectangle" in (workspace / "tests" / "test_geometry.py").read_text()
    assert task.fail_to_pass == ("tests/test_geometry.py::test_rectangle",)
    assert task.protected == ("tests/test_geometry.py",)
    assert task.family == "swebench" and task.source == f"acme/geometry@{base}"
    assert "perimeter" in task.instruction
    result = check_task(task)
    assert result.ok, result.problems


def test_cli_import_exit_codes(clone: tuple[Path, str, dict[str, str]], tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from flows.cli import main

    repos, base, patches = clone
    instances = tmp_path / "i.jsonl"
    instances.write_text(json.dumps(_row(base, patches)) + "\n{}\n")
    code = main(["tasks", "import-swebench", str(instances), "--repos", str(repos),
                 "--out", str(tmp_path / "tasks")])  # fmt: skip
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 4 and [row["ok"] for row in rows] == [True, False]
    assert main(["tasks", "import-swebench", str(tmp_path / "none.jsonl"), "--repos",
                 str(repos), "--out", str(tmp_path / "t")]) == 1  # fmt: skip
