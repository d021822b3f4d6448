"""The Docker backend, for tasks that ship an image: a warm container per sandbox, commands by
`exec` (~0.1 s each, against ~0.5 s for `docker run`).

Images are layered base -> family -> task, each tagged by a hash of what built it (parent image
id + Dockerfile + context, or parent + snapshot digest), so only what changed is rebuilt. The
container has no network, drops every capability but KILL (used only by its reaper), runs
commands as uid 1000, and has memory (swap included), pids and CPU limits; a CPU-time rlimit and
a wall timeout bound each command, and every process a command started is killed when it returns.
Reset replaces the container with a fresh one from the task image (cost independent of the
workspace size); containers are labelled with their owner and always removed.

Limits.disk_mb bounds /tmp (a tmpfs). The workspace lives in the container's writable layer,
which overlay2 cannot cap without project quotas (xfs + pquota): size it in the engine config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import io
import os
import posixpath
import secrets
import shlex
import signal
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from rollyard.settings import settings
from sandboxes import host
from sandboxes.base import WORKSPACE_MOUNT, ExecResult, Limits, Sandbox, WorkspaceDiff
from sandboxes.egress import SOCKET_IN_SANDBOX, EgressProxy, proxy_environment, relay_argv
from sandboxes.errors import (
    SandboxSetupError,
    SandboxUnavailableError,
    WorkspacePathError,
)
from sandboxes.output import CappedBuffer
from sandboxes.snapshot import DIGEST_PREFIX, TreeBounds, prepare_snapshot

BASE_IMAGE_ENV = "ROLLYARD_DOCKER_BASE_IMAGE"
LABEL = "rollyard.sandbox"
OWNER_LABEL = "rollyard.owner"
KEY_LABEL = "rollyard.key"
SANDBOX_UID = 1000
STATE_DIR = "/run/rollyard"
"""Root-owned directory in every task image for what the backend hands a command (stdin)."""

# PID 1 of every container: reaps orphans (so killed trees leave no zombies that count against
# the pids limit) and exits on SIGTERM.
_REAPER = (
    "import os, signal, sys, time\n"
    "signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))\n"
    "while True:\n"
    "    try:\n"
    "        os.waitpid(-1, 0)\n"
    "    except ChildProcessError:\n"
    "        time.sleep(0.2)\n"
)
_LAUNCHER = 'ulimit -t "$1" || exit 125; shift; exec "$@"'
_LAUNCHER_STDIN = 'ulimit -t "$1" || exit 125; f=$2; shift 2; exec "$@" < "$f"'
# Resolves a workspace path inside the container, refusing what leaves /workspace.
_RESOLVE = (
    'p=$(realpath -m -- "$1") || exit 2; '
    'case "$p" in /workspace/*) ;; *) echo "$p" >&2; exit 3;; esac; '
    'if [ "$2" = read ]; then [ -d "$p" ] && exit 4; [ -e "$p" ] || exit 5; '
    '[ -f "$p" ] || exit 6; exec cat -- "$p"; fi; '
    '[ -d "$p" ] && exit 4; mkdir -p -- "$(dirname -- "$p")" || exit 7; printf %s "$p"'
)
_DESCRIBE = (
    'for p in "$@"; do if [ -L "$p" ]; then printf "L %s\\n" "$(readlink -- "$p")"; '
    'elif [ -f "$p" ]; then printf "F %s %s\\n" "$(stat -c %a -- "$p")" '
    '"$(sha256sum -- "$p" | cut -d" " -f1)"; elif [ -d "$p" ]; then echo D; else echo -; fi; done'
)


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
def _shared_client() -> Any:
    return _client()


def base_image() -> str:
    return settings().docker_base_image


def _image_id(client: Any, reference: str) -> str:
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


def build_layer(
    parent: str,
    dockerfile: str,
    context_dir: Path | None = None,
    *,
    kind: str = "family",
    network: bool = False,
    timeout_s: float = 600.0,
    client: Any = None,
) -> str:
    """The tag of `ensure_layer`'s image (built when missing)."""
    return ensure_layer(parent, dockerfile, context_dir, kind=kind, network=network,
                        timeout_s=timeout_s, client=client).tag  # fmt: skip


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
    client = client or _shared_client()
    parent_id = _image_id(client, parent)
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
    client = client or _shared_client()
    return _python_of_image(client, _image_id(client, reference))


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
    image = build_layer(base or base_image(), dockerfile, environment_dir, kind="task-env",
                        network=True, timeout_s=build_timeout_s, client=client)  # fmt: skip
    return _workdir_layer(image, workdir, client=client)


def pulled_task_image(reference: str, workdir: str | None = None, *, client: Any = None) -> str:
    """The image of a Harbor task that names a pre-built one (`[environment] docker_image`) and
    no Dockerfile: the engine's copy, pulled when it has none, used as is (not rebuilt on the
    base image), with its WORKDIR (`workdir` overrides it) leading to the workspace as for a
    built one. It must hold `sh` and `python3` (the container's reaper). A pull that fails
    raises `SandboxUnavailableError` saying how to provide the image."""
    import docker

    client = client or _shared_client()
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
    return build_layer(image, relocate, kind="task-env", client=client)


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
    parent_id = _image_id(client, parent)
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


def _cgroup_dirs(container_id: str, controller: str) -> Iterator[Path]:
    root = Path("/sys/fs/cgroup")
    yield root / controller / "docker" / container_id  # v1, cgroupfs driver
    yield root / controller / "system.slice" / f"docker-{container_id}.scope"  # v1, systemd
    yield root / "docker" / container_id  # v2, cgroupfs
    yield root / "system.slice" / f"docker-{container_id}.scope"  # v2, systemd


@functools.cache
def _background() -> ThreadPoolExecutor:
    """Threads that start spare containers and remove used ones off the caller's path."""
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="rollyard-docker")


def _remove(container: Any) -> None:
    import docker

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except Exception as error:
        raise SandboxSetupError(f"cannot remove container {container.short_id}: {error}") from error


def _remove_spare(spare: Future[Any]) -> None:
    try:
        container = spare.result()
    except SandboxSetupError:
        return  # it never started: nothing to remove
    _remove(container)


@functools.cache
def _swept() -> bool:
    """Remove containers whose owning process is gone (killed before it could close them)."""
    with contextlib.suppress(SandboxUnavailableError):
        client = _shared_client()
        for container in client.containers.list(all=True, filters={"label": LABEL}):
            owner = container.labels.get(OWNER_LABEL, "")
            if not owner or not host.owner_alive(owner):
                with contextlib.suppress(Exception):
                    container.remove(force=True)
    return True


class DockerSandbox(Sandbox):
    """A sandbox over `snapshot` in a warm container of `image` (default: the base image), with
    the snapshot as the task layer at /workspace. With an explicit `image`, `snapshot_digest`
    covers the image as well as the snapshot."""

    backend_name = "docker"

    def __init__(self, snapshot: Path, *, limits: Limits | None = None, image: str | None = None,
                 client: Any = None) -> None:  # fmt: skip
        limits = limits or Limits()
        self._client = client or _shared_client()
        _swept()
        prepared = prepare_snapshot(
            Path(snapshot),
            host.host_layout().docker_snapshots,
            owner_uid=SANDBOX_UID,
            bounds=TreeBounds.of(limits),
        )
        digest = prepared.digest
        if image is not None:
            # A task's own image is part of where the episode starts: the digest every episode
            # records covers the image (by id) and the workspace.
            both = f"{_image_id(self._client, image)}\n{prepared.digest}".encode()
            digest = DIGEST_PREFIX + hashlib.sha256(both).hexdigest()
        super().__init__(Path(snapshot), digest, limits)
        self._closed = True  # until fully built
        self._lower = prepared.lower_dir
        self.image = snapshot_image(
            image or base_image(), self._lower,
            prepared.digest.removeprefix(DIGEST_PREFIX), client=self._client,
        )  # fmt: skip
        self._container: Any = None
        self._spare: Future[Any] | None = None
        self._pending: list[Future[None]] = []
        self._egress: EgressProxy | None = None
        if limits.allowed_hosts:
            # The container keeps no network; the proxy's socket is its only way out. Its
            # directory is named like a sandbox's, so an owner killed mid-run has it swept.
            layout = host.host_layout()
            egress_dir = layout.live / f"{host.owner_token()}-{secrets.token_hex(6)}"
            for directory in (layout.root, layout.live, egress_dir):
                directory.mkdir(mode=0o711, exist_ok=True)
                directory.chmod(0o711)  # the container's uid 1000 must traverse to the socket
            self._egress = EgressProxy(egress_dir / "egress.sock", limits.allowed_hosts)
        try:
            self._start_container()
        except BaseException:
            self._close_egress()
            raise
        self._closed = False

    def _close_egress(self) -> None:
        if self._egress is not None:
            self._egress.close()
            host.release_runtime_dir(self._egress.socket_path.parent)
            self._egress = None

    # -- container lifecycle -------------------------------------------------------------------

    def _new_container(self) -> Any:
        """Start a container of the task image (its reaper as PID 1) and return it."""
        limits = self.limits
        memory = f"{limits.memory_mb}m"
        container = None
        try:
            container = self._client.containers.run(
                self.image, command=["python3", "-c", _REAPER], detach=True,
                network_mode="none", cap_drop=["ALL"], cap_add=["KILL"],
                security_opt=["no-new-privileges"], mem_limit=memory, memswap_limit=memory,
                pids_limit=int(limits.pids) + 1, nano_cpus=int(limits.cpus * 1e9),
                tmpfs={"/tmp": f"size={limits.disk_mb}m,mode=1777",
                       "/dev/shm": f"size={limits.disk_mb}m,mode=1777"},
                ulimits=[{"Name": "nofile", "Soft": 1024, "Hard": 1024}],
                working_dir=WORKSPACE_MOUNT, hostname="sandbox", stop_signal="SIGTERM",
                labels={LABEL: "1", OWNER_LABEL: host.owner_token()}, mounts=self._mounts(),
            )  # fmt: skip
            container.reload()
        except Exception as error:
            if container is not None:
                _remove(container)
            raise SandboxSetupError(f"cannot start a container of {self.image}: {error}") from error
        return container

    def _mounts(self) -> list[Any]:
        """The one host path a container may see: the egress proxy's socket, where the task
        allows hosts (read-only; a socket is connected to, never written)."""
        if self._egress is None:
            return []
        import docker

        return [docker.types.Mount(SOCKET_IN_SANDBOX, str(self._egress.socket_path),
                                   type="bind", read_only=True)]  # fmt: skip

    def _adopt(self, container: Any) -> None:
        self._container = container
        self._init_pid = int(container.attrs["State"]["Pid"])
        self._oom_kills = self._read_oom_kills()

    def _start_container(self) -> None:
        self._adopt(self._new_container())

    def _close(self) -> None:
        errors: list[BaseException] = []
        container, self._container = self._container, None
        futures = list(self._pending)
        if self._spare is not None:
            try:
                futures.append(_background().submit(_remove_spare, self._spare))
            except RuntimeError:  # the interpreter is exiting (a pool closed at exit): no threads
                _remove_spare(self._spare)
            self._spare = None
        try:
            if container is not None:
                _remove(container)
        except SandboxSetupError as error:
            errors.append(error)
        for future in futures:
            try:
                future.result()
            except SandboxSetupError as error:
                errors.append(error)
        self._pending.clear()
        self._close_egress()
        if errors:
            raise errors[0]

    def reset(self) -> None:
        """Swap in a fresh container: the spare one started after the previous reset when it is
        ready (so a reset costs about an exec), a new one otherwise; the old one is removed in the
        background and `close()` waits for that."""
        self._check_open("reset")
        old, self._container = self._container, None
        if old is not None:
            self._pending.append(_background().submit(_remove, old))
        spare, self._spare = self._spare, None
        fresh = spare.result() if spare is not None else self._new_container()
        self._adopt(fresh)
        self._spare = _background().submit(self._new_container)
        done = [future for future in self._pending if future.done()]
        self._pending = [future for future in self._pending if not future.done()]
        for future in done:
            future.result()  # a failed removal surfaces here, not silently

    # -- processes -----------------------------------------------------------------------------

    def _procs_file(self) -> Path | None:
        for directory in _cgroup_dirs(self._container.id, "pids"):
            if (directory / "cgroup.procs").exists():
                return directory / "cgroup.procs"
        return None

    def _kill_commands(self) -> None:
        """Kill every process of the container but its reaper, from the host (no exec needed)."""
        procs = self._procs_file()
        for _ in range(50):
            if procs is None:
                self._exec_raw(["kill", "-9", "-1"], user="0")
                return
            try:
                pids = [int(p) for p in procs.read_text().split()]
            except OSError:
                return
            victims = [pid for pid in pids if pid != self._init_pid]
            if not victims:
                return
            for pid in victims:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def _read_oom_kills(self) -> int:
        for directory in _cgroup_dirs(self._container.id, "memory"):
            for name in ("memory.oom_control", "memory.events"):
                with contextlib.suppress(OSError):
                    for line in (directory / name).read_text().splitlines():
                        key, _, value = line.partition(" ")
                        if key == "oom_kill":
                            return int(value)
        return 0

    def _exec_raw(self, argv: Sequence[str], *, user: str = str(SANDBOX_UID),
                  env: Mapping[str, str] | None = None) -> tuple[int, bytes, bytes]:  # fmt: skip
        api = self._client.api
        exec_id = api.exec_create(self._container.id, list(argv), user=user,
                                  workdir=WORKSPACE_MOUNT, environment=dict(env or {}))["Id"]  # fmt: skip
        out, err = api.exec_start(exec_id, demux=True)
        code = api.exec_inspect(exec_id)["ExitCode"]
        return int(code if code is not None else -1), out or b"", err or b""

    def execute(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        self._check_open("execute")
        timeout_s = self._timeout_for(timeout_s)
        if isinstance(command, str):
            inner = ["/bin/sh", "-c", command]
        else:
            inner = [str(part) for part in command]
            if not inner:
                raise ValueError("execute() needs a non-empty command")
        environment = {"HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                       "PYTHONDONTWRITEBYTECODE": "1"}  # fmt: skip
        for name, value in (env or {}).items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ValueError(f"invalid environment variable name or value: {name!r}")
            environment[name] = value
        if self._egress is not None:
            environment.update(proxy_environment())
            inner = relay_argv(inner, python="python3")
        cpu_time_s = str(max(1, int(-(-self.limits.cpu_time_s // 1))))
        if stdin is not None:
            stdin_path = f"{STATE_DIR}/stdin-{secrets.token_hex(6)}"
            self._put_file(stdin_path, stdin.encode() if isinstance(stdin, str) else stdin,
                           uid=0, mode=0o444)  # fmt: skip
            argv = ["/bin/sh", "-c", _LAUNCHER_STDIN, "launcher", cpu_time_s, stdin_path, *inner]
        else:
            argv = ["/bin/sh", "-c", _LAUNCHER, "launcher", cpu_time_s, *inner]
        api = self._client.api
        started = time.monotonic()
        try:
            exec_id = api.exec_create(self._container.id, argv, user=str(SANDBOX_UID),
                                      workdir=WORKSPACE_MOUNT, environment=environment)["Id"]  # fmt: skip
            stream = api.exec_start(exec_id, stream=True, demux=True)
        except Exception as error:
            raise SandboxSetupError(f"docker exec failed: {error}") from error
        stdout = CappedBuffer(self.limits.output_bytes)
        stderr = CappedBuffer(self.limits.output_bytes)
        failure: list[BaseException] = []

        def pump() -> None:
            try:
                for out_chunk, err_chunk in stream:
                    if out_chunk:
                        stdout.append(out_chunk)
                    if err_chunk:
                        stderr.append(err_chunk)
            except Exception as error:  # the stream broke: reported below as a setup failure
                failure.append(error)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        reader.join(timeout_s)
        timed_out = reader.is_alive()
        if timed_out:
            self._kill_commands()
            reader.join(5.0)
        duration_s = time.monotonic() - started
        self._kill_commands()  # daemons and setsid children end with the call
        if failure and not timed_out:
            raise SandboxSetupError(f"reading the output of docker exec failed: {failure[0]}")
        code = api.exec_inspect(exec_id).get("ExitCode")
        exit_code = int(code) if code is not None else 137
        oom = self._read_oom_kills()
        oom_killed, self._oom_kills = oom > self._oom_kills, oom
        if timed_out and exit_code == 0:
            exit_code = 124
        return ExecResult(
            exit_code=exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            duration_s=duration_s,
            timed_out=timed_out,
            oom_killed=oom_killed,
            output_truncated=stdout.truncated or stderr.truncated,
        )

    # -- files ---------------------------------------------------------------------------------

    def _relative(self, path: str) -> str:
        relative = path
        if posixpath.isabs(path):
            if not (path == WORKSPACE_MOUNT or path.startswith(WORKSPACE_MOUNT + "/")):
                raise WorkspacePathError(f"{path!r} is outside the workspace {WORKSPACE_MOUNT}")
            relative = path[len(WORKSPACE_MOUNT) :].lstrip("/")
        normal = posixpath.normpath(relative or ".")
        if normal == ".." or normal.startswith("../"):
            raise WorkspacePathError(f"{path!r} resolves outside the workspace (through '..')")
        return normal

    def _resolve(self, path: str, mode: str) -> tuple[int, bytes, bytes]:
        relative = self._relative(path)
        code, out, err = self._exec_raw(
            ["/bin/sh", "-c", _RESOLVE, "resolve", f"{WORKSPACE_MOUNT}/{relative}", mode]
        )
        if code == 3:
            raise WorkspacePathError(
                f"{path!r} resolves outside the workspace (through '..' or a symlink)"
            )
        if code == 4:
            raise IsADirectoryError(f"{path!r} is a directory in the workspace")
        if code == 5:
            raise FileNotFoundError(f"no file {path!r} in the workspace")
        if code == 6:
            raise WorkspacePathError(f"{path!r} is not a regular file (a FIFO, socket or device)")
        if code != 0:
            raise SandboxSetupError(f"cannot resolve {path!r}: {err.decode(errors='replace')}")
        return code, out, err

    def read_file(self, path: str) -> bytes:
        self._check_open("read_file")
        return self._resolve(path, "read")[1]

    def _put_file(self, target: str, data: bytes, *, uid: int = SANDBOX_UID,
                  mode: int = 0o644) -> None:  # fmt: skip
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as archive:
            info = tarfile.TarInfo(posixpath.basename(target))
            info.size, info.uid, info.gid, info.mode = len(data), uid, uid, mode
            info.mtime = int(time.time())
            archive.addfile(info, io.BytesIO(data))
        buffer.seek(0)
        if not self._container.put_archive(posixpath.dirname(target), buffer):
            raise SandboxSetupError(f"cannot write {target} into the container")

    def write_file(self, path: str, data: str | bytes) -> None:
        self._check_open("write_file")
        if self._relative(path) == ".":
            raise WorkspacePathError(f"{path!r} is the workspace itself, not a file")
        resolved = self._resolve(path, "write")[1].decode()
        self._put_file(resolved, data.encode() if isinstance(data, str) else data)

    # -- diff ----------------------------------------------------------------------------------

    def diff(self) -> WorkspaceDiff:
        self._check_open("diff")
        prefix = WORKSPACE_MOUNT + "/"
        changes = self._container.diff() or []
        paths = sorted({c["Path"][len(prefix) :] for c in changes if c["Path"].startswith(prefix)})
        if not paths:
            return WorkspaceDiff()
        code, out, _ = self._exec_raw(["/bin/sh", "-c", _DESCRIBE, "describe", *paths])
        if code != 0:
            raise SandboxSetupError("cannot describe the changed workspace files")
        described = out.decode("utf-8", "surrogateescape").splitlines()
        added: set[str] = set()
        modified: set[str] = set()
        deleted: set[str] = set()

        def lower_files(relative: str) -> list[str]:
            base = self._lower / relative
            if base.is_symlink() or base.is_file():
                return [relative]
            found = []
            for dirpath, _, filenames in os.walk(base):
                for name in filenames:
                    found.append((Path(dirpath) / name).relative_to(self._lower).as_posix())
            return found

        for relative, line in zip(paths, described, strict=True):
            lower = self._lower / relative
            kind, _, rest = line.partition(" ")
            if kind == "D":
                if lower.is_symlink() or lower.is_file():
                    deleted.add(relative)  # a file replaced by a directory
                continue
            if kind == "-":
                deleted.update(lower_files(relative) if lower.exists() or lower.is_symlink()
                               else [])  # fmt: skip
                continue
            if lower.is_symlink() or lower.is_file():
                if not self._same(lower, kind, rest):
                    modified.add(relative)
            else:
                if lower.is_dir():
                    deleted.update(lower_files(relative))
                added.add(relative)
        return WorkspaceDiff(
            added=tuple(sorted(added)),
            modified=tuple(sorted(modified)),
            deleted=tuple(sorted(deleted - added - modified)),
        )

    @staticmethod
    def _same(lower: Path, kind: str, rest: str) -> bool:
        if lower.is_symlink():
            return kind == "L" and os.readlink(lower) == rest
        if kind != "F":
            return False
        mode_text, _, digest = rest.partition(" ")
        executable = bool(int(mode_text, 8) & 0o111)
        if executable != bool(lower.stat().st_mode & 0o111):
            return False
        with lower.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest() == digest
