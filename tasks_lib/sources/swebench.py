"""Import SWE-bench instances (JSONL rows with local clones of their repositories) as Harbor tasks
that run in the repository's own environment image.

Each workspace is the base commit's tree only (`git archive`: no history that could hold the fix)
with the instance's test_patch applied; the files test_patch touches are protected, so the tests
the verifier runs are the instance's own. The gold `patch` becomes the reference solution. The
task declares its environment (`[metadata.rollyard.environment]`, from the instance's install
spec), built like the SWE-bench harness in layers keyed by content (base -> env -> instance,
`tasks_lib.format.repository`). An instance is admitted only when, in that image, its
FAIL_TO_PASS tests fail before the gold patch and pass after it and its PASS_TO_PASS tests pass
both times; otherwise it is refused with the reason. A bad row gets one clear error naming the
row and the field, and the rows after it still import.
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

from sandboxes import SandboxError
from tasks_lib.errors import RowError, TaskError
from tasks_lib.format.loader import ID_PATTERN, load_task
from tasks_lib.format.model import DEFAULT_WORKSPACE_DIR, Task
from tasks_lib.format.node_ids import UNITTEST_ID_PATTERN, checkable_test_ids
from tasks_lib.format.repository import (
    REQUIREMENTS_FILE,
    LayeredImage,
    RepositoryEnvironment,
    harbor_dockerfile,
    repository_image,
)
from tasks_lib.format.runnable import LOCAL_PYTHON
from tasks_lib.sources.authoring.writer import (
    FIX_PATCH,
    REWARD_FROM_EXIT,
    TaskFiles,
    harbor_test_sh,
    patch_solve_sh,
    pinned,
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
    image: str = ""
    """The instance image the check ran in (empty with `check=False` or before the build)."""
    built_layers: tuple[str, ...] = ()
    """The layers (`base`, `env`, `instance`) this row built; the others were reused by key."""

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
        raise RowError(f"{field} must be a list of test ids")
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


@dataclasses.dataclass(frozen=True, slots=True)
class InstallSpec:
    """How an instance's environment is built: SWE-bench's per repo-and-version spec (the keys
    of its `MAP_REPO_VERSION_TO_SPECS` that shape the image and the test run)."""

    python: str = LOCAL_PYTHON
    packages: str = ""
    """`requirements.txt` (or another `.txt` path of the repository, read at the instance's
    environment_setup_commit), or pip requirements separated by spaces; empty: none."""
    pip_packages: tuple[str, ...] = ()
    pre_install: tuple[str, ...] = ()
    install: str = ""
    """Empty: `pip install -e .` when the tree is a package (setup.py, pyproject.toml), else
    nothing."""
    test_cmd: str = ""
    """The runner of unittest-style (Django) test ids, e.g. `./tests/runtests.py --verbosity 2
    --settings=test_sqlite --parallel 1`; default `python -m unittest`. Pytest ids always run
    under rollyard's hardened pytest."""


MIN_VERIFIER_PYTHON = (3, 11)
"""rollyard's verifier runs the suite with `python -P` (3.11+)."""
SPEC_KEYS = ("python", "packages", "pip_packages", "pre_install", "install", "test_cmd")


def _spec(value: Any, where: str) -> InstallSpec:
    if not isinstance(value, dict):
        raise TaskError(f"{where} must be an object with {', '.join(SPEC_KEYS)}")

    def commands(key: str) -> tuple[str, ...]:
        found = value.get(key, [])
        if isinstance(found, str):
            found = [found]
        if not isinstance(found, list) or not all(isinstance(item, str) for item in found):
            raise TaskError(f"{where}.{key} must be a list of strings")
        return tuple(found)

    texts = {}
    for key in ("python", "packages", "install", "test_cmd"):
        found = value.get(key, "")
        if isinstance(found, list) and all(isinstance(item, str) for item in found):
            found = " && ".join(found)  # SWE-bench writes some commands as lists
        if not isinstance(found, str):
            raise TaskError(f"{where}.{key} must be a string")
        texts[key] = found
    if texts["python"] and not re.match(r"^3\.\d{1,2}$", texts["python"]):
        raise TaskError(f"{where}.python must be a version like '3.11', not {texts['python']!r}")
    return InstallSpec(
        python=texts["python"] or LOCAL_PYTHON, packages=texts["packages"],
        pip_packages=commands("pip_packages"), pre_install=commands("pre_install"),
        install=texts["install"], test_cmd=texts["test_cmd"],
    )  # fmt: skip


def load_specs(path: str | Path) -> dict[str, dict[str, InstallSpec]]:
    """Install specs from a JSON file shaped like SWE-bench's `MAP_REPO_VERSION_TO_SPECS`:
    `{"owner/name": {"<version>": {"python": "3.11", "install": "...", ...}}}`; a version `"*"`
    stands for every version the repository has no entry for."""
    source = Path(path)
    try:
        document = json.loads(source.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise TaskError(
            f"cannot read the specs file {source} ({error}); pass a JSON file"
        ) from None
    if not isinstance(document, dict):
        raise TaskError(f"{source} must hold an object: repo -> version -> spec")
    specs: dict[str, dict[str, InstallSpec]] = {}
    for repo, versions in document.items():
        if not isinstance(versions, dict):
            raise TaskError(f"{source}: {repo} must map versions to specs")
        specs[repo] = {
            str(v): _spec(spec, f"{source}: {repo}[{v}]") for v, spec in versions.items()
        }
    return specs


def _spec_for(row: dict[str, Any], specs: dict[str, dict[str, InstallSpec]] | None) -> InstallSpec:
    if specs is None:
        return InstallSpec()
    versions = specs.get(row["repo"], {})
    version = row.get("version")
    found = versions.get(str(version)) if version is not None else None
    found = found or versions.get("*")
    if found is None:
        raise RowError(
            f"the specs file has no spec for {row['repo']} version {version!r}; add one (or a "
            '"*" entry for the repository)'
        )
    return found


def _requirements(clone: Path, commit: str, packages: str) -> str:
    """The env layer's pip requirements for the spec's `packages`."""
    if not packages.strip():
        return ""
    if packages.endswith((".yml", ".yaml")):
        raise RowError(
            f"packages {packages!r} is a conda environment, which is not built here; give the "
            "dependencies as pip requirements (a requirements .txt of the repository or a list)"
        )
    if packages.endswith(".txt"):
        shown = _git(clone, "show", f"{commit}:{packages}")
        if shown.returncode != 0:
            raise RowError(f"packages {packages!r} is not a file of {commit[:12]} in {clone}")
        return shown.stdout.decode("utf-8", "replace")
    return "\n".join(packages.split()) + "\n"


def _environment(
    row: dict[str, Any], spec: InstallSpec, clone: Path, workspace: Path, unittest_ids: bool
) -> RepositoryEnvironment:
    setup_commit = row.get("environment_setup_commit") or row["base_commit"]
    if not isinstance(setup_commit, str) or not _COMMIT.match(setup_commit):
        raise RowError(f"environment_setup_commit {setup_commit!r} is not a commit hash")
    install = spec.install
    if not install:
        is_package = any((workspace / name).is_file() for name in ("setup.py", "pyproject.toml"))
        install = "python -m pip install --no-cache-dir -e ." if is_package else "true"
    pip_packages = spec.pip_packages
    if not unittest_ids and not any(p.lower().startswith("pytest") for p in pip_packages):
        pip_packages = (*pip_packages, pinned("pytest"))  # rollyard's verifier runs pytest
    return RepositoryEnvironment(
        repo=row["repo"], base_commit=row["base_commit"], python=spec.python,
        requirements=_requirements(clone, setup_commit, spec.packages),
        pip_packages=pip_packages, pre_install=spec.pre_install, install=install,
    )  # fmt: skip


_TEST_SH = harbor_test_sh(
    "restores the instance's test files, runs them, writes the reward.",
    "cp -r /tests/protected/. /workspace/\ncd /workspace\n{run_tests}\n" + REWARD_FROM_EXIT,
)
_PYTEST_RUN = (
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 python -m pytest -p no:cacheprovider "
    "\\\n    -q -rA {test_ids}"
)

_SOLVE_SH = patch_solve_sh("the instance's gold patch.")


def _test_style(fail_to_pass: list[str], pass_to_pass: list[str]) -> bool:
    """True for unittest-style ids (`test_name (module.Class)`, Django's), False for pytest's;
    one instance uses one style."""
    unittest_style = {bool(UNITTEST_ID_PATTERN.match(t)) for t in (*fail_to_pass, *pass_to_pass)}
    if len(unittest_style) > 1:
        raise RowError(
            "FAIL_TO_PASS and PASS_TO_PASS mix pytest node ids and 'test_name (module.Class)' "
            "ids; one instance runs one test runner"
        )
    return unittest_style.pop()


def import_row(
    row: Any,
    repos_dir: Path,
    out_dir: Path,
    *,
    specs: dict[str, dict[str, InstallSpec]] | None = None,
    check: bool = True,
) -> tuple[Path, int, LayeredImage | None]:
    """Write one instance as a task directory, checked in its environment image unless `check`
    is False; raises `RowError` naming what is wrong, or why the instance is not admitted."""
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
    unittest_ids = _test_style(fail_to_pass, pass_to_pass)
    spec = _spec_for(row, specs)
    if check and tuple(map(int, spec.python.split(".")[:2])) < MIN_VERIFIER_PYTHON:
        raise RowError(
            f"the environment's Python {spec.python} is older than "
            f"{'.'.join(map(str, MIN_VERIFIER_PYTHON))}, which rollyard's verifier runs with "
            "(python -P); pass --no-check to write the task for Harbor alone"
        )
    clone = _clone_for(repos_dir, repo)
    if _git(clone, "cat-file", "-e", f"{commit}^{{commit}}").returncode != 0:
        raise RowError(f"base_commit {commit} is not in the clone {clone}; fetch it there")

    # The tree is prepared and checked in a staging directory; the task is written there too
    # and moved into place only once admitted.
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
        environment = _environment(row, spec, clone, workspace, unittest_ids)
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
                f"FAIL_TO_PASS holds {len(unknown)} id(s) that are neither pytest node ids of the "
                f"tree nor 'test_name (module.Class)' ids, e.g. {unknown[0]!r}"
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
        if unittest_ids:
            test_command = spec.test_cmd or "python -m unittest"
            runner_labels = " ".join(
                f"'{owner}.{name}'"
                for name, _, owner in (t[:-1].partition(" (") for t in (*fail_to_pass, *kept_p2p))
            )
            run_tests = f"PYTHONDONTWRITEBYTECODE=1 {test_command} {runner_labels}"
        else:
            test_files = sorted({t.split("::", 1)[0] for t in (*fail_to_pass, *kept_p2p)})
            test_command = "python -m pytest " + " ".join(test_files)
            run_tests = _PYTEST_RUN.format(
                test_ids=" ".join(f"'{t}'" for t in (*fail_to_pass, *kept_p2p))
            )
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
        rollyard: dict[str, Any] = {
            "id": task_id,
            "version": "1",
            "family": FAMILY,
            "source": f"{repo}@{commit}",
            "difficulty": "hard",
            "workspace_dir": DEFAULT_WORKSPACE_DIR,
            "test_command": test_command,
            "test_runner": "unittest" if unittest_ids else "pytest",
            "fail_to_pass": fail_to_pass,
            "pass_to_pass": kept_p2p,
            "protected": test_patch_paths,
            "environment": environment.to_table(),
            "limits": {
                "wall_time_s": 900.0,
                "memory_mb": 4096,
                "disk_mb": 4096,
                "cpu_time_s": 1800.0,
                "verify_timeout_s": 900.0,
            },
        }
        files = TaskFiles(
            task_id=task_id,
            instruction=(
                f"# {instance_id}\n\n{statement}\n\nThe repository is in the workspace. "
                "Change its source so the issue is resolved; tests are restored before grading.\n"
            ),
            workspace={},
            workspace_base=workspace,
            rollyard=rollyard,
            solve_sh=_SOLVE_SH,
            tests={"protected": protected},
            solution={FIX_PATCH: row["patch"]},
            test_sh=_TEST_SH.format(run_tests=run_tests),
            metadata=metadata,
            dockerfile=harbor_dockerfile(environment),
            environment_files=(
                {REQUIREMENTS_FILE: environment.requirements} if environment.requirements else {}
            ),
            verifier_timeout_s=900.0,
            agent_timeout_s=3600.0,
            environment={
                "build_timeout_sec": 1800.0,
                "cpus": 1,
                "memory_mb": 4096,
                "storage_mb": 4096,
            },
        )
        staged = write_task(files, staging / task_id)
        task = load_task(staged)  # what was written reads back, checked or not
        layers = None
        if check:
            layers = repository_image(environment, task.snapshot_dir)
            problems = admission_problems(task)
            if problems:
                raise RowError(f"not admitted: {'; '.join(problems)}")
        target = out_dir / task_id
        if target.exists():
            shutil.rmtree(target)
        staged.rename(target)
    return target, len(pass_to_pass) - len(kept_p2p), layers


def admission_problems(task: Task) -> list[str]:
    """Why an imported instance is not admitted (empty: it is): in its environment image, every
    FAIL_TO_PASS test must fail before the gold patch and pass after it, every PASS_TO_PASS test
    pass both times."""
    from tasks_lib.verify import solution_changes, verify

    before = verify(task, None, backend="docker")
    after = verify(task, solution_changes(task, backend="docker"), backend="docker")
    problems = []
    for when, result in (("before", before), ("after", after)):
        if result.status != "ok":
            problems.append(f"the run {when} the gold patch is {result.status}: {result.detail}")
    if problems:
        return problems
    for test_id in task.fail_to_pass:
        if before.tests.get(test_id) == "passed":
            problems.append(f"FAIL_TO_PASS {test_id} passes before the gold patch")
        if after.tests.get(test_id) != "passed":
            problems.append(f"FAIL_TO_PASS {test_id} is {after.tests.get(test_id, 'missing')} "
                            "after the gold patch")  # fmt: skip
    for test_id in task.pass_to_pass:
        for when, result in (("before", before), ("after", after)):
            if result.tests.get(test_id) != "passed":
                problems.append(f"PASS_TO_PASS {test_id} is "
                                f"{result.tests.get(test_id, 'missing')} {when} the gold patch")  # fmt: skip
    return problems


def import_swebench(
    instances: str | Path,
    repos_dir: str | Path,
    out_dir: str | Path,
    *,
    limit: int | None = None,
    specs: str | Path | None = None,
    check: bool = True,
    progress: Callable[[ImportedRow], None] | None = None,
) -> ImportReport:
    """Import every row of the JSONL file `instances` from the clones under `repos_dir`, with the
    install specs of the JSON file `specs` (SWE-bench's shape; default: the local Python, `pip
    install -e .`). Each instance is checked in its environment image (the docker backend)
    unless `check` is False. Errors are per row, never fatal."""
    source = Path(instances)
    if not source.is_file():
        raise TaskError(f"{source} is not a file; pass a SWE-bench instances .jsonl file")
    loaded_specs = load_specs(specs) if specs is not None else None
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
            path, dropped, layers = import_row(row, repos, out, specs=loaded_specs, check=check)
            result = ImportedRow(
                number, instance_id, True, str(path), "", dropped,
                image=layers.instance if layers else "", built_layers=layers.built if layers else (),
            )  # fmt: skip
        except (
            RowError,
            TaskError,
            SandboxError,
            OSError,
            UnicodeError,
            tarfile.TarError,
        ) as error:
            message = str(error)
            if isinstance(error, SandboxError):
                message = f"cannot check the instance in its image: {message} (or pass --no-check)"
            if not message.startswith("line "):
                message = f"line {number} ({instance_id or 'no instance_id'}): {message}"
            result = ImportedRow(number, instance_id, False, "", message)
        results.append(result)
        if progress is not None:
            progress(result)
    return ImportReport(tuple(results))
