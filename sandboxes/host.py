"""Host-side machinery of the bwrap backend: capability checks, mounts, the seccomp filter, the
runtime directory of live sandboxes, and the start-up sweep that reclaims orphans.

Everything here needs root on the host: overlay and tmpfs mounts are made from the host side
(Debian's bubblewrap 0.8 has no overlay flags) and cgroups are created under /sys/fs/cgroup.
Commands themselves never run as root: they are started as an unprivileged host uid.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import fcntl
import functools
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from rollyard.settings import settings
from sandboxes import cgroups
from sandboxes.errors import SandboxSetupError, SandboxUnavailableError

SANDBOX_HOST_UID = 65534
"""Host uid (and gid) sandboxed commands run as: `nobody`. Root plus bwrap's `--uid` would still
be host root, so the launcher drops to this uid before bwrap starts."""

ROOT_ENV = "ROLLYARD_SANDBOX_ROOT"
"""The variable naming the sandbox root (`rollyard.settings.RollyardSettings.sandbox_root`)."""

# Syscalls a test-running workload never needs and an escape attempt usually does.
BLOCKED_SYSCALLS = (
    "ptrace", "process_vm_readv", "process_vm_writev", "mount", "umount2", "pivot_root",
    "chroot", "unshare", "setns", "bpf", "keyctl", "add_key", "request_key", "kexec_load",
    "kexec_file_load", "init_module", "finit_module", "delete_module", "perf_event_open",
    "userfaultfd", "reboot", "swapon", "swapoff", "open_by_handle_at", "name_to_handle_at",
    "acct", "quotactl", "syslog", "iopl", "ioperm", "fsopen", "fsmount", "fsconfig",
    "move_mount", "open_tree", "mount_setattr",
    # io_uring: a large kernel attack surface that container runtimes block by default too
    "io_uring_setup", "io_uring_enter", "io_uring_register",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class HostLayout:
    """Where the backend keeps its state on the host."""

    root: Path

    @property
    def snapshots(self) -> Path:
        return self.root / "snapshots"

    @property
    def live(self) -> Path:
        return self.root / "live"

    @property
    def command(self) -> Path:
        """Empty on the host; in each command's private mount namespace, its sandbox's
        directory is bound here (see `isolate_live_mounts`)."""
        return self.root / "command"

    @property
    def docker_snapshots(self) -> Path:
        return self.root / "docker-snapshots"


def host_layout() -> HostLayout:
    # Absolute: mount tables and the snapshot cache compare paths by their text.
    return HostLayout(settings().sandbox_root.absolute())


# -- capability check -------------------------------------------------------------------------------


@functools.cache
def check_host() -> str:
    """Raise `SandboxUnavailableError` naming what is missing; return the bwrap path."""
    problems: list[str] = []
    if os.geteuid() != 0:
        problems.append(
            "root is required (host-side overlay mounts and cgroups); run as root, or use the "
            "docker backend"
        )
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        problems.append("bubblewrap is not installed: apt-get install bubblewrap")
    for tool in UTIL_LINUX_TOOLS:
        if shutil.which(tool) is None:
            problems.append(f"{tool} is not installed: apt-get install util-linux")
    max_userns = Path("/proc/sys/user/max_user_namespaces")
    if max_userns.exists() and max_userns.read_text().strip() == "0":
        problems.append("user namespaces are disabled: sysctl -w user.max_user_namespaces=15000")
    clone = Path("/proc/sys/kernel/unprivileged_userns_clone")
    if clone.exists() and clone.read_text().strip() == "0":
        problems.append(
            "unprivileged user namespaces are disabled: sysctl -w kernel.unprivileged_userns_clone=1"
        )
    if "overlay" not in Path("/proc/filesystems").read_text():
        with contextlib.suppress(OSError):
            subprocess.run(["modprobe", "overlay"], check=False, capture_output=True)
        if "overlay" not in Path("/proc/filesystems").read_text():
            problems.append("overlayfs is not available: modprobe overlay")
    try:
        cgroups.cgroup_version()
    except SandboxUnavailableError as error:
        problems.append(str(error))
    try:
        seccomp_program()
    except SandboxUnavailableError as error:
        problems.append(str(error))
    if problems:
        raise SandboxUnavailableError(
            "the bwrap sandbox backend cannot run on this host: " + "; ".join(problems)
        )
    assert bwrap is not None
    _check_userns_works(bwrap)
    return bwrap


UTIL_LINUX_TOOLS = ("setpriv", "unshare", "mount", "umount")
"""What the launcher runs before bwrap (dropping to the sandbox uid, a private mount namespace)."""


@functools.cache
def tool_path(name: str) -> str:
    """Absolute path of a launcher tool: the launcher runs with an empty environment, no PATH."""
    path = shutil.which(name)
    if path is None:
        raise SandboxUnavailableError(f"{name} is not installed: apt-get install util-linux")
    return path


def _check_userns_works(bwrap: str) -> None:
    # Binds /usr alone, not /: a recursive bind of the host root races with the mounts other
    # sandboxes make and drop, and failed whenever one went away during the probe.
    probe = subprocess.run(
        ["setpriv", f"--reuid={SANDBOX_HOST_UID}", f"--regid={SANDBOX_HOST_UID}",
         "--clear-groups", bwrap, "--unshare-all", "--unshare-user", "--ro-bind", "/usr", "/usr",
         "--ro-bind-try", "/lib", "/lib", "--ro-bind-try", "/lib64", "/lib64", "/usr/bin/true"],
        capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"}, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        raise SandboxUnavailableError(
            "bubblewrap cannot create namespaces as an unprivileged user on this host "
            f"({probe.stderr.strip() or 'exit ' + str(probe.returncode)}); enable unprivileged "
            "user namespaces (sysctl kernel.unprivileged_userns_clone=1, "
            "kernel.apparmor_restrict_unprivileged_userns=0)"
        )


# -- seccomp ------------------------------------------------------------------------------------------


@functools.cache
def seccomp_program() -> bytes:
    """The BPF program bwrap loads with `--seccomp FD`: EPERM for BLOCKED_SYSCALLS."""
    try:
        import pyseccomp
    except (ImportError, OSError) as error:  # OSError: libseccomp.so missing
        raise SandboxUnavailableError(
            f"seccomp support is missing ({error}): apt-get install libseccomp2 and "
            "pip install pyseccomp"
        ) from error
    program = pyseccomp.SyscallFilter(pyseccomp.ALLOW)
    for name in BLOCKED_SYSCALLS:
        with contextlib.suppress(Exception):  # a syscall this architecture lacks
            program.add_rule(pyseccomp.ERRNO(errno.EPERM), name)
    with tempfile.TemporaryFile() as handle:
        program.export_bpf(handle)
        handle.seek(0)
        return handle.read()


def seccomp_fd() -> int:
    """A fresh readable fd holding the filter (bwrap reads it to EOF, so one per launch)."""
    read_fd, write_fd = os.pipe()
    program = seccomp_program()
    # The program is a few hundred bytes: far below the pipe buffer, so this cannot block.
    os.write(write_fd, program)
    os.close(write_fd)
    return read_fd


# -- mounts -------------------------------------------------------------------------------------------

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                        ctypes.c_char_p]  # fmt: skip
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 2, 4, 4096, 16384
MNT_DETACH = 2


def mount(source: str, target: Path, fstype: str, options: str) -> None:
    # mount(2) directly: about 3 ms for an overlay, against ~9 ms through mount(8).
    if _libc.mount(source.encode(), str(target).encode(), fstype.encode(),
                   MS_NOSUID | MS_NODEV, options.encode()) != 0:  # fmt: skip
        code = ctypes.get_errno()
        raise SandboxSetupError(f"mount {fstype} on {target} failed: {os.strerror(code)}")


def bind_mount(source: Path, target: Path) -> None:
    if _libc.mount(str(source).encode(), str(target).encode(), None,
                   MS_BIND | MS_REC, None) != 0:  # fmt: skip
        code = ctypes.get_errno()
        raise SandboxSetupError(f"bind mount {source} on {target} failed: {os.strerror(code)}")


def umount(target: Path) -> None:
    if _libc.umount2(str(target).encode(), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (errno.EINVAL, errno.ENOENT):  # not mounted: nothing to undo
            raise SandboxSetupError(f"umount {target} failed: {os.strerror(code)}")


MS_PRIVATE = 1 << 18
_live_isolated: set[Path] = set()


def isolate_live_mounts(layout: HostLayout) -> None:
    """Make `layout.live` a mount of its own (bound onto itself, private), once per root.

    bwrap starts in a copy of its caller's mount namespace and walks the whole table while it
    builds the sandbox, so on a host with N open sandboxes (4 mounts each) every command paid
    for all of them: ~0.7 ms a mount, 2.9 s a command at 1,000 open. With `live` a mount point,
    a command's launcher (when other sandboxes are open, `bwrap.ISOLATE_FROM_OTHER_SANDBOXES`)
    enters a private mount namespace, binds its own sandbox's directory
    to `layout.command` and drops every sandbox's mounts there with one lazy unmount of
    `live`; bwrap then sees only the host's own mounts. Nothing of this reaches the host.

    Only an empty `live` is bound: binding over one that already holds mounted sandboxes (of a
    version before this) would hide their mounts from them. There the launcher's unmount fails
    harmlessly and bwrap walks the full table, as before."""
    live = layout.live
    if live in _live_isolated:
        return
    with open(layout.root / ".live.lock", "a") as lock:
        # Two owners binding at once would stack two mounts, hiding the first one's sandboxes.
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _is_mount_point(live) and not any(live.iterdir()):
            if _libc.mount(str(live).encode(), str(live).encode(), None, MS_BIND, None) != 0:
                code = ctypes.get_errno()
                raise SandboxSetupError(f"bind mount {live} on itself failed: {os.strerror(code)}")
            # Private: sandbox mounts under it never propagate to other namespaces' copies.
            if _libc.mount(None, str(live).encode(), None, MS_PRIVATE, None) != 0:
                code = ctypes.get_errno()
                raise SandboxSetupError(f"making {live} private failed: {os.strerror(code)}")
    _live_isolated.add(live)


def _is_mount_point(path: Path) -> bool:
    # Not os.path.ismount: a directory bound onto itself has the same device as its parent.
    target = str(path).replace(" ", "\\040")
    with open("/proc/self/mounts") as mounts:
        return any(line.split()[1] == target for line in mounts)


def sandbox_mounts(layout: HostLayout) -> list[Path]:
    """Mounts that sandboxes hold under `layout.root`: everything but `live` itself, which
    stays bound once isolated."""
    return [target for target in mounts_under(layout.root) if target != layout.live]


def mounts_under(directory: Path) -> list[Path]:
    prefix = str(directory).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        target = line.split()[1].replace("\\040", " ")
        if target.startswith(prefix):
            found.append(Path(target))
    # deepest first, so nested mounts come off before their parents
    return sorted(found, key=lambda p: len(p.parts), reverse=True)


# -- owners and the orphan sweep ------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (field 3, the state, comes first)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return None


def process_start_time(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return None if fields is None else fields[19]  # field 22 of stat


def owner_token() -> str:
    """`<pid>.<start time>` of this process: names its sandboxes so a sweep can tell whether the
    owner is still alive (the start time guards against pid reuse)."""
    pid = os.getpid()
    return f"{pid}.{process_start_time(pid)}"


def owner_alive(token: str) -> bool:
    pid_text, _, start = token.partition(".")
    if not pid_text.isdigit():
        return False
    fields = _stat_fields(int(pid_text))
    # A zombie is dead: a SIGKILLed owner stays one until its parent reaps it.
    return fields is not None and fields[0] not in ("Z", "X") and fields[19] == start


STAGING_PREFIX = ".staging-"
"""Snapshot copies in progress are `<snapshot store>/.staging-<owner token>-<random>`."""


def staging_prefix() -> str:
    return f"{STAGING_PREFIX}{owner_token()}-"


def sweep_orphans(layout: HostLayout, *, owner: str | None = None) -> list[str]:
    """Reclaim every sandbox whose owning process is gone (only those of `owner`, when given):
    kill its processes, unmount its layers, remove its cgroup and runtime directory, and the
    snapshot copies it left half-made. Returns the sandbox ids reclaimed."""

    def reclaimable(sandbox_or_staging_owner: str) -> bool:
        if owner is not None and sandbox_or_staging_owner != owner:
            return False
        return not owner_alive(sandbox_or_staging_owner)

    reclaimed: list[str] = []
    live_ids: set[str] = set()
    if layout.live.is_dir():
        for entry in layout.live.iterdir():
            sandbox_id = entry.name
            if not reclaimable(sandbox_id.rsplit("-", 1)[0]):
                live_ids.add(sandbox_id)
                continue
            release_runtime_dir(entry)
            reclaimed.append(sandbox_id)
    for sandbox_id, dirs, version in cgroups.stale_groups(live_ids):
        # an owner still alive may be creating its runtime dir right now
        if not reclaimable(sandbox_id.rsplit("-", 1)[0]):
            continue
        with contextlib.suppress(OSError, SandboxSetupError):
            cgroups.remove_group_dirs(dirs, version)
        if sandbox_id not in reclaimed:
            reclaimed.append(sandbox_id)
    for store in (layout.snapshots, layout.docker_snapshots):
        for staging in store.glob(f"{STAGING_PREFIX}*") if store.is_dir() else ():
            staging_owner = staging.name.removeprefix(STAGING_PREFIX).rsplit("-", 1)[0]
            if reclaimable(staging_owner):
                shutil.rmtree(staging, ignore_errors=True)
    return reclaimed


def release_runtime_dir(directory: Path) -> None:
    """Unmount everything under `directory`, then delete it. Never deletes through a mount:
    a runtime dir holds a bind mount of the host's Python installation."""
    for target in mounts_under(directory):
        umount(target)
    remaining = mounts_under(directory)
    if remaining:
        raise SandboxSetupError(
            f"refusing to delete {directory}: still mounted at {', '.join(map(str, remaining))}"
        )
    shutil.rmtree(directory, ignore_errors=True)


def python_runtime_dirs() -> list[Path]:
    """Directories the sandbox binds read-only so the project's interpreter (and its venv with
    pytest) works inside, at the same paths as on the host."""
    dirs = {
        Path(sys.prefix),
        Path(sys.base_prefix),
        Path(os.path.realpath(sys.executable)).parent.parent,
    }
    system = (Path("/usr"),)
    return sorted(d for d in dirs if not any(d.is_relative_to(s) for s in system))
