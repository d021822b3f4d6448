"""The conformance suite every sandbox backend passes: subclass `SandboxConformance` once per
backend and provide `open_backend`. Isolation attacks live in test_adversarial_*.py."""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sandboxes import (
    REFUSED_COMMAND_EXIT_CODE,
    ExecResult,
    InvalidLimitsError,
    Limits,
    Sandbox,
    SandboxClosedError,
    SandboxError,
    SandboxPool,
    SnapshotError,
    WorkspacePathError,
)
from sandboxes.snapshot import snapshot_digest

OpenBackend = Callable[..., Sandbox]


def make_snapshot(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    (root / "pkg").mkdir()
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "data.txt").write_text("one\ntwo\n")
    (root / "tests").mkdir()
    (root / "tests" / "test_calc.py").write_text(
        "from calc import add\n\ndef test_add():\n    assert add(2, 3) == 5\n"
    )
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    return root


class SandboxConformance:
    """Behaviour every backend must have. Subclasses define the `open_backend` fixture."""

    @pytest.fixture
    def snapshot(self, tmp_path: Path) -> Path:
        return make_snapshot(tmp_path / "snapshot")

    @pytest.fixture
    def sandbox(self, open_backend: OpenBackend, snapshot: Path) -> Sandbox:
        sandbox = open_backend(snapshot)
        yield sandbox
        sandbox.close()

    # -- execute -----------------------------------------------------------------------------

    def test_execute_captures_stdout_stderr_and_exit_code(self, sandbox: Sandbox) -> None:
        result = sandbox.execute("echo out; echo err >&2; exit 3")
        assert (result.exit_code, result.stdout, result.stderr) == (3, "out\n", "err\n")
        assert not (result.timed_out or result.oom_killed or result.output_truncated)
        assert result.duration_s > 0
        assert not result.ok

    def test_execute_argv_list_is_not_shell_interpreted(self, sandbox: Sandbox) -> None:
        result = sandbox.execute(["echo", "$HOME;", "a b"])
        assert result.stdout == "$HOME; a b\n"

    def test_cwd_is_the_workspace_and_python_with_pytest_is_available(
        self, sandbox: Sandbox
    ) -> None:
        result = sandbox.execute("pwd && python -m pytest -q -p no:cacheprovider tests")
        assert result.exit_code == 0, result.stdout + result.stderr
        assert result.stdout.splitlines()[0] == "/workspace"
        assert "1 passed" in result.stdout

    def test_stdin_and_env_reach_the_command(self, sandbox: Sandbox) -> None:
        result = sandbox.execute(
            "read line; echo $line-$GREETING", stdin="hello\n", env={"GREETING": "hi"}
        )
        assert result.stdout == "hello-hi\n"

    def test_environment_is_cleared(
        self, sandbox: Sandbox, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        monkeypatch.setenv("ROLLYARD_TEST_SECRET", "leak")
        assert "leak" not in sandbox.execute("env").stdout

    def test_executable_bit_survives_the_snapshot(self, sandbox: Sandbox) -> None:
        assert sandbox.execute("./run.sh").stdout == "run\n"

    def test_killed_by_signal_reports_128_plus_signal(self, sandbox: Sandbox) -> None:
        assert sandbox.execute("kill -9 $$").exit_code == 137

    def test_timeout_kills_and_reports(self, sandbox: Sandbox) -> None:
        result = sandbox.execute("echo started; sleep 30", timeout_s=0.5)
        assert result.timed_out and not result.ok
        assert result.duration_s < 5
        assert result.stdout == "started\n"

    def test_timeout_must_be_positive(self, sandbox: Sandbox) -> None:
        with pytest.raises(ValueError, match="timeout_s"):
            sandbox.execute("true", timeout_s=0)

    def test_output_over_the_limit_keeps_head_and_tail(
        self, open_backend: OpenBackend, snapshot: Path
    ) -> None:
        with open_backend(snapshot, limits=Limits(output_bytes=1000)) as sandbox:
            result = sandbox.execute("echo FIRST; seq 1 100000; echo LAST")
        assert result.output_truncated
        assert result.stdout.startswith("FIRST\n")
        assert result.stdout.rstrip().endswith("LAST")
        assert "truncated" in result.stdout
        assert len(result.stdout) < 1200

    def test_memory_limit_kills_and_reports_oom(
        self, open_backend: OpenBackend, snapshot: Path
    ) -> None:
        with open_backend(snapshot, limits=Limits(memory_mb=64)) as sandbox:
            result = sandbox.execute("python -c 'x = bytearray(400 * 2**20)'", timeout_s=20)
            assert result.oom_killed and result.exit_code != 0
            assert sandbox.execute("echo alive").stdout == "alive\n"  # the sandbox stays usable

    def test_pids_limit_stops_forking(self, open_backend: OpenBackend, snapshot: Path) -> None:
        with open_backend(snapshot, limits=Limits(pids=16)) as sandbox:
            result = sandbox.execute("for i in $(seq 1 40); do sleep 5 & done; wait", timeout_s=10)
        assert "fork" in result.stderr.lower() or "resource" in result.stderr.lower()

    def test_a_command_longer_than_the_kernel_argument_limit_runs(self, sandbox: Sandbox) -> None:
        # 3 MB: past one argument's 128 KiB and the whole command line's ARG_MAX
        padding = "x" * (3 << 20)
        result = sandbox.execute(f"read line; x={padding}; echo ${{#x}} $line", stdin="in\n")
        assert (result.exit_code, result.stdout) == (0, f"{3 << 20} in\n"), result.stderr[:300]

    def test_a_command_the_kernel_refuses_is_an_exit_code_not_an_error(
        self, sandbox: Sandbox
    ) -> None:
        too_long = sandbox.execute(["echo", "y" * (200 << 10)])
        assert too_long.exit_code == REFUSED_COMMAND_EXIT_CODE
        assert "argument list too long" in too_long.stderr
        with_nul = sandbox.execute("echo a\0b")
        assert with_nul.exit_code == REFUSED_COMMAND_EXIT_CODE and "NUL" in with_nul.stderr
        assert sandbox.execute("echo still fine").stdout == "still fine\n"

    # -- files and diff --------------------------------------------------------------------------

    def test_read_and_write_files(self, sandbox: Sandbox) -> None:
        assert sandbox.read_file("calc.py").startswith(b"def add")
        assert sandbox.read_file("/workspace/pkg/data.txt") == b"one\ntwo\n"
        sandbox.write_file("new/dir/file.txt", "made on the host")
        assert sandbox.execute("cat new/dir/file.txt").stdout == "made on the host"
        assert sandbox.execute("echo more >> new/dir/file.txt").exit_code == 0  # still writable

    def test_paths_outside_the_workspace_are_refused(self, sandbox: Sandbox) -> None:
        for path in ("../etc/passwd", "/etc/passwd", "pkg/../../x"):
            with pytest.raises(WorkspacePathError):
                sandbox.read_file(path)
            with pytest.raises(WorkspacePathError):
                sandbox.write_file(path, "x")
        with pytest.raises(FileNotFoundError):
            sandbox.read_file("missing.txt")

    def test_read_file_ends_reads_only_what_is_kept(self, sandbox: Sandbox) -> None:
        # sparse: 450 MB of apparent size, and head and tail markers to find
        made = sandbox.execute("printf HEAD > big.log && truncate -s 450M big.log && "
                               "printf TAIL >> big.log")  # fmt: skip
        assert made.exit_code == 0, made.stderr
        started = time.monotonic()
        ends = sandbox.read_file_ends("big.log", max_bytes=6000)
        assert time.monotonic() - started < 5
        assert ends.size_bytes == (450 << 20) + 4 and ends.truncated
        assert ends.head.startswith(b"HEAD") and ends.tail.endswith(b"TAIL")
        text = ends.text()
        assert len(text.encode()) <= 6000 and len(ends.head) + len(ends.tail) > 5900
        assert f"{ends.size_bytes - len(ends.head) - len(ends.tail)} bytes cut" in text
        small = sandbox.read_file_ends("calc.py", max_bytes=6000)
        assert (small.head, small.tail, small.truncated) == (
            sandbox.read_file("calc.py"),
            b"",
            False,
        )

    def test_read_file_ends_cuts_between_characters(self, sandbox: Sandbox) -> None:
        sandbox.write_file("accents.txt", "\u00e9" * 5000)  # 10,000 bytes of two-byte characters
        text = sandbox.read_file_ends("accents.txt", max_bytes=1001).text()
        assert "\ufffd" not in text and len(text.encode()) <= 1001
        assert text.startswith("\u00e9") and text.endswith("\u00e9")

    def test_read_file_ends_refuses_what_read_file_refuses(self, sandbox: Sandbox) -> None:
        assert sandbox.execute("mkfifo pipe").exit_code == 0
        with pytest.raises(WorkspacePathError):
            sandbox.read_file_ends("pipe", max_bytes=100)
        with pytest.raises(IsADirectoryError):
            sandbox.read_file_ends("pkg", max_bytes=100)
        with pytest.raises(FileNotFoundError):
            sandbox.read_file_ends("missing.txt", max_bytes=100)
        with pytest.raises(WorkspacePathError):
            sandbox.read_file_ends("../etc/passwd", max_bytes=100)
        with pytest.raises(ValueError, match="max_bytes"):
            sandbox.read_file_ends("calc.py", max_bytes=0)

    def test_special_files_are_left_out_of_the_diff(self, sandbox: Sandbox) -> None:
        # what an agent's command may leave: FIFOs and a bound unix socket, one replacing a file
        made = sandbox.execute(
            "mkfifo new.fifo && mkdir -p out && mkfifo out/pipe && rm calc.py && mkfifo calc.py"
            " && python3 -c \"import socket; socket.socket(socket.AF_UNIX).bind('agent.sock')\""
            " && echo x > out/kept.txt && test -S agent.sock && test -p calc.py"
        )
        assert made.exit_code == 0, made.stderr
        diff = sandbox.diff()
        assert diff.added == ("out/kept.txt",)
        assert diff.deleted == ("calc.py",) and not diff.modified

    def test_diff_holds_any_number_and_kind_of_names(self, sandbox: Sandbox) -> None:
        # 11,000 names of 200 bytes: 2.2 MB, more than one command line may carry
        made = sandbox.execute(
            "python3 -c \"import os; os.mkdir('many'); [open('many/%05d' % i + 'n' * 194, 'w')"
            ".close() for i in range(11000)]; open('line\\nbreak', 'w')\""
        )
        assert made.exit_code == 0, made.stderr
        added = sandbox.diff().added
        assert len(added) == 11001 and "line\nbreak" in added

    def test_diff_reports_added_modified_deleted(self, sandbox: Sandbox) -> None:
        assert not sandbox.diff()
        sandbox.execute(
            "echo '# edit' >> calc.py && rm pkg/data.txt && mkdir -p out && echo x > out/new.txt"
            " && touch tests/test_calc.py && chmod -x run.sh"
        )
        diff = sandbox.diff()
        assert diff.added == ("out/new.txt",)
        assert diff.modified == ("calc.py", "run.sh")  # a bare touch is not a modification
        assert diff.deleted == ("pkg/data.txt",)
        assert diff.changed_paths == ("calc.py", "out/new.txt", "pkg/data.txt", "run.sh")

    def test_deleting_a_directory_lists_its_files(self, sandbox: Sandbox) -> None:
        sandbox.execute("rm -r pkg")
        assert sandbox.diff().deleted == ("pkg/__init__.py", "pkg/data.txt")

    def test_replacing_a_deleted_file_is_a_modification(self, sandbox: Sandbox) -> None:
        sandbox.execute("rm calc.py && echo 'new' > calc.py")
        diff = sandbox.diff()
        assert diff.modified == ("calc.py",) and not diff.deleted and not diff.added

    # -- reset, snapshot and lifecycle -------------------------------------------------------

    def test_reset_restores_the_pristine_snapshot(self, sandbox: Sandbox, snapshot: Path) -> None:
        sandbox.execute("rm -rf * && echo junk > junk.txt")
        sandbox.write_file("calc.py", "broken")
        sandbox.reset()
        assert not sandbox.diff()
        assert sandbox.read_file("calc.py") == (snapshot / "calc.py").read_bytes()
        assert sandbox.execute("ls").stdout.split() == ["calc.py", "pkg", "run.sh", "tests"]

    def test_snapshot_directory_is_never_modified(self, sandbox: Sandbox, snapshot: Path) -> None:
        before = snapshot_digest(snapshot)
        sandbox.execute("echo x >> calc.py; rm -r tests; touch new")
        sandbox.write_file("pkg/data.txt", "changed")
        assert snapshot_digest(snapshot) == before

    def test_snapshot_digest_is_content_addressed(
        self, open_backend: OpenBackend, tmp_path: Path
    ) -> None:
        first = make_snapshot(tmp_path / "a")
        twin = make_snapshot(tmp_path / "b")
        with open_backend(first) as a, open_backend(twin) as b:
            assert a.snapshot_digest == b.snapshot_digest
            assert a.snapshot_digest.startswith("sha256:")
        (twin / "calc.py").write_text("changed")
        with open_backend(twin) as b:
            assert b.snapshot_digest != snapshot_digest(first)
            assert b.read_file("calc.py") == b"changed"  # a changed source is picked up

    def test_bad_snapshots_are_refused(self, open_backend: OpenBackend, tmp_path: Path) -> None:
        with pytest.raises(SnapshotError, match="does not exist"):
            open_backend(tmp_path / "missing")
        escaping = make_snapshot(tmp_path / "escaping")
        (escaping / "link").symlink_to("/etc/passwd")
        with pytest.raises(SnapshotError, match="outside the snapshot"):
            open_backend(escaping)

    def test_close_is_idempotent_and_misuse_raises(
        self, open_backend: OpenBackend, snapshot: Path
    ) -> None:
        sandbox = open_backend(snapshot)
        sandbox.close()
        sandbox.close()
        assert sandbox.closed
        for call in (
            lambda: sandbox.execute("true"),
            lambda: sandbox.read_file("calc.py"),
            lambda: sandbox.write_file("x", "y"),
            sandbox.diff,
            sandbox.reset,
        ):
            with pytest.raises(SandboxClosedError, match="closed"):
                call()

    def test_context_manager_closes(self, open_backend: OpenBackend, snapshot: Path) -> None:
        with open_backend(snapshot) as sandbox:
            assert sandbox.execute("true").ok
        assert sandbox.closed

    def test_values_and_errors_pickle(self, sandbox: Sandbox) -> None:
        result = sandbox.execute("echo hi")
        assert pickle.loads(pickle.dumps(result)) == result
        assert isinstance(result, ExecResult)
        error = pickle.loads(pickle.dumps(WorkspacePathError("x outside")))
        assert isinstance(error, SandboxError) and str(error) == "x outside"

    # -- pool ------------------------------------------------------------------------------------

    def test_pool_reuses_reset_sandboxes(self, open_backend: OpenBackend, snapshot: Path) -> None:
        with SandboxPool(factory=lambda s, lim, _image: open_backend(s, limits=lim)) as pool:
            pool.prewarm(snapshot, 2)
            assert pool.idle_count(snapshot) == 2
            with pool.acquire(snapshot) as sandbox:
                sandbox.execute("echo dirty > calc.py")
            with pool.acquire(snapshot) as again:
                assert not again.diff()
                assert again.read_file("calc.py").startswith(b"def add")
            assert pool.opened == 2
        assert pool.idle_count() == 0

    def test_pool_discards_a_sandbox_that_raised(
        self, open_backend: OpenBackend, snapshot: Path
    ) -> None:
        with SandboxPool(factory=lambda s, lim, _image: open_backend(s, limits=lim)) as pool:
            with pytest.raises(SandboxError), pool.acquire(snapshot) as sandbox:
                raise SandboxError("the episode broke it")
            assert sandbox.closed and pool.idle_count(snapshot) == 0


def test_limits_validate_every_field() -> None:
    assert Limits().memory_mb > 0
    for field in ("wall_time_s", "memory_mb", "pids", "disk_mb", "output_bytes", "cpus"):
        with pytest.raises(InvalidLimitsError, match=field):
            Limits(**{field: -1})
    with pytest.raises(InvalidLimitsError, match="number"):
        Limits(memory_mb="lots")  # type: ignore[arg-type]
    assert Limits().replace(memory_mb=64).memory_mb == 64


class TestBwrapConformance(SandboxConformance):
    @pytest.fixture
    def open_backend(self) -> OpenBackend:
        from sandboxes.bwrap import BwrapSandbox

        def open_bwrap(snapshot: Path, *, limits: Limits | None = None) -> Sandbox:
            return BwrapSandbox(snapshot, limits=limits)

        return open_bwrap
