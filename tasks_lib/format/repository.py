"""A repository task's environment (SWE-bench style): what `[metadata.rollyard.environment]`
installs, and the image built from it in three layers keyed by content, as the SWE-bench harness
does — base (the Python image and venv tooling) -> env (repo + Python + dependencies) -> instance
(the repository at its base commit, installed)."""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from packaging.requirements import InvalidRequirement, Requirement

from rollyard.settings import settings

ENVIRONMENT_TABLE = "environment"
"""The key of the table under `[metadata.rollyard]`."""
VENV = "/opt/testbed"
"""Where the env layer's virtualenv lives; its bin/ leads PATH in the instance image."""
DEFAULT_INSTALL = "python -m pip install --no-cache-dir -e ."
PYTHON_VERSION = re.compile(r"^3\.\d{1,2}$")
REPO = re.compile(r"^[A-Za-z0-9_.-]+/[A-Za-z0-9_.-]+$")
COMMIT = re.compile(r"^[0-9a-fA-F]{7,64}$")

# The base layer: a venv-capable Python and `patch` (solve.sh applies the gold patch with it).
# Debian's python3 lacks ensurepip (python3-venv has it); an official python:X image has it but
# no `patch`: apt runs only for what is missing.
_BASE_TOOLS = (
    "RUN (python3 -c 'import ensurepip' 2>/dev/null && command -v patch >/dev/null) || "
    "(apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "
    "--no-install-recommends python3-venv patch && rm -rf /var/lib/apt/lists/*)"
)
PIP_INDEX_VARIABLES = ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST")
"""pip's own variables the base layer takes from the environment rollyard builds in: the
package index (a mirror) every layer's pip installs from."""
PIP_CA_IN_IMAGE = "/etc/rollyard/pip-ca.pem"


def base_dockerfile(context: Path) -> str:
    """The base layer, with the builder's package index: `PIP_INDEX_URL` and friends, and the
    CA bundle `PIP_CERT` names (a mirror's, or a TLS-inspecting proxy's) copied into `context`.
    They are part of the layer's content, so another index builds another base."""
    # pip's own settings, not rollyard's: read from the environment like pip itself does.
    lines = ["FROM parent", "USER root"]
    settings_env = {name: os.environ[name] for name in PIP_INDEX_VARIABLES if os.environ.get(name)}
    ca_bundle = os.environ.get("PIP_CERT", "")
    if ca_bundle and Path(ca_bundle).is_file():
        shutil.copyfile(ca_bundle, context / "pip-ca.pem")
        lines.append(f"COPY pip-ca.pem {PIP_CA_IN_IMAGE}")
        settings_env["PIP_CERT"] = PIP_CA_IN_IMAGE
    if settings_env:
        lines.append("ENV " + " ".join(f"{k}={shlex.quote(v)}" for k, v in settings_env.items()))
    lines.append(_BASE_TOOLS)
    return "\n".join(lines) + "\n"


@dataclasses.dataclass(frozen=True, slots=True)
class RepositoryEnvironment:
    """What a repository task's image holds, in the order it is built."""

    repo: str
    """`owner/name`: names the env and instance layers (with the Python version)."""
    base_commit: str
    """The commit the workspace is the tree of (labels the instance layer)."""
    python: str
    """`3.11`: the base layer's Python (the base image's, else `ROLLYARD_DOCKER_PYTHON_IMAGE`)."""
    requirements: str = ""
    """pip requirements text installed into the env layer's venv (a repository's
    requirements file at its environment commit)."""
    pip_packages: tuple[str, ...] = ()
    """More requirements for the env layer (the test runner, pins the repository needs)."""
    pre_install: tuple[str, ...] = ()
    """Shell commands run as root in the instance layer before `install` (apt packages, ...)."""
    install: str = DEFAULT_INSTALL
    """The command that installs the repository in the instance layer, run in /workspace."""

    def to_table(self) -> dict[str, Any]:
        """The `[metadata.rollyard.environment]` table (requirements written as a file)."""
        table: dict[str, Any] = {
            "repo": self.repo,
            "base_commit": self.base_commit,
            "python": self.python,
            "pip_packages": list(self.pip_packages),
            "pre_install": list(self.pre_install),
            "install": self.install,
        }
        if self.requirements:
            table["requirements"] = REQUIREMENTS_FILE
        return table


REQUIREMENTS_FILE = "requirements.txt"
"""The env layer's requirements, under the task's `environment/` (the build context)."""


def parse_environment(table: Any, environment_dir: Path) -> RepositoryEnvironment | list[str]:
    """The environment `table` declares, or every problem with it (each naming the field)."""
    if not isinstance(table, Mapping):
        return ["must be a table (repo, base_commit, python, install, ...)"]
    problems = []
    known = {"repo", "base_commit", "python", "requirements", "pip_packages", "pre_install",
             "install"}  # fmt: skip
    problems += [f"{key}: unknown field; use {', '.join(sorted(known))}" for key in table
                 if key not in known]  # fmt: skip

    def text(key: str, pattern: re.Pattern[str] | None, default: str | None = None) -> str:
        value = table.get(key, default)
        if not isinstance(value, str) or not value.strip():
            problems.append(f"{key}: must be a non-empty string")
            return ""
        if pattern is not None and not pattern.match(value):
            problems.append(f"{key}: {value!r} does not have the form {pattern.pattern}")
        return value

    def strings(key: str) -> tuple[str, ...]:
        value = table.get(key, [])
        if not isinstance(value, list) or not all(isinstance(v, str) and v.strip() for v in value):
            problems.append(f"{key}: must be a list of non-empty strings")
            return ()
        return tuple(value)

    repo = text("repo", REPO)
    base_commit = text("base_commit", COMMIT)
    python = text("python", PYTHON_VERSION)
    install = text("install", None, DEFAULT_INSTALL)
    pip_packages = strings("pip_packages")
    for requirement in pip_packages:
        try:
            Requirement(requirement)
        except InvalidRequirement:
            problems.append(f"pip_packages: {requirement!r} is not a pip requirement")
    pre_install = strings("pre_install")
    requirements = ""
    if "requirements" in table:
        name = table["requirements"]
        path = environment_dir / name if isinstance(name, str) else None
        if name != REQUIREMENTS_FILE or path is None or not path.is_file():
            problems.append(f"requirements: must be {REQUIREMENTS_FILE!r}, a file of environment/")
        else:
            requirements = path.read_text(encoding="utf-8")
    if problems:
        return problems
    return RepositoryEnvironment(repo, base_commit, python, requirements, pip_packages,
                                 pre_install, install)  # fmt: skip


@dataclasses.dataclass(frozen=True, slots=True)
class LayeredImage:
    """The three layers of a repository task's image, and which of them this call built."""

    base: str
    env: str
    instance: str
    built: tuple[str, ...]
    """The kinds (`base`, `env`, `instance`) built now; the others were found by their key."""


def _label(key: str, value: str) -> str:
    return f"LABEL rollyard.{key}={shlex.quote(value)}"


def env_dockerfile(environment: RepositoryEnvironment) -> str:
    """The env layer: a venv with the repository's dependencies, leading PATH."""
    installs = [f"python3 -m venv {VENV}"]
    if environment.requirements:
        installs.append(
            f"{VENV}/bin/pip install --no-cache-dir -r /opt/rollyard/{REQUIREMENTS_FILE}"
        )
    if environment.pip_packages:
        packages = " ".join(shlex.quote(p) for p in environment.pip_packages)
        installs.append(f"{VENV}/bin/pip install --no-cache-dir {packages}")
    lines = [
        "FROM parent",
        _label("repo", environment.repo),
        _label("python", environment.python),
    ]
    if environment.requirements:
        lines.append(f"COPY {REQUIREMENTS_FILE} /opt/rollyard/{REQUIREMENTS_FILE}")
    lines += [f"RUN {' && '.join(installs)}", f"ENV PATH={VENV}/bin:$PATH VIRTUAL_ENV={VENV}"]
    return "\n".join(lines) + "\n"


def instance_dockerfile(environment: RepositoryEnvironment) -> str:
    """The instance layer: the workspace (the tree at the base commit) installed in /workspace,
    left to the sandbox's uid 1000."""
    lines = [
        "FROM parent",
        _label("repo", environment.repo),
        _label("base_commit", environment.base_commit),
        "USER root",
        "WORKDIR /workspace",
        "COPY . /workspace/",
        *(f"RUN {command}" for command in environment.pre_install),
        f"RUN {environment.install}",
        # ensure_layer's Dockerfile rides in the context: not a file of the repository.
        "RUN rm -f /workspace/.rollyard.Dockerfile && chown -R 1000:1000 /workspace",
    ]
    return "\n".join(lines) + "\n"


def harbor_dockerfile(environment: RepositoryEnvironment) -> str:
    """`environment/Dockerfile`: the same three layers as one file, for Harbor (which builds
    the task's image from it on the official Python image)."""
    lines = [f"FROM python:{environment.python}-slim"]
    lines += env_dockerfile(environment).splitlines()[1:]
    lines += [line.replace("COPY . ", "COPY workspace/ ")
              for line in instance_dockerfile(environment).splitlines()[1:]]  # fmt: skip
    return "\n".join(lines) + "\n"


def python_image(python: str, *, client: Any = None) -> str:
    """The image the base layer starts from: the docker backend's base image when its Python is
    `python`, else `ROLLYARD_DOCKER_PYTHON_IMAGE` with `{python}` filled in."""
    from sandboxes import SandboxUnavailableError
    from sandboxes.docker_images import base_image, image_python_version

    base = base_image()
    base_python = image_python_version(base, client=client)
    if base_python == python:
        return base
    template = settings().docker_python_image
    if not template:
        raise SandboxUnavailableError(
            f"the environment wants Python {python}; the base image {base} has {base_python}: "
            "set ROLLYARD_DOCKER_PYTHON_IMAGE to an image per version (e.g. "
            "registry.example.com/python:{python}-bookworm) present in the engine or pullable"
        )
    return template.replace("{python}", python)


def repository_image(
    environment: RepositoryEnvironment,
    workspace: Path,
    *,
    build_timeout_s: float = 1800.0,
    client: Any = None,
) -> LayeredImage:
    """The instance image of a repository task, each layer built only when no image carries its
    key: base (keyed by the Python image and the tooling step), env (by the base, the repo, the
    Python version and the requirements), instance (by the env, the base commit, the install
    commands and the workspace's content). `RUN` lines reach the host's network (PyPI, apt)."""
    from sandboxes.docker_images import ensure_layer

    built: list[str] = []

    def layer(kind: str, parent: str, dockerfile: str, context: Path | None) -> str:
        found = ensure_layer(parent, dockerfile, context, kind=f"repo-{kind}", network=True,
                             timeout_s=build_timeout_s, client=client)  # fmt: skip
        if found.built:
            built.append(kind)
        return found.tag

    with tempfile.TemporaryDirectory(prefix="rollyard-base-") as context_dir:
        context = Path(context_dir)
        parent = python_image(environment.python, client=client)
        base = layer("base", parent, base_dockerfile(context), context)
    with tempfile.TemporaryDirectory(prefix="rollyard-env-") as context_dir:
        context = Path(context_dir)
        if environment.requirements:
            (context / REQUIREMENTS_FILE).write_text(environment.requirements, encoding="utf-8")
        env = layer("env", base, env_dockerfile(environment), context)
    instance = layer("instance", env, instance_dockerfile(environment), workspace)
    return LayeredImage(base, env, instance, tuple(built))
