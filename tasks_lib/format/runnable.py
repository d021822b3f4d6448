"""Where a task runs faithfully (the local bwrap backend, or its own image on the docker backend),
and the reasons it is refused when neither can.

A task is refused rather than run and scored when it needs what a no-network, no-GPU, single
sandbox cannot give: public network (an allowlist of hosts is served by the egress proxy,
`sandboxes.egress`), GPUs/TPUs, compose services or MCP
servers, several steps, Windows. A pre-built `docker_image` (no Dockerfile) is pulled by the
docker backend, which says so when it cannot. A plain Harbor task
(judged by its `tests/test.sh`) runs on bwrap when its `environment/Dockerfile` builds nothing
this machine's environment does not already hold: only `FROM` the local Python image, `WORKDIR`,
`COPY`/`ADD` of context files, harmless `ENV`/metadata lines and `pip install` of requirements
the local environment satisfies. Any other Dockerfile gives the task its own image, built on the
docker backend (`container_reasons` says why). A task that declares rollyard's fields is run by
rollyard's own verifier in rollyard's environment; its Dockerfile describes that for Harbor.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import shutil
import sys
from pathlib import Path, PurePosixPath

from packaging.requirements import InvalidRequirement, Requirement

from rollyard.settings import cache_root
from tasks_lib.format.harbor import HarborConfig, NetworkPolicy

LOCAL_PYTHON = f"{sys.version_info.major}.{sys.version_info.minor}"
LOCAL_IMAGE_PATTERN = re.compile(
    rf"^(?:docker\.io/)?(?:library/)?python:{re.escape(LOCAL_PYTHON)}(?:[.\d]*)?"
    r"(?:-(?:slim|bookworm|slim-bookworm))?(?:@sha256:[0-9a-f]{64})?$"
)
"""Images the local environment stands for: the Python of this machine on Debian."""
HARMLESS_ENV = frozenset(
    {"PYTHONUNBUFFERED", "PYTHONDONTWRITEBYTECODE", "DEBIAN_FRONTEND", "PIP_NO_CACHE_DIR",
     "PIP_DISABLE_PIP_VERSION_CHECK", "LANG", "LC_ALL", "TZ"}
)  # fmt: skip
"""ENV variables that change nothing a task's commands observe here."""
IGNORED_INSTRUCTIONS = frozenset({"LABEL", "EXPOSE", "CMD", "ENTRYPOINT", "USER", "ARG", "SHELL",
                                  "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER", "VOLUME"})  # fmt: skip
"""Instructions that do not change the files or programs the agent and the verifier see."""
DOCKER_FIX = "run it on the docker backend (infra/docker/start-engine.sh starts an engine)"


@dataclasses.dataclass(frozen=True, slots=True)
class Refusal:
    """Why the local backend will not run a task, and what would make it run."""

    field: str
    """Where the need is declared (`environment.network_mode`, `environment/Dockerfile:4`)."""
    reason: str
    fix: str

    def __str__(self) -> str:
        return f"{self.field}: {self.reason}; {self.fix}"


@dataclasses.dataclass(frozen=True, slots=True)
class LocalImage:
    """A Dockerfile the local environment reproduces: where the workspace sits in the image and
    which context paths are copied there."""

    workdir: str
    copies: tuple[tuple[str, str], ...]
    """(context-relative source, workdir-relative destination) of every COPY/ADD, in order."""


def _network(policy: NetworkPolicy, field: str) -> list[Refusal]:
    if policy.mode == "public":
        return [Refusal(field, "the task needs public network (Harbor's default when "
                        "network_mode is not set); no backend here has any",
                        'set network_mode = "no-network" if the task needs no network')]  # fmt: skip
    return []


def refusals(config: HarborConfig, task_dir: Path, *, runs_test_sh: bool) -> list[Refusal]:
    """Every reason no backend here runs the task at `task_dir` faithfully (empty when one can).
    `runs_test_sh`: the task is judged by its test.sh, so its Dockerfile must build."""
    found = _network(config.agent_network_policy, "environment.network_mode (agent)")
    if config.verifier_network_policy != config.agent_network_policy:
        found += _network(config.verifier_network_policy, "verifier.network_mode")
    for env in (config.environment, config.verifier_environment):
        if env is None:
            continue
        if env.gpus or env.gpu_types or env.tpu:
            found.append(Refusal("environment.gpus", "the task needs GPUs or TPUs; this machine "
                                 "has none", "run it where an accelerator is attached"))  # fmt: skip
        if env.os != "linux":
            found.append(Refusal("environment.os", f"the task targets {env.os}",
                                 "only linux tasks run here"))  # fmt: skip
        if env.mcp_servers:
            found.append(Refusal("environment.mcp_servers", "the task needs MCP servers",
                                 "serve them from inside the task's environment"))  # fmt: skip
        if env.healthcheck:
            found.append(Refusal("environment.healthcheck", "the task waits on a service "
                                 "healthcheck", "start the service from the task's commands"))  # fmt: skip
        for key, value in env.env.items():
            if "${" in value:
                found.append(Refusal(f"environment.env.{key}", "takes its value from the host",
                                     "write the value into task.toml"))  # fmt: skip
    if config.steps:
        found.append(Refusal("steps", f"the task has {config.steps} steps", "split it into tasks"))
    if config.collect_hooks:
        found.append(Refusal("verifier.collect", "the verifier collects from compose services",
                             "verify from the agent's files"))  # fmt: skip
    for compose in ("environment/docker-compose.yaml", "tests/docker-compose.yaml"):
        if (task_dir / compose).is_file():
            found.append(Refusal(compose, "the task starts compose services, which no backend "
                                 "here runs", "start the service from the task's own commands"))  # fmt: skip
    if config.environment.docker_image and not runs_test_sh:
        found.append(Refusal("environment.docker_image", f"names the pre-built image "
                             f"{config.environment.docker_image}, but a task with rollyard's own "
                             "fields runs in rollyard's environment", "remove docker_image, or "
                             "remove [metadata.rollyard] to run the task by its test.sh"))  # fmt: skip
    if runs_test_sh:
        for dockerfile in _dockerfiles(config, task_dir):
            broken = read_dockerfile(dockerfile).broken
            if broken is not None:
                found.append(broken)
    return found


def _dockerfiles(config: HarborConfig, task_dir: Path) -> list[Path]:
    """The Dockerfiles a plain Harbor task's episodes run in: the agent's and, for a separate
    verifier, the verifier's own (`tests/Dockerfile`)."""
    found = [task_dir / "environment" / "Dockerfile"]
    if config.verifier_mode == "separate":
        found.append(task_dir / "tests" / "Dockerfile")
    return [path for path in found if path.is_file()]


def container_reasons(config: HarborConfig, task_dir: Path) -> list[Refusal]:
    """Why a plain Harbor task needs its own image (the docker backend) rather than the local
    environment: each Dockerfile line the local backend does not reproduce (empty: it runs
    on bwrap)."""
    found = []
    for dockerfile in _dockerfiles(config, task_dir):
        problem = read_dockerfile(dockerfile).local_problem
        if problem is not None:
            found.append(problem)
    return found


def absolute_workdir_uses(tests_dir: Path, workdir: str) -> list[Refusal]:
    """Test files (other than test.sh, whose paths are rewritten) that name the image's WORKDIR
    by its absolute path: bwrap mounts the workspace at /workspace only, so they need the task's
    image, where WORKDIR leads to the workspace."""
    if workdir in ("/", "/workspace") or not tests_dir.is_dir():
        return []
    pattern = re.compile(rf"(?<![\w./-]){re.escape(workdir.rstrip('/'))}\b")
    found = []
    for path in sorted(tests_dir.rglob("*")):
        if not path.is_file() or path.name in ("test.sh", "Dockerfile"):
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if pattern.search(text):
            rel = path.relative_to(tests_dir.parent).as_posix()
            found.append(Refusal(rel, f"names the image's WORKDIR {workdir} by its absolute path, "
                                 "where the local backend does not mount the workspace",
                                 "use paths relative to the working directory, or " + DOCKER_FIX))  # fmt: skip
    return found


def _satisfied(requirement_text: str) -> str | None:
    """None when the local environment satisfies a pip requirement, else why not."""
    try:
        requirement = Requirement(requirement_text)
    except InvalidRequirement:
        return f"{requirement_text!r} is not a requirement the local environment can check"
    if requirement.url:
        return f"{requirement_text!r} installs from a URL"
    try:
        installed = importlib.metadata.version(requirement.name)
    except importlib.metadata.PackageNotFoundError:
        return f"{requirement.name} is not installed here"
    if requirement.specifier and not requirement.specifier.contains(installed, prereleases=True):
        return f"{requirement_text} is wanted, {requirement.name} {installed} is installed"
    return None


def _pip_install(argv: list[str]) -> list[str] | None:
    """The requirements of a `pip install` command line (None when it is not one)."""
    if argv[:2] in (["pip", "install"], ["pip3", "install"]):
        rest = argv[2:]
    elif argv[:4] in (["python", "-m", "pip", "install"], ["python3", "-m", "pip", "install"]):
        rest = argv[4:]
    elif argv[:3] == ["uv", "pip", "install"]:
        rest = argv[3:]
    else:
        return None
    flags_with_value = {"-r", "--requirement", "-c", "--constraint", "-i", "--index-url",
                        "--extra-index-url", "-f", "--find-links", "--target", "-t", "-e"}  # fmt: skip
    packages: list[str] = []
    tokens = iter(rest)
    for token in tokens:
        if token in flags_with_value:
            packages.append(f"{token} {next(tokens, '')}")
        elif not token.startswith("-"):
            packages.append(token)
    return packages


def _logical_lines(text: str) -> list[tuple[int, str]]:
    lines: list[tuple[int, str]] = []
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        if not pending and (not raw.strip() or raw.lstrip().startswith("#")):
            continue
        if not pending:
            start = number
        stripped = raw.rstrip()
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append((start, pending + stripped))
        pending = ""
    if pending:
        lines.append((start, pending))
    return lines


@dataclasses.dataclass(frozen=True, slots=True)
class DockerfileReading:
    """What a task's Dockerfile says about its workspace, and whether the local backend can
    reproduce the image or the task needs its own (the docker backend builds it)."""

    image: LocalImage
    """The WORKDIR and the COPY/ADD lines into it: the agent's starting workspace either way."""
    local_problem: Refusal | None
    """The first line the local environment does not reproduce (None: it reproduces all)."""
    broken: Refusal | None
    """A line no backend can build (unreadable, unparsable, no FROM, copies from outside the
    build context): the task is refused."""


def read_dockerfile(dockerfile: Path) -> DockerfileReading:
    """Read a Harbor task's Dockerfile line by line, past lines the local backend does not
    reproduce (the docker backend builds those), stopping only at a line nothing can build."""
    where = dockerfile.parent.name + "/" + dockerfile.name
    workdir = "/"
    copies: list[tuple[str, str]] = []
    froms = 0
    local: list[Refusal] = []

    def reading(broken: Refusal | None = None) -> DockerfileReading:
        return DockerfileReading(LocalImage(workdir, tuple(copies)), next(iter(local), None),
                                 broken)  # fmt: skip

    try:
        text = dockerfile.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        return reading(Refusal(where, f"cannot be read ({error})", "fix the file"))
    for number, line in _logical_lines(text):
        field = f"{where}:{number}"
        instruction, _, value = line.strip().partition(" ")
        instruction = instruction.upper()
        value = re.sub(r"^(?:--\S+\s+)+", "", value.strip())
        try:
            args = json.loads(value) if value.startswith("[") else shlex.split(value)
        except ValueError:
            return reading(Refusal(field, f"cannot parse {line.strip()[:80]!r}", "fix the line"))
        if instruction == "FROM":
            froms += 1
            image = args[0] if args else ""
            if froms > 1 or not LOCAL_IMAGE_PATTERN.match(image):
                local.append(Refusal(field, f"builds on {image} (the local environment is Python "
                                     f"{LOCAL_PYTHON} on Debian)", DOCKER_FIX))  # fmt: skip
        elif instruction == "WORKDIR":
            workdir = str(PurePosixPath(workdir, args[0] if args else "/"))
        elif instruction in ("COPY", "ADD"):
            if "--from" in line or any("://" in arg for arg in args):
                local.append(Refusal(field, f"copies from outside the build context: "
                                     f"{line[:80]!r}", DOCKER_FIX))  # fmt: skip
                continue
            if len(args) < 2:
                return reading(Refusal(field, f"cannot parse {line.strip()[:80]!r}",
                                       "fix the line"))  # fmt: skip
            dest = PurePosixPath(workdir, args[-1])
            try:
                relative = dest.relative_to(workdir)
            except ValueError:
                local.append(Refusal(field, f"copies to {dest}, outside the WORKDIR {workdir}",
                                     DOCKER_FIX))  # fmt: skip
                continue
            into_dir = args[-1].endswith("/") or len(args) > 2 or args[-1] in (".", "./")
            for source in args[:-1]:
                if source.startswith("/") or ".." in PurePosixPath(source).parts:
                    return reading(Refusal(field, f"copies {source}, outside the build context",
                                           "copy from inside environment/"))  # fmt: skip
                target = relative.as_posix()
                if into_dir and not (dockerfile.parent / source).is_dir():
                    target = (relative / PurePosixPath(source).name).as_posix()
                copies.append((source, "" if target == "." else target))
        elif instruction == "ENV":
            names = [arg.split("=", 1)[0] for arg in args] if "=" in value else args[:1]
            unknown = [name for name in names if name not in HARMLESS_ENV]
            if unknown:
                local.append(Refusal(field, f"sets {', '.join(unknown)}, which the local backend "
                                     "does not reproduce", DOCKER_FIX))  # fmt: skip
        elif instruction == "RUN":
            for command in re.split(r"&&|;", value):
                argv = shlex.split(command) if command.strip() else []
                requirements = _pip_install(argv)
                if requirements is None:
                    local.append(Refusal(field, f"runs {command.strip()[:80]!r}, which the local "
                                         "backend does not reproduce", DOCKER_FIX))  # fmt: skip
                    break
                problem = next(filter(None, map(_satisfied, requirements)), None)
                if problem is not None:
                    local.append(Refusal(field, problem, DOCKER_FIX))
                    break
        elif instruction not in IGNORED_INSTRUCTIONS:
            local.append(Refusal(field, f"uses {instruction}, which the local backend does not "
                                 "reproduce", DOCKER_FIX))  # fmt: skip
    if froms == 0:
        return reading(Refusal(where, "has no FROM line",
                               "start it with FROM python:" + LOCAL_PYTHON))  # fmt: skip
    return reading()


def read_local_image(dockerfile: Path) -> LocalImage | Refusal:
    """The Dockerfile as the local environment reproduces it, or why it cannot."""
    found = read_dockerfile(dockerfile)
    return found.broken or found.local_problem or found.image


def image_workspace(context_dir: Path, image: LocalImage) -> Path:
    """The directory the agent starts in: what the Dockerfile's COPY lines put under WORKDIR.

    One `COPY <dir>/ <WORKDIR>/` is that directory of the task itself; anything else is assembled
    once under the cache, keyed by a digest of what is copied, and renamed into place whole.
    """
    if len(image.copies) == 1 and image.copies[0][1] == "":
        only = context_dir / image.copies[0][0]
        if only.is_dir():
            return only.resolve()

    digest = hashlib.sha256(repr(image.copies).encode())
    for source, _ in image.copies:
        root = context_dir / source
        paths = sorted(root.rglob("*")) if root.is_dir() else [root]
        for path in paths:
            if path.is_file():
                digest.update(path.relative_to(context_dir).as_posix().encode())
                digest.update(path.read_bytes())
    target = cache_root() / "harbor-workspaces" / digest.hexdigest()[:32]
    if target.is_dir():
        return target
    partial = target.with_name(f"{target.name}.{os.getpid()}.partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for source, dest in image.copies:
        origin = context_dir / source
        destination = partial / dest if dest else partial
        if origin.is_dir():
            shutil.copytree(origin, destination, dirs_exist_ok=True)
        elif origin.is_file():
            destination.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(origin, destination)
    try:
        partial.rename(target)
    except OSError:
        # Another loader assembled the same digest first: theirs is identical.
        shutil.rmtree(partial, ignore_errors=True)
    return target
