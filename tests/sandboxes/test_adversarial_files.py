"""Escapes through files from the bwrap sandbox: host files and secrets, writes outside the
workspace, symlink escapes (conftest.py: the fixtures and the host-unchanged check)."""

from __future__ import annotations

import json
import os
import sysconfig
import time
from pathlib import Path

import pytest

from sandboxes import Sandbox, WorkspacePathError, open_sandbox
from sandboxes.errors import SnapshotError
from sandboxes.snapshot import snapshot_digest
from tests.sandboxes.adversarial_support import (
    SMALL,
    py,
)

pytestmark = [
    pytest.mark.adversarial,
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("capable_host", "host_unchanged"),
]


# -- host files and secrets -----------------------------------------------------------------


def test_canary_files_in_host_root_and_tmp_are_invisible(
    sandbox: Sandbox, canaries: dict[str, Path]
) -> None:
    paths = " ".join(str(p) for p in canaries.values())
    result = sandbox.execute(
        f"cat {paths}; ls -a /root /tmp; grep -rl CANARY- /tmp /workspace /dev /etc 2>/dev/null"
    )
    assert "CANARY-" not in result.stdout, result
    for path in canaries.values():
        assert path.name not in result.stdout


def test_caller_environment_canary_does_not_leak(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = f"secret-{os.urandom(8).hex()}"
    monkeypatch.setenv("ROLLYARD_ADV_CANARY", secret)
    result = sandbox.execute("env; cat /proc/*/environ | tr '\\0' '\\n'")
    assert secret not in result.stdout and "ROLLYARD_ADV_CANARY" not in result.stdout, result


def test_etc_shadow_is_unreadable(sandbox: Sandbox) -> None:
    result = sandbox.execute("cat /etc/shadow")
    assert result.exit_code != 0 and "root:" not in result.stdout, result
    assert "Permission denied" in result.stderr


def test_proc_environ_of_every_visible_process_holds_no_secrets(
    sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLYARD_ADV_CANARY", "leak-me")
    result = sandbox.execute(
        py("""
        import json, os
        found = {}
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                raw = open(f"/proc/{pid}/environ", "rb").read()
            except OSError as error:
                raw = repr(error).encode()
            found[pid] = sorted(e.split(b"=")[0].decode() for e in raw.split(b"\\0") if e)
        print(json.dumps(found))
    """)
    )
    environs = json.loads(result.stdout)
    assert len(environs) <= 3, environs  # bwrap's init, python (and nothing of the host)
    names = {name for names in environs.values() for name in names}
    assert names <= {"PATH", "HOME", "TMPDIR", "LANG", "PYTHONDONTWRITEBYTECODE", "PWD"}, names


# -- writes outside the workspace -------------------------------------------------------------


def test_writes_outside_the_workspace_fail(sandbox: Sandbox, snapshot: Path) -> None:
    store_copy = sandbox._lower  # type: ignore[attr-defined]
    digest_before = snapshot_digest(snapshot)
    site_packages = Path(sysconfig.get_paths()["purelib"])
    token = os.urandom(4).hex()
    targets = [
        Path("/usr") / f"adv-{token}",
        Path("/usr/bin") / f"adv-{token}",
        Path("/etc") / f"adv-{token}",
        Path("/etc/passwd"),
        site_packages / f"adv-{token}.pth",
        store_copy / "calc.py",
        store_copy / f"adv-{token}",
        snapshot / "calc.py",
        snapshot / f"adv-{token}",
        Path("/") / f"adv-{token}",
    ]
    script = "; ".join(f"(echo pwned > {t}) 2>/dev/null && echo WROTE {t}" for t in targets)
    result = sandbox.execute(script + "; true")
    assert "WROTE" not in result.stdout, result
    for target in targets:
        if target.name.startswith("adv-"):
            assert not target.exists(), target
    assert b"pwned" not in Path("/etc/passwd").read_bytes()
    assert snapshot_digest(snapshot) == digest_before == snapshot_digest(store_copy)


def test_writing_through_stdin_descriptor_fails(sandbox: Sandbox) -> None:
    # stdin is spooled to a host file: the command must not be able to write into it.
    result = sandbox.execute("cat; head -c 10000000 /dev/zero >&0 && echo WROTE", stdin="data")
    assert result.stdout.startswith("data") and "WROTE" not in result.stdout, result


# -- symlink escapes --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "link_target",
    ["/etc/shadow", "/etc", "/root", "/tmp", "../../../../../etc/passwd", "/proc/1/root/etc"],
)
def test_symlink_escape_is_refused_by_host_side_file_access(
    sandbox: Sandbox, link_target: str, canaries: dict[str, Path]
) -> None:
    result = sandbox.execute(["ln", "-s", link_target, "link"])
    assert result.exit_code == 0, result
    for path in ("link", "link/shadow", f"link/{canaries['root'].name}", "/workspace/link"):
        with pytest.raises(WorkspacePathError):
            sandbox.read_file(path)
        with pytest.raises(WorkspacePathError):
            sandbox.write_file(path, "pwned")
    assert b"pwned" not in Path("/etc/shadow").read_bytes()


def test_symlink_followed_inside_stays_in_the_sandbox(
    sandbox: Sandbox, canaries: dict[str, Path]
) -> None:
    root_canary, tmp_canary = canaries["root"], canaries["tmp"]
    result = sandbox.execute(
        f"ln -s {root_canary} a; ln -s {tmp_canary} b; ln -s / c; "
        "cat a b; echo pwned > b; echo pwned > c/tmp/x; cat c/etc/shadow; ls c/root"
    )
    assert "CANARY-" not in result.stdout, result
    assert root_canary.name not in result.stdout
    # the write through `b` landed in the sandbox's own /tmp, gone with the command
    assert tmp_canary.read_text().startswith("CANARY-")
    assert not Path("/tmp/x").exists() or Path("/tmp/x").read_text() != "pwned\n"


def test_snapshot_with_chained_symlink_escape_is_refused(
    sandbox_root: Path, tmp_path: Path
) -> None:
    snap = tmp_path / "evil"
    (snap / "d").mkdir(parents=True)
    (snap / "d" / "up").symlink_to("..")
    (snap / "e").symlink_to("d/up/..")  # lexically "d", really the snapshot's parent
    with pytest.raises(SnapshotError):
        open_sandbox(snap, limits=SMALL)


def test_fifo_left_in_workspace_does_not_hang_host_side_reads(sandbox: Sandbox) -> None:
    assert sandbox.execute("mkfifo pipe").exit_code == 0
    started = time.monotonic()
    with pytest.raises(WorkspacePathError):
        sandbox.read_file("pipe")
    with pytest.raises(WorkspacePathError):
        sandbox.write_file("pipe", "x")
    assert time.monotonic() - started < 1
