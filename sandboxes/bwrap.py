"""The bubblewrap backend, rollyard's embedded default: ~8 ms per sandboxed command.

Isolation, from the outside in:
- cgroup per sandbox: memory (swap included), pids, CPU bandwidth; every process is killed
  through it at the end of each `execute`, so daemons and `setsid` children never outlive a call;
- an unprivileged host uid (`setpriv`), then bwrap with every namespace unshared (no network but
  its own loopback, own PIDs, own mounts; a task that lists hosts reaches them only through the
  egress proxy's socket, `sandboxes.egress`), no capabilities, nested user namespaces disabled, a
  cleared environment and a seccomp filter;
- an allowlisted root: system directories and the Python runtime read-only, the workspace as the
  only writable place besides a size-limited /tmp; nothing of the host's home, /tmp or project;
- a copy-on-write workspace: overlayfs with the pristine snapshot as lower layer and a size-limited
  tmpfs as upper layer. Reset drops the tmpfs (cost independent of the snapshot's size); the upper
  layer *is* the diff;
- a supervisor process per owner (`sandboxes.supervisor`) that tears down the owner's sandboxes
  when it dies, SIGKILL included.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import os
import secrets
import selectors
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from sandboxes import host, supervisor
from sandboxes.base import (
    INLINE_COMMAND_MAX_BYTES,
    WORKSPACE_MOUNT,
    ExecResult,
    FileEnds,
    Limits,
    Sandbox,
    WorkspaceDiff,
    argv_too_long_result,
    command_refusal,
    refused_command,
)
from sandboxes.cgroups import SandboxCgroup
from sandboxes.egress import SOCKET_IN_SANDBOX, EgressProxy, proxy_environment, relay_argv
from sandboxes.errors import SandboxError, SandboxSetupError, WorkspacePathError
from sandboxes.output import CappedBuffer
from sandboxes.snapshot import (
    SnapshotCache,
    TreeBounds,
    default_cache_budget_bytes,
    prepare_snapshot,
    same_entry,
)

SANDBOX_UID = 1000
"""The uid commands see inside (mapped to `host.SANDBOX_HOST_UID` outside)."""

SANDBOX_PATH = "/usr/local/bin:/usr/bin:/bin"

SCRIPT_IN_SANDBOX = "/run/rollyard/command.sh"
"""Where a string command too long for a command line is, read-only, for `/bin/sh` to run."""

# Runs as root for a millisecond: joins the cgroup (so every descendant is accounted and killable
# from the first instruction), sets the CPU-time rlimit, then execs setpriv -> bwrap. It starts
# with an empty environment in `/`, and drops the PWD the shell itself sets: bwrap becomes PID 1
# inside the sandbox, where its environment and command line are readable (/proc/1/environ,
# /proc/1/cmdline), so neither may carry anything of the host.
_LAUNCHER = (
    "unset PWD OLDPWD; "
    'cpu=$1; shift; while [ "$1" != "--" ]; do echo $$ > "$1" || exit 125; shift; done; shift; '
    'ulimit -t "$cpu" || exit 125; exec "$@"'
)
# The same, in a private mount namespace of its own (`unshare`), where it also binds its
# sandbox's directory to the layout's `command` directory and drops every sandbox's mounts with
# one lazy unmount of `live` (`host.isolate_live_mounts`; where `live` is no mount point that
# unmount fails and changes nothing) before it execs.
_ISOLATING_LAUNCHER = _LAUNCHER.replace(
    'exec "$@"',
    '"$1" --rbind "$3" "$4" || exit 125; "$2" --lazy "$5" 2>/dev/null; shift 5; exec "$@"',
)
ISOLATE_FROM_OTHER_SANDBOXES = 2
"""Other open sandboxes from which a command's launcher hides their mounts from bwrap. bwrap
walks the whole mount table (~0.7 ms a mount, 4 mounts a sandbox); hiding them costs three
more program starts (`unshare`, `mount`, `umount`, ~4 ms). With one other sandbox open the walk
is cheaper; from two on, the hiding."""


@functools.cache
def _sweep_once(root: Path) -> None:
    host.sweep_orphans(host.HostLayout(root))


@functools.cache
def _system_layout_args() -> tuple[str, ...]:
    args = ["--tmpfs", "/"]
    for top in ("usr", "etc", "bin", "lib", "lib64", "lib32", "libx32", "sbin"):
        path = Path("/") / top
        if path.is_symlink():
            args += ["--symlink", os.readlink(path), str(path)]
        elif path.is_dir():
            args += ["--ro-bind", str(path), str(path)]
    return tuple(args)


@functools.cache
def _python_bin_dir() -> str:
    return str(Path(sys.executable).parent)


def _read_child_started(status_fd: int) -> bool:
    """Whether bwrap's status stream says it got as far as starting the command."""
    os.set_blocking(status_fd, False)
    chunks = []
    try:
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(status_fd, 1 << 16):
                chunks.append(chunk)
    finally:
        os.close(status_fd)
    return b'"child-pid"' in b"".join(chunks)


class BwrapSandbox(Sandbox):
    """A sandbox over `snapshot` built from bubblewrap, cgroups and a host-side overlay.

    One thread uses a sandbox at a time; many sandboxes can be open at once.
    """

    backend_name = "bwrap"

    def __init__(self, snapshot: Path, *, limits: Limits | None = None,
                 layout: host.HostLayout | None = None) -> None:  # fmt: skip
        limits = limits or Limits()
        self._bwrap = host.check_host()
        self._layout = layout or host.host_layout()
        _sweep_once(self._layout.root)
        supervisor.ensure_supervisor(self._layout)
        prepared = prepare_snapshot(
            Path(snapshot), self._layout.snapshots, owner_uid=host.SANDBOX_HOST_UID,
            bounds=TreeBounds.of(limits), cache_budget_bytes=default_cache_budget_bytes(),
        )  # fmt: skip
        super().__init__(Path(snapshot), prepared.digest, limits)
        self._closed = True  # until fully built: a failed __init__ must not run _close twice
        self._lower = prepared.lower_dir
        self.sandbox_id = f"{host.owner_token()}-{secrets.token_hex(6)}"
        self._dir = self._layout.live / self.sandbox_id
        self._layer = self._dir / "layer"
        self._merged = self._dir / "merged"
        self._cgroup: SandboxCgroup | None = None
        self._egress: EgressProxy | None = None
        try:
            for directory in (self._layout.root, self._layout.live, self._layout.command):
                directory.mkdir(mode=0o711, exist_ok=True)
                directory.chmod(0o711)  # bwrap runs as the sandbox uid and must traverse here
            host.isolate_live_mounts(self._layout)
            self._dir.mkdir(mode=0o711)
            self._dir.chmod(0o711)
            self._layer.mkdir()
            self._merged.mkdir()
            self._cgroup = SandboxCgroup(
                self.sandbox_id, memory_mb=limits.memory_mb, pids=limits.pids, cpus=limits.cpus
            )
            self._mount_runtime()
            self._mount_workspace()
            if limits.allowed_hosts:
                self._egress = EgressProxy(self._dir / "egress.sock", limits.allowed_hosts)
        except BaseException:
            self._release()
            raise
        self._closed = False

    # -- workspace layers ----------------------------------------------------------------------

    def _mount_runtime(self) -> None:
        # The interpreter may live where the sandbox uid cannot traverse (a 0700 home): bind it
        # from the host side into this sandbox's directory, which bwrap then binds read-only.
        for index, runtime in enumerate(host.python_runtime_dirs()):
            target = self._dir / "runtime" / str(index)
            target.mkdir(parents=True)
            host.bind_mount(runtime, target)

    def _mount_workspace(self) -> None:
        uid = host.SANDBOX_HOST_UID
        host.mount("rollyard-layer", self._layer, "tmpfs",
                   f"size={self.limits.disk_mb}m,mode=0700")  # fmt: skip
        upper, work = self._layer / "upper", self._layer / "work"
        upper.mkdir()
        work.mkdir()
        os.chown(upper, uid, uid)
        # redirect_dir/metacopy off: the upper layer stays a plain tree of changed files,
        # which is what diff() reads.
        host.mount(
            "rollyard-workspace", self._merged, "overlay",
            f"lowerdir={self._lower},upperdir={upper},workdir={work},"
            "redirect_dir=off,metacopy=off,index=off",
        )  # fmt: skip

    def _unmount_workspace(self) -> None:
        host.umount(self._merged)
        host.umount(self._layer)

    def reset(self) -> None:
        self._check_open("reset")
        assert self._cgroup is not None
        self._cgroup.kill_all()
        # In use again: the cache must not take the lower layer while it is not mounted.
        SnapshotCache(self._layout.snapshots).touch(self._lower.name)
        self._unmount_workspace()
        self._mount_workspace()

    # -- commands --------------------------------------------------------------------------------

    def _command_argv(self, command: str | Sequence[str], env: Mapping[str, str] | None,
                      seccomp_fd: int, status_fd: int, args_fd: int, cpu_time_s: int,
                      script_fd: int | None = None) -> list[str]:  # fmt: skip
        """The launcher's argv; bwrap's options (host paths among them) are written to
        `args_fd` and read by bwrap from there (`--args`), so they are not on its command line.
        With `script_fd`, the shell runs the script it holds instead of `command`."""
        assert self._cgroup is not None
        if script_fd is not None:
            inner = ["/bin/sh", SCRIPT_IN_SANDBOX]
        elif isinstance(command, str):
            inner = ["/bin/sh", "-c", command]
        else:
            inner = [str(part) for part in command]
            if not inner:
                raise ValueError("execute() needs a non-empty command")
        environment = {
            "PATH": f"{_python_bin_dir()}:{SANDBOX_PATH}",
            "HOME": "/tmp",
            "TMPDIR": "/tmp",
            "LANG": "C.UTF-8",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        for name, value in (env or {}).items():
            if not name or "=" in name or "\0" in name or "\0" in value:
                raise ValueError(f"invalid environment variable name or value: {name!r}")
            environment[name] = value
        if self._egress is not None:
            # The only way out: the relay on the sandbox's loopback to the host's proxy socket.
            environment.update(proxy_environment())
            inner = relay_argv(inner)
        bwrap = [
            self._bwrap, "--unshare-all", "--unshare-user", "--disable-userns",
            "--die-with-parent", "--new-session", "--cap-drop", "ALL",
            "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID), "--hostname", "sandbox",
            *_system_layout_args(),
        ]  # fmt: skip
        bwrap += [
            # /dev is a tmpfs bwrap leaves writable and unsized: make it read-only (device nodes
            # still work) and give /dev/shm the same size limit as /tmp.
            "--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev",
            "--size", str(self.limits.disk_mb << 20), "--tmpfs", "/dev/shm",
            "--size", str(self.limits.disk_mb << 20), "--tmpfs", "/tmp",
        ]  # fmt: skip
        # After /tmp: an interpreter or venv that lives under /tmp on the host must be bound on
        # top of the sandbox's fresh /tmp, not hidden by it.
        # With other sandboxes open, the launcher binds this sandbox's directory to `command`
        # in a mount namespace of its own (see ISOLATE_FROM_OTHER_SANDBOXES): bwrap's paths
        # to it go through there.
        isolate = self._other_open_sandboxes() >= ISOLATE_FROM_OTHER_SANDBOXES
        sandbox_dir = self._layout.command if isolate else self._dir
        for index, runtime in enumerate(host.python_runtime_dirs()):
            bwrap += ["--ro-bind", str(sandbox_dir / "runtime" / str(index)), str(runtime)]
        if self._egress is not None:
            socket_name = self._egress.socket_path.relative_to(self._dir)
            bwrap += ["--ro-bind", str(sandbox_dir / socket_name), SOCKET_IN_SANDBOX]
        bwrap += [
            "--bind", str(sandbox_dir / self._merged.name), WORKSPACE_MOUNT,
            "--chdir", WORKSPACE_MOUNT,
        ]  # fmt: skip
        if script_fd is not None:
            bwrap += ["--ro-bind-data", str(script_fd), SCRIPT_IN_SANDBOX]
        bwrap += ["--remount-ro", "/", "--clearenv"]
        for name, value in environment.items():
            bwrap += ["--setenv", name, value]
        bwrap += ["--seccomp", str(seccomp_fd), "--json-status-fd", str(status_fd)]
        options = b"".join(os.fsencode(option) + b"\0" for option in bwrap[1:])
        os.write(args_fd, options)
        os.lseek(args_fd, 0, os.SEEK_SET)
        uid = str(host.SANDBOX_HOST_UID)
        setpriv = [host.tool_path("setpriv"), f"--reuid={uid}", f"--regid={uid}", "--clear-groups"]
        procs = [str(p) for p in self._cgroup.procs_files]
        if not isolate:
            return ["/bin/sh", "-c", _LAUNCHER, "launcher", str(cpu_time_s), *procs, "--",
                    *setpriv, bwrap[0], "--args", str(args_fd), "--", *inner]  # fmt: skip
        private_mounts = [host.tool_path("unshare"), "--mount", "--propagation", "private"]
        detach = [host.tool_path("mount"), host.tool_path("umount"), str(self._dir),
                  str(sandbox_dir), str(self._layout.live)]  # fmt: skip
        return [*private_mounts, "/bin/sh", "-c", _ISOLATING_LAUNCHER, "launcher",
                str(cpu_time_s), *procs, "--", *detach, *setpriv, bwrap[0], "--args",
                str(args_fd), "--", *inner]  # fmt: skip

    def _other_open_sandboxes(self) -> int:
        """Sandboxes of this host layout open besides this one (their directories in `live`)."""
        try:
            with os.scandir(self._layout.live) as entries:
                return sum(1 for entry in entries if entry.name != self.sandbox_id)
        except OSError:
            return 0

    def execute(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: str | bytes | None = None,
        env: Mapping[str, str] | None = None,
    ) -> ExecResult:
        self._check_open("execute")
        assert self._cgroup is not None
        timeout_s = self._timeout_for(timeout_s)
        if (refusal := command_refusal(command)) is not None:
            return refused_command(refusal)
        cpu_time_s = max(1, int(-(-self.limits.cpu_time_s // 1)))
        seccomp_fd = host.seccomp_fd()
        status_read, status_write = os.pipe()
        # A memfd, not a pipe: the options can outgrow a pipe's buffer, and nothing reads them
        # before bwrap starts.
        args_fd = os.memfd_create("bwrap-args")
        script_fd = _script_fd(command)
        try:
            argv = self._command_argv(command, env, seccomp_fd, status_write, args_fd, cpu_time_s,
                                      script_fd)  # fmt: skip
            with contextlib.ExitStack() as stack:
                stdin_file: int = subprocess.DEVNULL
                if stdin is not None:
                    data = stdin.encode() if isinstance(stdin, str) else stdin
                    spool = stack.enter_context(tempfile.TemporaryFile())
                    spool.write(data)
                    spool.flush()
                    # Hand the sandbox a read-only descriptor: the spool itself is open for
                    # writing, and a command could write through fd 0 into the host's /tmp,
                    # past every disk limit.
                    stdin_fd = os.open(f"/proc/self/fd/{spool.fileno()}", os.O_RDONLY)
                    stack.callback(os.close, stdin_fd)
                    stdin_file = stdin_fd
                started = time.monotonic()
                try:
                    process = subprocess.Popen(
                        argv, stdin=stdin_file, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                        env={}, cwd="/", start_new_session=True,
                        pass_fds=(seccomp_fd, status_write, args_fd,
                                  *(() if script_fd is None else (script_fd,))),
                    )  # fmt: skip
                except OSError as error:
                    os.close(status_read)
                    if error.errno == errno.E2BIG:  # the caller's argument list, not the host
                        return argv_too_long_result(
                            [command] if isinstance(command, str) else command
                        )
                    raise SandboxSetupError(f"cannot start bwrap: {error}") from error
        finally:
            os.close(seccomp_fd)
            os.close(status_write)
            os.close(args_fd)
            if script_fd is not None:
                os.close(script_fd)
        stdout, stderr, timed_out = self._collect(process, timeout_s, started)
        child_started = _read_child_started(status_read)
        duration_s = time.monotonic() - started
        returncode = process.returncode
        exit_code = returncode if returncode >= 0 else 128 - returncode
        self._cgroup.kill_all()  # daemons and setsid children end with the call
        oom_killed = self._cgroup.take_oom_kills() > 0
        if not child_started and not timed_out:
            # bwrap reports the child's pid once the sandbox is built; without it the failure
            # is the host's, whatever the command would have done.
            raise SandboxSetupError(
                f"the sandbox could not start the command (exit {exit_code}): "
                f"{stderr.text().strip()[:500]}"
            )
        return ExecResult(
            exit_code=exit_code if not timed_out else 124 if exit_code == 0 else exit_code,
            stdout=stdout.text(),
            stderr=stderr.text(),
            duration_s=duration_s,
            timed_out=timed_out,
            oom_killed=oom_killed,
            output_truncated=stdout.truncated or stderr.truncated,
        )

    def _collect(self, process: subprocess.Popen[bytes], timeout_s: float,
                 started: float) -> tuple[CappedBuffer, CappedBuffer, bool]:  # fmt: skip
        assert process.stdout is not None and process.stderr is not None
        assert self._cgroup is not None
        stdout = CappedBuffer(self.limits.output_bytes)
        stderr = CappedBuffer(self.limits.output_bytes)
        buffers = {process.stdout.fileno(): stdout, process.stderr.fileno(): stderr}
        deadline = started + timeout_s
        timed_out = False
        with selectors.DefaultSelector() as selector:
            for stream in (process.stdout, process.stderr):
                os.set_blocking(stream.fileno(), False)
                selector.register(stream.fileno(), selectors.EVENT_READ)
            while selector.get_map():
                remaining = deadline - time.monotonic()
                if remaining <= 0 and not timed_out:
                    timed_out = True
                    self._cgroup.kill_all()
                    # everything is dead now: the pipes close; drain what is left quickly
                    deadline = time.monotonic() + 5.0
                    continue
                if remaining <= 0:
                    break  # a pipe held open by something outside the cgroup: stop reading
                for key, _ in selector.select(timeout=min(remaining, 1.0)):
                    fd = key.fd
                    try:
                        chunk = os.read(fd, 1 << 16)
                    except BlockingIOError:
                        continue
                    if chunk:
                        buffers[fd].append(chunk)
                    else:
                        selector.unregister(fd)
        process.stdout.close()
        process.stderr.close()
        try:
            process.wait(timeout=max(0.1, deadline - time.monotonic()) if not timed_out else 5)
        except subprocess.TimeoutExpired:
            timed_out = True
            self._cgroup.kill_all()
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            process.wait()
        return stdout, stderr, timed_out

    # -- files ------------------------------------------------------------------------------------

    def _resolve(self, path: str) -> Path:
        """Host path of a workspace path, refusing anything that leaves the workspace. Symlinks
        are resolved here, on the host, so an absolute link would point into the host's root:
        those are refused too. Nothing runs inside between calls, so the check cannot race."""
        relative = path
        if os.path.isabs(relative):
            if relative != WORKSPACE_MOUNT and not relative.startswith(WORKSPACE_MOUNT + "/"):
                raise WorkspacePathError(
                    f"{path!r} is outside the workspace; give a path relative to it or under "
                    f"{WORKSPACE_MOUNT}"
                )
            relative = relative[len(WORKSPACE_MOUNT) :].lstrip("/")
        root = os.path.realpath(self._merged)
        try:
            candidate = os.path.realpath(os.path.join(root, relative))
        except OSError as error:  # e.g. a link into /proc/1/root: resolving it is refused
            raise WorkspacePathError(
                f"{path!r} cannot be resolved inside the workspace: {error.strerror}"
            ) from None
        if candidate != root and not candidate.startswith(root + os.sep):
            raise WorkspacePathError(
                f"{path!r} resolves outside the workspace (through '..' or a symlink)"
            )
        return Path(candidate)

    def _open_regular(self, path: str) -> tuple[int, os.stat_result]:
        """A read-only descriptor of a regular workspace file, and its `fstat`."""
        target = self._resolve(path)
        try:
            # O_NONBLOCK: a FIFO the command left behind would otherwise hang the caller.
            fd = os.open(target, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            raise FileNotFoundError(f"no file {path!r} in the workspace") from None
        except OSError as error:
            if error.errno == errno.ENXIO:  # a socket
                raise WorkspacePathError(f"{path!r} is not a regular file (a socket)") from None
            raise
        try:
            st = os.fstat(fd)
            _require_regular(path, st)
        except BaseException:
            os.close(fd)
            raise
        os.set_blocking(fd, True)
        return fd, st

    def read_file(self, path: str) -> bytes:
        self._check_open("read_file")
        fd, _ = self._open_regular(path)
        with os.fdopen(fd, "rb") as handle:
            return handle.read(self.limits.disk_mb << 20)

    def read_file_ends(self, path: str, *, max_bytes: int) -> FileEnds:
        self._check_open("read_file_ends")
        FileEnds.plan(0, max_bytes)
        fd, st = self._open_regular(path)
        try:
            # Nothing runs in the sandbox between calls: the stat'ed size holds while we read.
            head_bytes, tail_bytes = FileEnds.plan(st.st_size, max_bytes)
            head = os.pread(fd, head_bytes, 0) if head_bytes else b""
            tail = os.pread(fd, tail_bytes, st.st_size - tail_bytes) if tail_bytes else b""
        finally:
            os.close(fd)
        return FileEnds(head, tail, st.st_size)

    def write_file(self, path: str, data: str | bytes) -> None:
        self._check_open("write_file")
        target = self._resolve(path)
        if target == Path(os.path.realpath(self._merged)):
            raise WorkspacePathError(f"{path!r} is the workspace itself, not a file")
        payload = data.encode() if isinstance(data, str) else data
        uid = host.SANDBOX_HOST_UID
        missing: list[Path] = []
        parent = target.parent
        while not parent.exists():
            missing.append(parent)
            parent = parent.parent
        try:
            for directory in reversed(missing):
                directory.mkdir()
                os.chown(directory, uid, uid)
            # O_NONBLOCK: opening a FIFO for writing would block until a reader came.
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK
                         | os.O_CLOEXEC, 0o644)  # fmt: skip
            try:
                _require_regular(path, os.fstat(fd))
            except BaseException:
                os.close(fd)
                raise
            os.set_blocking(fd, True)
            with os.fdopen(fd, "wb") as handle:
                os.ftruncate(fd, 0)
                handle.write(payload)
                os.fchown(fd, uid, uid)  # so commands inside can edit it later
        except OSError as error:
            if error.errno == errno.EISDIR:
                raise IsADirectoryError(f"{path!r} is a directory in the workspace") from None
            if error.errno == errno.ENXIO:  # a socket, or a FIFO without a reader
                raise WorkspacePathError(
                    f"{path!r} is not a regular file (a FIFO or socket)"
                ) from None
            if error.errno == errno.ENOSPC:  # the workspace disk limit
                raise SandboxError(
                    f"writing {path!r} exceeds the workspace disk limit of {self.limits.disk_mb} MB"
                ) from error
            raise

    # -- diff ---------------------------------------------------------------------------------

    def diff(self) -> WorkspaceDiff:
        self._check_open("diff")
        upper = self._layer / "upper"
        added: set[str] = set()
        modified: set[str] = set()
        deleted: set[str] = set()

        def lower_files_under(relative: str) -> list[str]:
            base = self._lower / relative
            if not base.is_dir() or base.is_symlink():
                return [relative] if base.exists() or base.is_symlink() else []
            found = []
            for dirpath, _, filenames in os.walk(base):
                for name in filenames:
                    found.append((Path(dirpath) / name).relative_to(self._lower).as_posix())
            return found

        for dirpath, dirnames, filenames in os.walk(upper):
            here = Path(dirpath)
            relative_dir = here.relative_to(upper).as_posix()
            if relative_dir != "." and _is_opaque(here):
                present = {(here / n).relative_to(upper).as_posix() for n in filenames}
                for name in lower_files_under(relative_dir):
                    if name not in present and not (upper / name).exists():
                        deleted.add(name)
            for name in [*filenames, *dirnames]:
                entry = here / name
                relative = entry.relative_to(upper).as_posix()
                st = entry.lstat()
                lower = self._lower / relative
                if stat.S_ISCHR(st.st_mode) and st.st_rdev == 0:  # whiteout: deleted
                    deleted.update(lower_files_under(relative))
                    continue
                if stat.S_ISDIR(st.st_mode):
                    if lower.exists() and not lower.is_dir():
                        deleted.add(relative)  # a file replaced by a directory
                    continue
                if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
                    # A FIFO, socket or device node the command made: no candidate carries one,
                    # so it is left out, and what of the snapshot it replaced is gone.
                    deleted.update(lower_files_under(relative))
                    continue
                if lower.is_symlink() or lower.is_file():
                    if not same_entry(lower, lower.lstat(), entry, st):
                        modified.add(relative)
                else:
                    if lower.is_dir():
                        deleted.update(lower_files_under(relative))
                    added.add(relative)
        return WorkspaceDiff(
            added=tuple(sorted(added)),
            modified=tuple(sorted(modified)),
            deleted=tuple(sorted(deleted - added)),
        )

    # -- teardown -----------------------------------------------------------------------------

    def _close(self) -> None:
        self._release()

    def _release(self) -> None:
        errors: list[BaseException] = []
        if self._egress is not None:
            self._egress.close()
        if self._cgroup is not None:
            try:
                self._cgroup.remove()
            except (OSError, SandboxError) as error:
                errors.append(error)
        try:
            host.release_runtime_dir(self._dir)
        except (OSError, SandboxError) as error:
            errors.append(error)
        if errors:
            raise SandboxSetupError(f"cleanup of sandbox {self.sandbox_id} failed: {errors[0]}")


def _script_fd(command: str | Sequence[str]) -> int | None:
    """A memfd holding `command` when it is a string too long for the shell's command line
    (`INLINE_COMMAND_MAX_BYTES`); bwrap copies it into the sandbox as `SCRIPT_IN_SANDBOX`."""
    if not isinstance(command, str):
        return None
    script = os.fsencode(command)
    if len(script) <= INLINE_COMMAND_MAX_BYTES:
        return None
    fd = os.memfd_create("command", os.MFD_CLOEXEC)
    try:
        view = memoryview(script)
        while view:
            view = view[os.write(fd, view) :]
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd


def _require_regular(path: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        raise IsADirectoryError(f"{path!r} is a directory in the workspace")
    if not stat.S_ISREG(st.st_mode):
        raise WorkspacePathError(f"{path!r} is not a regular file (a FIFO, socket or device)")


def _is_opaque(directory: Path) -> bool:
    try:
        return os.getxattr(directory, "trusted.overlay.opaque", follow_symlinks=False) == b"y"
    except OSError:
        return False
