"""Tasks rollyard writes are valid Harbor tasks: Harbor's own task model (the `harbor` package,
Python >= 3.12, in a virtualenv this test creates and caches) loads every kind, and `harbor lint`
with its default rules finds nothing."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tasks_lib import generate_demo_tasks, load_task
from tasks_lib.format.repository import RepositoryEnvironment, harbor_dockerfile
from tasks_lib.sources.authoring import TaskFiles, write_task
from tasks_lib.sources.authoring.writer import pinned
from tasks_lib.sources.families.data_analysis import generate_data_analysis_tasks
from tasks_lib.sources.families.ops import generate_ops_tasks

HARBOR_REQUIREMENT = "harbor==0.26.0"
LOAD_WITH_HARBOR = """
import json, sys
from pathlib import Path
from harbor.models.task.config import TaskConfig
from harbor.models.task.verifier_mode import resolve_task_verifier_mode
out = {}
for task_dir in sys.argv[1:]:
    config = TaskConfig.model_validate_toml(Path(task_dir, "task.toml").read_text())
    out[Path(task_dir).name] = {
        "schema_version": config.schema_version,
        "name": config.task.name if config.task else None,
        "network_mode": config.environment.network_mode.value,
        "verifier_mode": resolve_task_verifier_mode(config).value,
        "rollyard_id": config.metadata.get("rollyard", {}).get("id"),
    }
print(json.dumps(out))
"""


def _python_312() -> str | None:
    """A Python >= 3.12 that runs (pyenv's when none is on PATH; a pyenv shim without that
    version selected does not run)."""
    pyenv = os.path.expanduser("~/.pyenv/versions")
    candidates = sorted(glob.glob(f"{pyenv}/3.1[2-9]*/bin/python"))
    candidates += [found for name in ("python3.12", "python3.13") if (found := shutil.which(name))]
    for candidate in candidates:
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.fixture(scope="module")
def harbor_venv(pytestconfig: pytest.Config) -> Path:
    venv = pytestconfig.cache.mkdir("harbor-0.26-venv")
    installed_marker = venv / "rollyard-installed"
    if installed_marker.is_file():
        return venv
    python = _python_312()
    if python is None:
        pytest.skip("no Python >= 3.12 here to install harbor into")
    subprocess.run([python, "-m", "venv", "--clear", str(venv)], check=True)
    installed = subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", HARBOR_REQUIREMENT],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    if installed.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        pytest.skip(f"cannot install {HARBOR_REQUIREMENT}: {installed.stderr.strip()[-300:]}")
    installed_marker.write_text(HARBOR_REQUIREMENT)
    return venv


@pytest.fixture(scope="module")
def written_tasks(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """One task of every kind rollyard writes."""
    out = tmp_path_factory.mktemp("written")
    tasks = [
        generate_demo_tasks(out / "demo", 1, seed=3)[0],
        generate_data_analysis_tasks(out / "data", 1, seed=3)[0],
        generate_ops_tasks(out / "ops", 1, seed=3)[0],
    ]
    # The SWE-bench importer's and synthesis's environment: the project installed in the image.
    project = out / "project"
    (project / "tests").mkdir(parents=True)
    (project / "calc.py").write_text("def double(x):\n    return x + x\n")
    (project / "tests" / "test_calc.py").write_text(
        "from calc import double\n\n\ndef test_double():\n    assert double(2) == 4\n"
    )
    environment = RepositoryEnvironment(
        repo="acme/calc", base_commit="0" * 40, python="3.11", requirements="iniconfig==2.0.0\n",
        pip_packages=(pinned("pytest"),),
    )  # fmt: skip
    files = TaskFiles(
        task_id="imported-0",
        instruction="Keep `double` right.\n",
        workspace={},
        workspace_base=project,
        rollyard={
            "pass_to_pass": ["tests/test_calc.py::test_double"],
            "family": "swebench",
            "environment": environment.to_table(),
        },
        solve_sh="#!/bin/bash\ntrue\n",
        dockerfile=harbor_dockerfile(environment),
        environment_files={"requirements.txt": environment.requirements},
    )
    tasks.append(write_task(files, out / "imported" / "imported-0"))
    for task_dir in tasks:
        load_task(task_dir)  # rollyard reads what it wrote, from [metadata.rollyard]
    return tasks


@pytest.mark.slow
@pytest.mark.timeout(1800)  # the first run installs Harbor and its dependencies (minutes)
def test_harbor_task_model_loads_every_kind_rollyard_writes(
    harbor_venv: Path, written_tasks: list[Path]
) -> None:
    loaded = subprocess.run(
        [str(harbor_venv / "bin" / "python"), "-W", "error::DeprecationWarning", "-c",
         LOAD_WITH_HARBOR, *map(str, written_tasks)],
        capture_output=True, text=True, check=True, timeout=300,
    )  # fmt: skip
    configs = json.loads(loaded.stdout)
    assert len(configs) == len(written_tasks)
    for name, config in configs.items():
        assert config["schema_version"] == "1.4", (name, config)
        assert config["name"] == f"rollyard/{config['rollyard_id']}"
        assert config["network_mode"] == "no-network"
        assert config["verifier_mode"] == "separate"


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_harbor_lint_finds_nothing_with_its_default_rules(
    harbor_venv: Path, written_tasks: list[Path]
) -> None:
    linted = subprocess.run(
        [str(harbor_venv / "bin" / "harbor"), "lint", "--json", *map(str, written_tasks)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    findings = json.loads(linted.stdout or "[]")
    assert findings == [] and linted.returncode == 0, findings or linted.stderr[-2000:]
