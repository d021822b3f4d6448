"""Import SWE-bench instances (JSONL rows with local clones of their repositories) as Harbor tasks.

Each workspace is the base commit's tree only (`git archive`: no history that could hold the fix)
with the instance's test_patch applied; the files test_patch touches are protected, so the tests
the verifier runs are the instance's own. The gold `patch` becomes the reference solution. A bad
row gets one clear error naming the row and the field, and the rows after it still import.
"""

from __future__ import annotations

import dataclasses
import io
import json
import re
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tasks_lib.errors import RowError, TaskError
from tasks_lib.format.loader import ID_PATTERN
from tasks_lib.format.model import DEFAULT_WORKSPACE_DIR
from tasks_lib.format.node_ids import checkable_test_ids
from tasks_lib.sources.authoring.writer import (
    FIX_PATCH,
    REWARD_FROM_EXIT,
    TaskFiles,
    dockerfile,
    harbor_test_sh,
    patch_solve_sh,
    write_task,
)

FAMILY = "swebench"
REQUIRED_FIELDS = (
    "instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
    "problem_statement",
)  # fmt: skip
_COMMIT = re.compile(r"^[0-9a-fA-F]{7,64}$")
_REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
_DIFF_PATH = re.compile(r"^(?:\+\+\+|---) (?:[ab]/)?(?P<path>\S+)", re.MULTILINE)


@dataclasses.dataclass(frozen=True, slots=True)
class ImportedRow:
    line: int
    instance_id: str
    ok: bool
    task_dir: str = ""
    error: str = ""
    dropped_pass_to_pass: int = 0
    """PASS_TO_PASS ids the task loader cannot check against the test files (left out)."""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True, slots=True)
class ImportReport:
    rows: tuple[ImportedRow, ...]

    @property
    def imported(self) -> int:
        return sum(row.ok for row in self.rows)

    @property
    def failed(self) -> int:
        return len(self.rows) - self.imported

    def to_json(self) -> dict[str, Any]:
        return {
            "imported": self.imported,
            "failed": self.failed,
            "rows": [row.to_json() for row in self.rows],
        }


def _git(clone: Path, *args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        ["git", "-C", str(clone), *args], input=stdin, capture_output=True, check=False,
        env={"PATH": "/usr/bin:/bin", "GIT_CONFIG_NOSYSTEM": "1", "HOME": "/nonexistent"},
    )  # fmt: skip


def _rows(path: Path) -> Iterator[tuple[int, Any]]:
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                yield number, json.loads(line)
            except json.JSONDecodeError as error:
                yield number, RowError(f"line {number}: not valid JSON ({error.msg}); fix the row")


def _test_ids(row: dict[str, Any], field: str) -> list[str]:
    value = row[field]
    if isinstance(value, str):  # the published dataset stores these lists as JSON text
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            raise RowError(f"{field} is a string but not a JSON list of test ids") from None
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise RowError(f"{field} must be a list of pytest node ids")
    return list(dict.fromkeys(value))


def _clone_for(repos_dir: Path, repo: str) -> Path:
    owner, name = repo.split("/")
    for candidate in (repos_dir / owner / name, repos_dir / f"{owner}__{name}", repos_dir / name):
        if (candidate / ".git").exists() or (candidate / "HEAD").is_file():
            return candidate
    raise RowError(
        f"no local clone of {repo} under {repos_dir} (looked for {owner}/{name}, "
        f"{owner}__{name} and {name}); clone it there"
    )


def _patch_paths(patch: str) -> list[str]:
    return sorted({m.group("path") for m in _DIFF_PATH.finditer(patch)} - {"/dev/null", "dev/null"})


def _task_id(instance_id: str) -> str:
    task_id = re.sub(r"[^A-Za-z0-9._-]+", "-", instance_id).strip("-")[:128]
    if not ID_PATTERN.match(task_id):
        raise RowError(f"instance_id {instance_id!r} gives no valid task id")
    return task_id


_DOCKERFILE = dockerfile('"pytest>=7"', after=("RUN pip install --no-cache-dir -e . || true",))

_TEST_SH = harbor_test_sh(
    "restores the instance's test files, runs them, writes the reward.",
    "cp -r /tests/protected/. /workspace/\n"
    "cd /workspace\n"
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 python -m pytest -p no:cacheprovider "
    "\\\n    -q -rA {test_ids}\n" + REWARD_FROM_EXIT,
)

_SOLVE_SH = patch_solve_sh("the instance's gold patch.")


def import_row(row: Any, repos_dir: Path, out_dir: Path) -> tuple[Path, int]:
    """Write one instance as a task directory; raises `RowError` naming what is wrong."""
    if not isinstance(row, dict):
        raise RowError("the row is not a JSON object")
    missing = [field for field in REQUIRED_FIELDS if field not in row]
    if missing:
        raise RowError(f"missing field(s) {', '.join(missing)}; every row needs {REQUIRED_FIELDS}")
    for field in ("instance_id", "repo", "base_commit", "patch", "test_patch"):
        if not isinstance(row[field], str) or not row[field].strip():
            raise RowError(f"{field} must be a non-empty string")
    if not isinstance(row["problem_statement"], str):
        raise RowError("problem_statement must be a string")
    instance_id, repo, commit = row["instance_id"], row["repo"], row["base_commit"]
    task_id = _task_id(instance_id)
    if not _REPO.match(repo):
        raise RowError(f"repo {repo!r} is not 'owner/name'")
    if not _COMMIT.match(commit):
        raise RowError(f"base_commit {commit!r} is not a commit hash")
    fail_to_pass = _test_ids(row, "FAIL_TO_PASS")
    pass_to_pass = _test_ids(row, "PASS_TO_PASS")
    if not fail_to_pass:
        raise RowError("FAIL_TO_PASS is empty: the task would have nothing to fix")
    clone = _clone_for(repos_dir, repo)
    if _git(clone, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise RowError(f"base_commit {commit} is not in the clone {clone}; fetch it there")

    # The tree is prepared and checked in a staging directory; the writer copies it in place.
    with tempfile.TemporaryDirectory(prefix=f".{task_id}-", dir=out_dir) as staging_dir:
        staging = Path(staging_dir)
        workspace = staging / "workspace"
        workspace.mkdir()
        # Only the base commit's tree: no .git, no history, nothing committed after it.
        archive = _git(clone, "archive", "--format=tar", commit)
        if archive.returncode != 0:
            raise RowError(f"git archive {commit} failed: {archive.stderr.decode()[:200]}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(workspace, filter="data")
        applied = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", "-p1", "-"], cwd=workspace,
            input=row["test_patch"].encode(), capture_output=True, check=False,
        )  # fmt: skip
        if applied.returncode != 0:
            raise RowError(
                f"test_patch does not apply to {commit[:12]}: {applied.stderr.decode()[:200]}"
            )
        gold = subprocess.run(
            ["git", "apply", "--check", "-p1", "-"], cwd=workspace,
            input=row["patch"].encode(), capture_output=True, check=False,
        )  # fmt: skip
        if gold.returncode != 0:
            raise RowError(f"patch does not apply after test_patch: {gold.stderr.decode()[:200]}")
        checkable = set(checkable_test_ids(workspace, (*fail_to_pass, *pass_to_pass)))
        unknown = [t for t in fail_to_pass if t not in checkable]
        if unknown:
            raise RowError(
                f"FAIL_TO_PASS holds {len(unknown)} id(s) that are not pytest node ids of the "
                f"tree, e.g. {unknown[0]!r} (only pytest-run repositories are supported)"
            )
        kept_p2p = [t for t in pass_to_pass if t in checkable]
        test_patch_paths = _patch_paths(row["test_patch"])
        protected = staging / "protected"
        protected.mkdir()
        for path in test_patch_paths:
            source = workspace / path
            if source.is_file():
                (protected / path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(source, protected / path)
        test_files = sorted({t.split("::", 1)[0] for t in (*fail_to_pass, *kept_p2p)})
        statement = row["problem_statement"].strip() or f"Resolve {instance_id}."
        metadata = {
            "author_name": "SWE-bench import",
            "category": "issue-resolution",
            "tags": ["python", "swe-bench"],
            "instance_id": instance_id,
            "repo": repo,
            "base_commit": commit,
        }
        for extra in ("version", "created_at", "environment_setup_commit"):
            if isinstance(row.get(extra), str):
                metadata[extra] = row[extra]
        files = TaskFiles(
            task_id=task_id,
            instruction=(
                f"# {instance_id}\n\n{statement}\n\nThe repository is in the workspace. "
                "Change its source so the issue is resolved; tests are restored before grading.\n"
            ),
            workspace={},
            workspace_base=workspace,
            rollyard={
                "id": task_id,
                "version": "1",
                "family": FAMILY,
                "source": f"{repo}@{commit}",
                "difficulty": "hard",
                "workspace_dir": DEFAULT_WORKSPACE_DIR,
                "test_command": "python -m pytest " + " ".join(test_files),
                "fail_to_pass": fail_to_pass,
                "pass_to_pass": kept_p2p,
                "protected": test_patch_paths,
                "limits": {
                    "wall_time_s": 900.0,
                    "memory_mb": 4096,
                    "disk_mb": 4096,
                    "cpu_time_s": 1800.0,
                    "verify_timeout_s": 900.0,
                },
            },
            solve_sh=_SOLVE_SH,
            tests={"protected": protected},
            solution={FIX_PATCH: row["patch"]},
            test_sh=_TEST_SH.format(
                test_ids=" ".join(f"'{t}'" for t in (*fail_to_pass, *kept_p2p))
            ),
            metadata=metadata,
            dockerfile=_DOCKERFILE,
            verifier_timeout_s=900.0,
            agent_timeout_s=3600.0,
            environment={
                "build_timeout_sec": 1800.0,
                "cpus": 1,
                "memory_mb": 4096,
                "storage_mb": 4096,
            },
        )
        task_dir = write_task(files, out_dir / task_id)
    return task_dir, len(pass_to_pass) - len(kept_p2p)


def import_swebench(
    instances: str | Path,
    repos_dir: str | Path,
    out_dir: str | Path,
    *,
    limit: int | None = None,
    progress: Callable[[ImportedRow], None] | None = None,
) -> ImportReport:
    """Import every row of the JSONL file `instances`; errors are per row, never fatal."""
    source = Path(instances)
    if not source.is_file():
        raise TaskError(f"{source} is not a file; pass a SWE-bench instances .jsonl file")
    repos = Path(repos_dir)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results: list[ImportedRow] = []
    for number, row in _rows(source):
        if limit is not None and len(results) >= limit:
            break
        instance_id = row.get("instance_id", "") if isinstance(row, dict) else ""
        instance_id = instance_id if isinstance(instance_id, str) else ""
        try:
            if isinstance(row, RowError):
                raise row
            path, dropped = import_row(row, repos, out)
            result = ImportedRow(number, instance_id, True, str(path), "", dropped)
        except (RowError, OSError, UnicodeError, tarfile.TarError) as error:
            message = str(error)
            if not message.startswith("line "):
                message = f"line {number} ({instance_id or 'no instance_id'}): {message}"
            result = ImportedRow(number, instance_id, False, "", message)
        results.append(result)
        if progress is not None:
            progress(result)
    return ImportReport(tuple(results))
