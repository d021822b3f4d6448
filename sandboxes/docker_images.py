"""The Docker backend's images: the engine client, and the base -> family -> task layers, each
tagged by a hash of what built it (parent image id + Dockerfile + context, or parent + snapshot
digest), so only what changed is rebuilt; a Harbor task's own image, built or pulled, with its
WORKDIR leading to /workspace.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import io
import os
import posixpath
import shlex
import tarfile
from pathlib import Path
from typing import Any

from rollyard.settings import settings
from sandboxes import host
from sandboxes.base import WORKSPACE_MOUNT
from sandboxes.errors import SandboxSetupError, SandboxUnavailableError

BASE_IMAGE_ENV = "ROLLYARD_DOCKER_BASE_IMAGE"
LABEL = "rollyard.sandbox"
OWNER_LABEL = "rollyard.owner"
KEY_LABEL = "rollyard.key"
SANDBOX_UID = 1000
STATE_DIR = "/run/rollyard"
"""Root-owned directory in every task image for what the backend hands a command (stdin)."""


class _BufferedConnection:
    """An exec's hijacked connection read through the HTTP response's buffer. docker-py reads
    the raw socket under it, losing the output bytes that arrived with the response headers
    (measured here: about one short command in four came back with no output at all)."""

    def __init__(self, sock: Any, buffered: Any) -> None:
        self._sock = sock
        self._buffered = buffered

    def recv(self, size: int) -> bytes:
        return bytes(self._buffered.read1(size))

    def fileno(self) -> int:
        return int(self._sock.fileno())

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


@functools.cache
def _api_client_class() -> type:
    import docker

    class APIClient(docker.APIClient):  # type: ignore[misc]
        def _get_raw_response_socket(self, response: Any) -> Any:
            sock = super()._get_raw_response_socket(response)
            buffered = getattr(getattr(response.raw, "_fp", None), "fp", None)
            if buffered is None or not hasattr(buffered, "read1") or buffered.raw is not sock:
                return sock  # not the plain-socket case the buffer sits over
            return _BufferedConnection(sock, buffered)

    return APIClient


def _client() -> Any:
    try:
        import docker
        from docker.utils import kwargs_from_env
    except ImportError as error:  # pragma: no cover - docker is a dependency
        raise SandboxUnavailableError("the docker backend needs the `docker` package") from error
    try:
        client = docker.DockerClient(timeout=120, **kwargs_from_env())
        client.api = _api_client_class()(timeout=120, **kwargs_from_env())
        client.ping()
    except Exception as error:
        raise SandboxUnavailableError(
            f"no Docker engine answers at {os.environ.get('DOCKER_HOST', 'the default socket')} "
            f"({type(error).__name__}); start one with infra/docker/start-engine.sh and export "
            "the DOCKER_HOST it prints"
        ) from error
    return client


@functools.cache
def shared_client() -> Any:
    return _client()


def base_image() -> str:
    return settings().docker_base_image


def image_id(client: Any, reference: str) -> str:
    import docker

    try:
        return str(client.images.get(reference).id)
    except docker.errors.ImageNotFound:
        raise SandboxUnavailableError(
            f"image {reference!r} is not in the engine; build the base image with "
            "infra/docker/start-engine.sh (no registry is needed) or set "
            f"{BASE_IMAGE_ENV}"
        ) from None


def _tree_digest(context_dir: Path) -> str:
    from sandboxes.snapshot import snapshot_digest

    return snapshot_digest(context_dir)


@dataclasses.dataclass(frozen=True, slots=True)
class Layer:
    """An image layer `ensure_layer` found or built."""

    tag: str
    """`rollyard/<kind>:<key prefix>`."""
    key: str
    """The sha256 of what built it (also its `rollyard.key` label)."""
    built: bool
    """True when this call built it; False when an image with its key was already there."""


def ensure_layer(
    parent: str,
    dockerfile: str,
    context_dir: Path | None = None,
    *,
    kind: str = "family",
    network: bool = False,
    timeout_s: float = 600.0,
    client: Any = None,
) -> Layer:
    """Build (or reuse) an image from `dockerfile` on top of `parent`.

    The Dockerfile's first `FROM` is replaced by `parent`, so Harbor task Dockerfiles that name a
    registry image build offline on the local base. The tag is `rollyard/<kind>:<hash>` where the
    hash covers the parent's image id, the Dockerfile text and the context's content digest.
    Builds run without network unless `network` (the host's, for a task Dockerfile's apt-get and
    pip: Debian mirrors and PyPI are what the host reaches); containers never have any.
    """
    client = client or shared_client()
    parent_id = image_id(client, parent)
    lines = dockerfile.splitlines()
    for index, line in enumerate(lines):
        if line.strip().upper().startswith("FROM "):
            lines[index] = f"FROM {parent}"
            break
    else:
        lines.insert(0, f"FROM {parent}")
    text = "\n".join(lines) + "\n"
    context_digest = _tree_digest(context_dir) if context_dir is not None else "-"
    key = hashlib.sha256(f"{parent_id}\n{context_digest}\n{text}".encode()).hexdigest()
    tag = f"rollyard/{kind}:{key[:24]}"
    if built_key(client, tag) == key:
        return Layer(tag, key, built=False)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        if context_dir is not None:
            archive.add(str(context_dir), arcname=".")
        data = text.encode()
        info = tarfile.TarInfo(".rollyard.Dockerfile")
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))
    buffer.seek(0)
    try:
        client.images.build(
            fileobj=buffer, custom_context=True, dockerfile=".rollyard.Dockerfile", tag=tag,
            network_mode="host" if network else "none", rm=True, forcerm=True,
            labels={KEY_LABEL: key}, timeout=timeout_s,
        )  # fmt: skip
    except Exception as error:
        # The step's own output says why (a package that does not resolve, a certificate).
        log = [str(entry.get("stream", "")).strip() for entry in getattr(error, "build_log", [])
               if isinstance(entry, dict)]  # fmt: skip
        tail = " | ".join(line for line in log if line)[-600:]
        raise SandboxSetupError(
            f"building the {kind} image on {parent} failed: {error}"
            + (f"; log: {tail}" if tail else "")
        ) from error
    return Layer(tag, key, built=True)


def image_python_version(reference: str, *, client: Any = None) -> str:
    """The `major.minor` of an image's `python3` (asked once per image id)."""
    client = client or shared_client()
    return _python_of_image(client, image_id(client, reference))


@functools.cache
def _python_of_image(client: Any, image_id: str) -> str:
    output = client.containers.run(
        image_id, ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
        network_mode="none", remove=True,
    )  # fmt: skip
    return bytes(output).decode().strip()


def built_key(client: Any, tag: str) -> str | None:
    """The content key an image of rollyard's was built from (its `rollyard.key` label), None
    when the engine has no image `tag`: a tag is reused only when this matches the key of what
    would build it, so an image retagged or loaded from elsewhere under the name is rebuilt."""
    try:
        labels = client.images.get(tag).labels or {}
    except Exception:
        return None
    return str(labels.get(KEY_LABEL)) if labels.get(KEY_LABEL) else None


def harbor_task_image(
    environment_dir: Path,
    workdir: str = WORKSPACE_MOUNT,
    *,
    base: str | None = None,
    build_timeout_s: float = 600.0,
    client: Any = None,
) -> str:
    """The image of a Harbor task that brings its own (`environment/Dockerfile`), built once per
    content digest on the local base image (its `RUN` lines reach the host's network), with the
    image's WORKDIR leading to the workspace: the agent and the verifier work in the WORKDIR the
    task names, and the sandbox sees their changes under /workspace."""
    dockerfile = (environment_dir / "Dockerfile").read_text(encoding="utf-8")
    image = ensure_layer(base or base_image(), dockerfile, environment_dir, kind="task-env",
                         network=True, timeout_s=build_timeout_s, client=client).tag  # fmt: skip
    return _workdir_layer(image, workdir, client=client)


def pulled_task_image(reference: str, workdir: str | None = None, *, client: Any = None) -> str:
    """The image of a Harbor task that names a pre-built one (`[environment] docker_image`) and
    no Dockerfile: the engine's copy, pulled when it has none, used as is (not rebuilt on the
    base image), with its WORKDIR (`workdir` overrides it) leading to the workspace as for a
    built one. It must hold `sh` and `python3` (the container's reaper). A pull that fails
    raises `SandboxUnavailableError` saying how to provide the image."""
    import docker

    client = client or shared_client()
    try:
        found = client.images.get(reference)
    except docker.errors.ImageNotFound:
        try:
            found = client.images.pull(reference)
        except Exception as error:
            # The engine's own words (a name that does not resolve, a denied pull), not the SDK's.
            text = str(getattr(error, "explanation", None) or error).strip().splitlines()
            raise SandboxUnavailableError(
                f"cannot pull the task's image {reference} "
                f"({text[0][:200] if text else type(error).__name__}); load it into the engine "
                "(`docker pull` where its registry is reachable, then `docker save` | `docker "
                "load` here), or give the task an environment/Dockerfile"
            ) from None
    configured = str((found.attrs.get("Config") or {}).get("WorkingDir") or "/")
    return _workdir_layer(reference, workdir or configured, client=client)


def _workdir_layer(image: str, workdir: str, *, client: Any) -> str:
    """`image` with its WORKDIR's content moved to /workspace and the WORKDIR a symlink to it,
    so the agent and the verifier work where the task says and the sandbox sees their changes
    under /workspace (the image itself where the WORKDIR is / or /workspace)."""
    workdir = posixpath.normpath(workdir)
    if workdir in ("/", WORKSPACE_MOUNT):
        return image
    quoted = shlex.quote(workdir)
    # What the Dockerfile left in WORKDIR (files its RUN lines made too) moves to the workspace.
    relocate = (
        "FROM parent\nUSER root\n"
        f"RUN mkdir -p {WORKSPACE_MOUNT} && if [ -d {quoted} ] && [ ! -L {quoted} ]; then "
        f"cp -a {quoted}/. {WORKSPACE_MOUNT}/ && rm -rf {quoted}; fi && "
        f'mkdir -p "$(dirname {quoted})" && ln -sfn {WORKSPACE_MOUNT} {quoted}\n'
        f"WORKDIR {WORKSPACE_MOUNT}\n"
    )
    return ensure_layer(image, relocate, kind="task-env", client=client).tag


def _tar_tree(root: Path, arc_root: str) -> io.BytesIO:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:

        def owned(info: tarfile.TarInfo) -> tarfile.TarInfo:
            info.uid = info.gid = SANDBOX_UID
            info.uname = info.gname = ""
            return info

        archive.add(str(root), arcname=arc_root, filter=owned)
    buffer.seek(0)
    return buffer


def snapshot_image(parent: str, lower_dir: Path, digest: str, *, client: Any) -> str:
    """The task layer: `parent` plus the snapshot at /workspace (uid 1000), tagged by hash."""
    parent_id = image_id(client, parent)
    key = hashlib.sha256(f"{parent_id}\n{digest}".encode()).hexdigest()
    tag = f"rollyard/task:{key[:24]}"
    if built_key(client, tag) == key:
        return tag
    container = client.containers.create(
        parent,
        command=["true"],
        network_mode="none",
        labels={LABEL: "build", OWNER_LABEL: host.owner_token()},
    )
    try:
        ok = container.put_archive("/", _tar_tree(lower_dir, WORKSPACE_MOUNT.lstrip("/")))
        state = tarfile.TarInfo(STATE_DIR.lstrip("/"))
        state.type = tarfile.DIRTYPE
        state.mode = 0o755
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            archive.addfile(state)
        buffer.seek(0)
        ok = ok and container.put_archive("/", buffer)
        if not ok:
            raise SandboxSetupError(f"copying the snapshot into {parent} failed")
        container.commit(
            repository="rollyard/task", tag=key[:24],
            conf={"Labels": {KEY_LABEL: key}, "WorkingDir": WORKSPACE_MOUNT},
        )  # fmt: skip
    finally:
        container.remove(force=True)
    return tag
