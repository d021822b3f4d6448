"""SWE-bench rows with a local clone -> Harbor tasks: history sanitized, tests protected, per-row
errors that leave the other rows imported; with an engine, each instance built in its layered
environment image (reused by key) and admitted only when its gold patch checks out."""

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
TESTS = (
    "import iniconfig  # a dependency the environment must hold\n"
    "from geometry import area\n\n\ndef test_square():\n    assert area(2, 2) == 4\n"
)
NEW_TEST = "\n\ndef test_rectangle():\n    assert area(2, 5) == 10\n"
# Django's layout: tests/runtests.py puts tests/ on sys.path and runs unittest labels.
RUNTESTS = (
    "import sys, unittest\n"
    "if __name__ == '__main__':\n"
    "    labels = [a for a in sys.argv[1:] if not a.startswith('-')]\n"
    "    suite = unittest.defaultTestLoader.loadTestsFromNames(labels)\n"
    "    result = unittest.TextTestRunner(verbosity=2).run(suite)\n"
    "    sys.exit(bool(result.failures or result.errors))\n"
)
UNIT_TESTS = (
    "import unittest\nfrom geometry import area\n\n\nclass AreaTests(unittest.TestCase):\n"
    "    def test_square(self):\n        self.assertEqual(area(2, 2), 4)\n"
)
UNIT_NEW_TEST = "\n    def test_rectangle(self):\n        self.assertEqual(area(2, 5), 10)\n"
PYPROJECT = (
    '[build-system]\nrequires = ["setuptools>=61"]\nbuild-backend = "setuptools.build_meta"\n\n'
    '[project]\nname = "geometry"\nversion = "0.1"\n\n[tool.setuptools]\npy-modules = ["geometry"]\n'
)


def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "a", "GIT_AUTHOR_EMAIL": "a@example.org",
           "GIT_COMMITTER_NAME": "a", "GIT_COMMITTER_EMAIL": "a@example.org"}  # fmt: skip
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True,
                          env=env, check=True)  # fmt: skip
    return done.stdout.strip()


def _diff(repo: Path, changes: dict[str, str]) -> str:
    """A git diff of the files in `changes` changed to their new text (the tree is restored)."""
    old = {}
    for path, new_text in changes.items():
        target = repo / path
        old[path] = target.read_text() if target.exists() else None
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(new_text)
    _git(repo, "add", "-N", *changes)
    patch = _git(repo, "diff", "--", *changes) + "\n"
    for path, text in old.items():
        if text is None:
            _git(repo, "rm", "-q", "--cached", path)
            (repo / path).unlink()
        else:
            (repo / path).write_text(text)
    return patch


Clone = tuple[Path, str, dict[str, str]]


@pytest.fixture
def clone(tmp_path: Path) -> Clone:
    """A local mirror (`repos/acme__geometry`) of a small package with a PyPI dependency, and
    the patches of three instances: pytest ids, unittest (Django-style) ids, and one whose
    FAIL_TO_PASS test already passes at the base commit."""
    repo = tmp_path / "repos" / "acme__geometry"
    repo.mkdir(parents=True)
    _git(repo, "init", "-q", "-b", "main")
    (repo / "geometry.py").write_text(BUGGY)
    (repo / "pyproject.toml").write_text(PYPROJECT)
    (repo / "requirements.txt").write_text("iniconfig==2.0.0\n")
    (repo / "tests" / "geometry_tests").mkdir(parents=True)
    (repo / "tests" / "test_geometry.py").write_text(TESTS.replace("4", "4 or True"))
    (repo / "tests" / "runtests.py").write_text(RUNTESTS)
    (repo / "tests" / "geometry_tests" / "__init__.py").write_text("")
    (repo / "tests" / "geometry_tests" / "tests.py").write_text(UNIT_TESTS)
    _git(repo, "add", ".")
    _git(repo, "commit", "-qm", "base")
    base = _git(repo, "rev-parse", "HEAD")
    patches = {
        "patch": _diff(repo, {"geometry.py": FIXED}),
        "test_patch": _diff(repo, {"tests/test_geometry.py": TESTS + NEW_TEST}),
        "unit_test_patch": _diff(
            repo, {"tests/geometry_tests/tests.py": UNIT_TESTS + UNIT_NEW_TEST}
        ),
        "passing_test_patch": _diff(
            repo, {"tests/test_geometry.py": TESTS + NEW_TEST.replace("10", "7")}
        ),
    }
    # A later commit holds the fix: it must not reach the workspace through history.
    (repo / "geometry.py").write_text(FIXED)
    _git(repo, "commit", "-qam", "fix area")
    return tmp_path / "repos", base, patches


def _row(base: str, patches: dict[str, str], **changes: object) -> dict[str, object]:
    row: dict[str, object] = {
        "instance_id": "acme__geometry-1",
        "repo": "acme/geometry",
        "version": "0.1",
        "base_commit": base,
        "environment_setup_commit": base,
        "patch": patches["patch"],
        "test_patch": patches["test_patch"],
        "FAIL_TO_PASS": json.dumps(["tests/test_geometry.py::test_rectangle"]),
        "PASS_TO_PASS": json.dumps(["tests/test_geometry.py::test_square"]),
        "problem_statement": "area() returns the perimeter-ish sum instead of the area.",
    }
    row.update(changes)
    return row


def _unit_row(base: str, patches: dict[str, str]) -> dict[str, object]:
    return _row(
        base, patches, instance_id="acme__geometry-2", test_patch=patches["unit_test_patch"],
        FAIL_TO_PASS=["test_rectangle (geometry_tests.tests.AreaTests)"],
        PASS_TO_PASS=["test_square (geometry_tests.tests.AreaTests)"],
    )  # fmt: skip


SPECS = {
    "acme/geometry": {
        "0.1": {
            "python": "3.11",
            "packages": "requirements.txt",
            "install": "python -m pip install --no-cache-dir -e .",
            "test_cmd": "./tests/runtests.py --verbosity 2",
        }
    }
}


def test_rows_import_with_history_sanitized_and_bad_rows_reported(
    clone: Clone, tmp_path: Path
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
        json.dumps(
            _row(
                base,
                patches,
                instance_id="acme__geometry-7",
                FAIL_TO_PASS=["tests/test_geometry.py::test_nothing_such"],
            )
        ),
        json.dumps(_unit_row(base, patches)),
    ]
    instances = tmp_path / "instances.jsonl"
    instances.write_text("\n".join(lines) + "\n")
    report = import_swebench(instances, repos, tmp_path / "tasks", check=False)
    assert [row.ok for row in report.rows] == [True, *[False] * 7, True]
    errors = [row.error for row in report.rows if not row.ok]
    assert "line 2: not valid JSON" in errors[0]
    assert "base_commit 0000000000000000000000000000000000000000 is not in the clone" in errors[1]
    assert "test_patch does not apply" in errors[2]
    assert "missing field(s) repo, base_commit" in errors[3]
    assert "no local clone of acme/missing" in errors[4]
    assert "mix pytest node ids and 'test_name (module.Class)' ids" in errors[5]
    assert "neither pytest node ids of the tree" in errors[6]
    assert not list((tmp_path / "tasks").glob("*.partial"))
    assert sorted(p.name for p in (tmp_path / "tasks").iterdir()) == [
        "acme__geometry-1", "acme__geometry-2"
    ]  # fmt: skip

    task = load_task(report.rows[0].task_dir)
    workspace = task.snapshot_dir
    assert sorted(p.name for p in workspace.iterdir()) == [
        "geometry.py", "pyproject.toml", "requirements.txt", "tests"
    ]  # no .git  # fmt: skip
    assert (workspace / "geometry.py").read_text() == BUGGY  # the base tree, not the fix
    assert "test_rectangle" in (workspace / "tests" / "test_geometry.py").read_text()
    assert task.fail_to_pass == ("tests/test_geometry.py::test_rectangle",)
    assert task.protected == ("tests/test_geometry.py",)
    assert task.family == "swebench" and task.source == f"acme/geometry@{base}"
    assert "perimeter" in task.instruction
    # It runs in its repository's environment image, declared for rollyard and for Harbor.
    assert task.container is not None and task.container.repository is not None
    environment = task.container.repository
    assert (environment.repo, environment.base_commit) == ("acme/geometry", base)
    assert environment.install == "python -m pip install --no-cache-dir -e ."
    assert [p.split("==")[0] for p in environment.pip_packages] == ["pytest"]
    dockerfile = (task.path / "environment" / "Dockerfile").read_text()
    assert dockerfile.startswith("FROM python:3.11-slim\n")
    assert "COPY workspace/ /workspace/" in dockerfile and "pip install" in dockerfile

    unit = load_task(report.rows[-1].task_dir)
    assert unit.test_runner == "unittest" and unit.test_command == "python -m unittest"
    assert unit.fail_to_pass == ("test_rectangle (geometry_tests.tests.AreaTests)",)


def test_cli_import_exit_codes(clone: Clone, tmp_path: Path,
                               capsys: pytest.CaptureFixture[str]) -> None:  # fmt: skip
    from flows.cli import main

    repos, base, patches = clone
    instances = tmp_path / "i.jsonl"
    instances.write_text(json.dumps(_row(base, patches)) + "\n{}\n")
    code = main(["tasks", "import-swebench", str(instances), "--repos", str(repos),
                 "--out", str(tmp_path / "tasks"), "--no-check"])  # fmt: skip
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert code == 4 and [row["ok"] for row in rows] == [True, False]
    assert main(["tasks", "import-swebench", str(tmp_path / "none.jsonl"), "--repos",
                 str(repos), "--out", str(tmp_path / "t")]) == 1  # fmt: skip
    bad_specs = tmp_path / "specs.json"
    bad_specs.write_text('{"acme/geometry": ["3.11"]}')
    assert main(["tasks", "import-swebench", str(instances), "--repos", str(repos), "--out",
                 str(tmp_path / "t"), "--specs", str(bad_specs), "--no-check"]) == 1  # fmt: skip
    assert "acme/geometry must map versions to specs" in capsys.readouterr().err


def test_spec_problems_are_row_errors(clone: Clone, tmp_path: Path) -> None:
    """Each found before anything is built (no engine needed)."""
    repos, base, patches = clone
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps({"acme/geometry": {
        "0.1": {"packages": "environment.yml"}, "0.2": {"python": "3.9"},
    }}))  # fmt: skip
    instances = tmp_path / "i.jsonl"
    rows = (_row(base, patches), _row(base, patches, version="9"),
            _row(base, patches, version="0.2"))  # fmt: skip
    instances.write_text("".join(json.dumps(row) + "\n" for row in rows))
    report = import_swebench(instances, repos, tmp_path / "tasks", specs=specs)
    assert not any(row.ok for row in report.rows)
    assert "is a conda environment, which is not built here" in report.rows[0].error
    assert "no spec for acme/geometry version '9'" in report.rows[1].error
    assert "Python 3.9 is older than 3.11, which rollyard's verifier runs with" in (
        report.rows[2].error
    )
    assert not (tmp_path / "tasks" / "acme__geometry-1").exists()


@pytest.mark.docker
@pytest.mark.timeout(1500)  # three instance images, each pip-installing from PyPI
def test_instances_are_built_in_keyed_layers_and_admitted_by_their_gold_patch(
    engine: None, clone: Clone, tmp_path: Path
) -> None:
    from sandboxes.docker_images import KEY_LABEL, shared_client

    repos, base, patches = clone
    specs = tmp_path / "specs.json"
    specs.write_text(json.dumps(SPECS))
    instances = tmp_path / "instances.jsonl"
    instances.write_text("\n".join(json.dumps(row) for row in (
        _row(base, patches),
        _unit_row(base, patches),
        _row(base, patches, instance_id="acme__geometry-3",
             test_patch=patches["passing_test_patch"]),
    )) + "\n")  # fmt: skip
    report = import_swebench(instances, repos, tmp_path / "tasks", specs=specs)
    first, unit, refused = report.rows
    assert first.ok and unit.ok, (first.error, unit.error)
    assert not refused.ok and not (tmp_path / "tasks" / "acme__geometry-3").exists()
    # Its new test asserts what the bug computes: it passes at the base commit, fails when fixed.
    assert refused.error.endswith(
        "not admitted: FAIL_TO_PASS tests/test_geometry.py::test_rectangle passes before the "
        "gold patch; FAIL_TO_PASS tests/test_geometry.py::test_rectangle is failed after the "
        "gold patch"
    ), refused.error
    assert "instance" in first.built_layers and "instance" in unit.built_layers

    # Layers carry their key and what they were built for; the pytest and unittest instances
    # differ in their env (pytest is added for pytest ids) and share the base.
    client = shared_client()
    labels = client.images.get(first.image).labels
    assert labels[KEY_LABEL].startswith(first.image.split(":")[1])
    assert labels["rollyard.repo"] == "acme/geometry" and labels["rollyard.base_commit"] == base
    assert first.image != unit.image

    # The same rows again: every layer found by its key, nothing rebuilt.
    again = import_swebench(instances, repos, tmp_path / "again", specs=specs, limit=2)
    assert [(row.ok, row.image, row.built_layers) for row in again.rows] == [
        (True, first.image, ()), (True, unit.image, ())
    ]  # fmt: skip

    for row in (first, unit):
        task = load_task(row.task_dir)
        result = check_task(task)
        assert result.ok, result.problems
        with_deps = subprocess.run(
            ["docker", "run", "--rm", "--network", "none", "-w", "/", row.image, "python", "-c",
             "import iniconfig, geometry; print(geometry.__file__)"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert with_deps.stdout.strip() == "/workspace/geometry.py"
