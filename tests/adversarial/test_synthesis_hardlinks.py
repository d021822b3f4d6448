"""A project handed to `tasks synthesize` holding hard links to files outside it (a host secret,
another user's file): the synthesizer copies no such file into a task and says which it left out.
Links the project holds among its own files are copied as usual."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tasks_lib.sources.synthesize import copy_clean
from tests.tasks_import.project_fixture import make_project

REPO_ROOT = Path(__file__).resolve().parents[2]
# Outer bound of the synthesize command, sized for a loaded shared host, not an expectation.
COMMAND_TIMEOUT_S = 300
SECRET = b"host secret: d0e5c1b2a39f\n"

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(600)]


def project_linking_out(tmp_path: Path) -> Path:
    """A small project whose helpers/data.txt is a hard link to a file outside it, and whose
    helpers/also.txt is a symlink to that hard link (one more name inside, still one outside)."""
    secret = tmp_path / "outside" / "secret.txt"
    secret.parent.mkdir()
    secret.write_bytes(SECRET)
    project = make_project(tmp_path / "project")
    os.link(secret, project / "helpers" / "data.txt")
    (project / "helpers" / "also.txt").symlink_to("data.txt")
    # Two names of one file, both inside: nothing leaves the project.
    (project / "helpers" / "notes.txt").write_text("ours\n")
    os.link(project / "helpers" / "notes.txt", project / "helpers" / "notes_copy.txt")
    return project


def test_a_hard_link_to_a_file_outside_is_left_out_and_named(tmp_path: Path) -> None:
    project = project_linking_out(tmp_path)
    clean = tmp_path / "clean"
    left_out = copy_clean(project, clean)
    assert left_out == ("helpers/also.txt", "helpers/data.txt")
    assert not (clean / "helpers" / "data.txt").exists()
    assert not (clean / "helpers" / "also.txt").exists()
    assert (clean / "helpers" / "notes.txt").read_text() == "ours\n"
    assert (clean / "helpers" / "notes_copy.txt").read_text() == "ours\n"
    assert (clean / "helpers" / "core.py").is_file()


def test_synthesized_tasks_hold_no_hard_linked_host_file(tmp_path: Path) -> None:
    project = project_linking_out(tmp_path)
    out = tmp_path / "tasks"
    result = subprocess.run(
        [sys.executable, "-m", "flows.cli", "tasks", "synthesize", str(project), "--out", str(out),
         "--max", "1", "--max-mutants", "6", "--seed", "3", "--no-check"],
        cwd=REPO_ROOT, env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["tasks_kept"] == 1, report
    assert report["hardlinks_left_out"] == ["helpers/also.txt", "helpers/data.txt"], report
    assert "left out 2 hard-linked file(s)" in result.stderr, result.stderr
    written = [path for path in out.rglob("*") if path.is_file() and not path.is_symlink()]
    assert any(path.name == "core.py" for path in written)
    assert [path for path in written if SECRET.strip() in path.read_bytes()] == []
