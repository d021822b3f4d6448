"""The Docker backend, for tasks that ship an image: a warm container per sandbox, commands by
`exec` (~0.1 s each, against ~0.5 s for `docker run`).

Images (base -> family -> task layers, built once per content) are in `sandboxes.docker_images`.
The container has no network, drops every capability but KILL (used only by its reaper), runs
commands as uid 1000, and has memory (swap included), pids and CPU limits; a CPU-time rlimit and
a wall timeout bound each command, and every process a command started is killed when it returns.
Reset replaces the container with a fresh one from the task image (cost independent of the
workspace size); containers are labelled with their owner and always removed.

Limits.disk_mb bounds /tmp (a tmpfs). The workspace lives in the container's writable layer,
which overlay2 cannot cap without project quotas (xfs + pquota): size it in the engine config.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import posixpath
import secrets
import signal
import tarfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from sandboxes import host
from sandboxes.base import (
    INLINE_COMMAND_MAX_BYTES,
    WORKSPACE_MOUNT,
    ExecResult,
    FileEnds,
    Limits,
    Sandbox,
    WorkspaceDiff,
    argv_over_kernel_limit,
    argv_too_long_result,
    command_refusal,
    refused_command,
)
from sandboxes.docker_images import (
    LABEL,
    OWNER_LABEL,
    SANDBOX_UID,
    STATE_DIR,
    base_image,
    image_id,
    shared_client,
    snapshot_image,
)
from sandboxes.egress import SOCKET_IN_SANDBOX, EgressProxy, proxy_environment, relay_argv
from sandboxes.errors import (
    SandboxSetupError,
    SandboxUnavailableError,
    WorkspacePathError,
)
from sandboxes.output import CappedBuffer
from sandboxes.snapshot import DIGEST_PREFIX, TreeBounds, prepare_snapshot

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
    'if [ "$2" = read ] || [ "$2" = ends ]; then [ -d "$p" ] && exit 4; [ -e "$p" ] || exit 5; '
    '[ -f "$p" ] || exit 6; [ -r "$p" ] || exit 9; [ "$2" = read ] && exec cat -- "$p"; '
    # ends: the size, then the file if it fits in $3 bytes, else its first and last $3 bytes
    # (tail seeks: the middle is never read)
    'n=$(stat -c %s -- "$p") || exit 8; echo "$n"; [ "$n" -le "$3" ] && exec cat -- "$p"; '
    'head -c "$3" -- "$p" && exec tail -c "$3" -- "$p"; fi; '
    '[ -d "$p" ] && exit 4; mkdir -p -- "$(dirname -- "$p")" || exit 7; printf %s "$p"'
)
# Describes each changed path of the NUL-separated list in the file $1, as one JSON list: the
# list travels in a file and names in JSON, so no count, length or byte of names can break it.
_DESCRIBE = (
    "import hashlib, json, os, stat, sys\n"
    "def describe(path):\n"
    "    try:\n"
    "        st = os.lstat(path)\n"
    "    except OSError:\n"
    "        return ['-']\n"
    "    if stat.S_ISLNK(st.st_mode):\n"
    "        return ['L', os.fsdecode(os.readlink(path))]\n"
    "    if stat.S_ISDIR(st.st_mode):\n"
    "        return ['D']\n"
    "    if not stat.S_ISREG(st.st_mode):\n"
    "        return ['-']\n"  # a FIFO, socket or device node: no candidate carries one
    "    mode, digest = '%o' % stat.S_IMODE(st.st_mode), hashlib.sha256()\n"
    "    try:\n"
    "        with open(path, 'rb') as handle:\n"
    "            for chunk in iter(lambda: handle.read(1 << 20), b''):\n"
    "                digest.update(chunk)\n"
    "    except OSError:\n"
    "        return ['F', mode, '']\n"  # unreadable (its mode): changed; reading it is refused
    "    return ['F', mode, digest.hexdigest()]\n"
    "names = open(sys.argv[1], 'rb').read().split(b'\\0')\n"
    "json.dump([describe(os.fsdecode(name)) for name in names], sys.stdout)\n"
)


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
        client = shared_client()
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
        self._client = client or shared_client()
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
            both = f"{image_id(self._client, image)}\n{prepared.digest}".encode()
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
        if (refusal := command_refusal(command)) is not None:
            return refused_command(refusal)
        if isinstance(command, str) and len(script := os.fsencode(command)) > (
            INLINE_COMMAND_MAX_BYTES
        ):
            # Too long for a command line: the shell reads it from a file instead.
            script_path = f"{STATE_DIR}/command-{secrets.token_hex(6)}.sh"
            self._put_file(script_path, script, uid=0, mode=0o444)
            inner = ["/bin/sh", script_path]
        elif isinstance(command, str):
            inner = ["/bin/sh", "-c", command]
        else:
            inner = [str(part) for part in command]
            if not inner:
                raise ValueError("execute() needs a non-empty command")
            if argv_over_kernel_limit(inner):
                return argv_too_long_result(inner)
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

    def _resolve(self, path: str, mode: str, *args: str) -> tuple[int, bytes, bytes]:
        relative = self._relative(path)
        code, out, err = self._exec_raw(
            ["/bin/sh", "-c", _RESOLVE, "resolve", f"{WORKSPACE_MOUNT}/{relative}", mode, *args]
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
        if code == 9:  # a mode the command set: commands and reads here run as the same uid
            raise PermissionError(f"{path!r} is not readable: its mode denies reading")
        if code != 0:
            raise SandboxSetupError(f"cannot resolve {path!r}: {err.decode(errors='replace')}")
        return code, out, err

    def read_file(self, path: str) -> bytes:
        self._check_open("read_file")
        return self._resolve(path, "read")[1]

    def read_file_ends(self, path: str, *, max_bytes: int) -> FileEnds:
        self._check_open("read_file_ends")
        FileEnds.plan(0, max_bytes)
        out = self._resolve(path, "ends", str(max_bytes))[1]
        size_text, _, rest = out.partition(b"\n")
        size_bytes = int(size_text)
        # `rest` is the first and the last min(size, max_bytes) bytes: keep what the plan keeps.
        read_bytes = min(size_bytes, max_bytes)
        head_bytes, tail_bytes = FileEnds.plan(size_bytes, max_bytes)
        tail = rest[read_bytes:]
        return FileEnds(rest[:head_bytes], tail[len(tail) - tail_bytes :] if tail_bytes else b"",
                        size_bytes)  # fmt: skip

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
        listing = f"{STATE_DIR}/changed-{secrets.token_hex(6)}"
        names = b"\0".join(os.fsencode(f"{prefix}{path}") for path in paths)
        self._put_file(listing, names, uid=0, mode=0o444)
        code, out, err = self._exec_raw(["python3", "-c", _DESCRIBE, listing])
        if code != 0:
            raise SandboxSetupError(
                f"cannot describe the changed workspace files: {err.decode(errors='replace')[:300]}"
            )
        described = json.loads(out)
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

        for relative, (kind, *rest) in zip(paths, described, strict=True):
            lower = self._lower / relative
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
    def _same(lower: Path, kind: str, rest: Sequence[str]) -> bool:
        if lower.is_symlink():
            return kind == "L" and [os.readlink(lower)] == list(rest)
        if kind != "F":
            return False
        mode_text, digest = rest
        executable = bool(int(mode_text, 8) & 0o111)
        if executable != bool(lower.stat().st_mode & 0o111):
            return False
        with lower.open("rb") as handle:
            return hashlib.file_digest(handle, "sha256").hexdigest() == digest
