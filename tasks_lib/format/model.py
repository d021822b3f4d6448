"""What a loaded task is: the values the training loop and the verifier read from a task directory,
and the path groups a candidate may not change."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Literal

from sandboxes import Limits
from tasks_lib.format.harbor import HarborConfig
from tasks_lib.format.repository import RepositoryEnvironment
from tasks_lib.format.spec import ArtifactSpec, RulesSpec

DEFAULT_WORKSPACE_DIR = "environment/workspace"
DEFAULT_TEST_COMMAND = "python -m pytest tests"
DEFAULT_HIDDEN_DIR = "tests/hidden"
VERIFIER_DIR = ".rollyard"
"""Workspace directory the verifier owns during a run (its ini, the JUnit report); a candidate's
files under it are dropped, so nothing there can be pre-seeded."""

DIFFICULTIES = ("easy", "medium", "hard")

TestRunner = Literal["pytest", "unittest"]
"""How a `tests` task's suite runs: pytest (ids `tests/test_x.py::test_y`) or a unittest-based
runner such as Django's `tests/runtests.py` (ids `test_y (module.Class)`)."""
TEST_RUNNERS: tuple[TestRunner, ...] = ("pytest", "unittest")

VerifierKind = Literal["tests", "harbor", "artifact", "rules"]
"""How a task is judged: its pytest suite (`tests`), the `reward.txt` its `tests/test.sh` writes
(`harbor`, a plain Harbor task without a `[rollyard]` table), its outputs against references
(`artifact`) or declarative checks over the final state (`rules`)."""
DECLARED_KINDS: dict[str, VerifierKind] = {
    "tests": "tests",
    "artifact": "artifact",
    "rules": "rules",
}
"""The kinds a `[rollyard]` table can declare with `verifier = ...`."""

# Paths a candidate may not change: they decide what the tests are and how pytest runs. Each
# group carries the guard rule its violations are reported under.
TEST_FILE_GLOBS = ("tests/**", "test_*.py", "*_test.py")
CONFTEST_GLOBS = ("conftest.py",)
CONFIG_GLOBS = (
    "pytest.ini",
    ".pytest.ini",
    "tox.ini",
    "setup.cfg",
    "pyproject.toml",
    "setup.py",
    "noxfile.py",
    ".coveragerc",
)
PLUGIN_GLOBS = ("*.dist-info", "*.egg-info", "*.egg-link", "entry_points.txt")
IMPORT_HOOK_GLOBS = ("*.pth", "sitecustomize.py", "usercustomize.py")
BYTECODE_GLOBS = ("__pycache__", "*.pyc", "*.pyo", ".pytest_cache")
GIT_GLOBS = (".git", ".gitmodules")
VERIFIER_GLOBS = (VERIFIER_DIR,)


@dataclasses.dataclass(frozen=True, slots=True)
class ContainerImage:
    """A task's own image: a plain Harbor task's Dockerfile builds what the local environment
    does not hold, or a repository task declares its environment; either way its episodes and its
    verifier run on the docker backend, in that image."""

    context_dir: Path
    """The build context (`environment/`); its Dockerfile is `environment/Dockerfile`."""
    verifier_context_dir: Path | None
    """A separate verifier's own build context (`tests/`, with `tests/Dockerfile`), else None:
    the verifier runs in the agent's image."""
    reason: str
    """Why the local backend does not reproduce it (the first such Dockerfile line)."""
    pulled_image: str | None = None
    """A pre-built image (Harbor's `docker_image`, the task having no Dockerfile): pulled when
    the engine lacks it and used as is, instead of a build."""
    repository: RepositoryEnvironment | None = None
    """A repository task's environment (`[metadata.rollyard.environment]`): its image is built
    in layers (base -> env -> instance) from this, not from the Dockerfile."""


@dataclasses.dataclass(frozen=True, slots=True)
class Task:
    """A task loaded from a Harbor task directory (with or without a `[rollyard]` table)."""

    id: str
    version: str
    path: Path
    """The task directory."""
    instruction: str
    """Text of `instruction.md`: what the agent is asked to do."""
    snapshot_dir: Path
    """The agent's initial workspace (open a sandbox over it); holds no tests dir of the
    verifier, no solution, no history."""
    limits: Limits
    """Sandbox limits for the agent's episode."""
    agent_timeout_s: float
    verify_timeout_s: float
    test_command: str
    """The command the instruction tells the agent to run (`python -m pytest tests`)."""
    test_paths: tuple[str, ...]
    """Workspace paths pytest collects from, taken from `test_command`."""
    fail_to_pass: tuple[str, ...]
    pass_to_pass: tuple[str, ...]
    hidden_tests: tuple[str, ...]
    hidden_dir: Path | None
    """Task directory whose tree is overlaid onto the workspace at verification (hidden tests)."""
    protected: tuple[str, ...]
    """Extra protected globs of this task, on top of the built-in ones."""
    family: str
    source: str
    difficulty: str
    has_rollyard_table: bool
    """False for a plain Harbor task: it is scored from the `reward.txt` its test.sh writes."""
    verifier: str = "tests"
    """How the task is judged: `tests` (pytest suite), `artifact` (outputs against references)
    or `rules` (declarative checks over the final state)."""
    artifact: ArtifactSpec | None = None
    """The `[rollyard.artifact]` table when `verifier` is `artifact`."""
    rules: RulesSpec | None = None
    """The `[rollyard.rules]` table when `verifier` is `rules`."""
    harbor: HarborConfig = dataclasses.field(default_factory=HarborConfig)
    """task.toml in Harbor's terms (environment, verifier mode and env, network, ...)."""
    workdir: str = "/workspace"
    """The agent's working directory in Harbor's image (the Dockerfile's WORKDIR, or
    `[environment].workdir`): the workspace stands there, and test.sh's paths under it are
    rewritten to the workspace."""
    container: ContainerImage | None = None
    """Set when the task needs its own image (the docker backend); None: it runs on bwrap."""
    test_runner: TestRunner = "pytest"
    """How the `tests` verifier runs the suite: pytest, or `test_command` as a unittest runner
    given the expected tests as labels."""

    @property
    def verifier_kind(self) -> VerifierKind:
        """The verifier that judges this task; `verifier` as declared, `harbor` without a table."""
        return DECLARED_KINDS[self.verifier] if self.has_rollyard_table else "harbor"

    @property
    def expected_tests(self) -> tuple[str, ...]:
        """Every test id that must appear as passed for reward 1."""
        return tuple(dict.fromkeys((*self.fail_to_pass, *self.pass_to_pass, *self.hidden_tests)))

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"
