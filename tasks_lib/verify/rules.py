"""The rule verifier: declarative checks over the final state of the workspace.

One fresh sandbox starts from the pristine snapshot with the guarded changes and the task's
overlay (hidden data); the checks run in order and state carries over (a migration check leaves
the database the service check reads). The service probe is the verifier's own program, run
isolated (`python -I -S`) from the directory drawn per run. Per-check outcomes are reported as
tests (the check's name); the reward is 1 when every one passes.
"""

from __future__ import annotations

import json
import re
import secrets
import tomllib

from sandboxes import Sandbox, WorkspacePathError
from tasks_lib.errors import ArtifactError, ProbeError
from tasks_lib.format.spec import RuleCheck
from tasks_lib.verify.compare import read_table
from tasks_lib.verify.context import (
    COMMAND_ENV,
    LIMIT_NAMES,
    Limit,
    VerifyResult,
    VerifyRun,
    finish_checks,
    install_tree,
    limit_of,
)
from tasks_lib.verify.junit import Outcome

MAX_FILE_BYTES = 32 * 1024 * 1024
"""Bytes of a checked file that are read."""

# The verifier's own socket probe. It turns itself non-dumpable before reading its nonce (so a
# process of the same uid cannot read its memory or file descriptors), starts the service as its
# child with output to a log, polls the port and prints one JSON line carrying the nonce.
_PROBE = r"""
import ctypes, http.client, json, socket, subprocess, sys, time
try:
    ctypes.CDLL(None).prctl(4, 0, 0, 0, 0)  # PR_SET_DUMPABLE = 0
except Exception:
    pass
spec = json.loads(sys.stdin.readline())
log = open(spec["log"], "wb")
service = subprocess.Popen(["bash", "-c", spec["start"]], stdin=subprocess.DEVNULL, stdout=log,
                           stderr=log, start_new_session=True)
deadline = time.monotonic() + spec["timeout_s"]
out = {"nonce": spec["nonce"], "connected": False, "status": None, "body": "", "error": ""}
while time.monotonic() < deadline:
    try:
        if spec["http_get"] is not None:
            conn = http.client.HTTPConnection("127.0.0.1", spec["port"], timeout=2)
            conn.request("GET", spec["http_get"])
            answer = conn.getresponse()
            out.update(connected=True, status=answer.status,
                       body=answer.read(65536).decode("utf-8", "replace"))
        else:
            with socket.create_connection(("127.0.0.1", spec["port"]), timeout=2) as conn:
                conn.sendall(spec["send"].encode())
                conn.shutdown(socket.SHUT_WR)
                chunks = []
                while sum(map(len, chunks)) < 65536:
                    chunk = conn.recv(4096)
                    if not chunk:
                        break
                    chunks.append(chunk)
            out.update(connected=True, body=b"".join(chunks).decode("utf-8", "replace"))
        break
    except (OSError, http.client.HTTPException) as error:
        out["error"] = f"{type(error).__name__}: {error}"
        if service.poll() is not None:
            out["error"] += f" (the service exited with {service.returncode})"
            break
        time.sleep(0.1)
print(json.dumps(out), flush=True)
"""


def verify_rules(run: VerifyRun) -> VerifyResult:
    """Run the task's checks in order in one fresh sandbox (state carries over between them)."""
    spec = run.task.rules
    assert spec is not None, "a rules task always has its [rollyard.rules] table"
    tests: dict[str, Outcome] = {}
    problems: list[str] = []
    limit: Limit | None = None
    hidden = {check.name for check in spec.checks if check.hidden}
    with run.sandbox() as sandbox:
        if spec.overlay_dir is not None:
            install_tree(sandbox, spec.overlay_dir, "")
        probe_path = f"{run.report_dir}/probe.py"
        if any(check.kind == "service" for check in spec.checks):
            sandbox.write_file(probe_path, _PROBE)
        for check in spec.checks:
            remaining = run.remaining_s()
            if limit is not None or remaining <= 0:
                limit = limit or "wall_time"
                tests[check.name] = "missing"
                continue
            timeout_s = max(0.1, min(check.timeout_s, remaining))
            passed, why, hit = _run_check(sandbox, check, timeout_s, run.report_dir, probe_path)
            tests[check.name] = "passed" if passed else "failed"
            if hit is not None:
                limit = hit
            if not passed:
                problems.append(f"{check.name}: {why}")
    return finish_checks(run, tests, problems, limit, hidden)


def _read_text(sandbox: Sandbox, path: str) -> str | None:
    try:
        return sandbox.read_file(path)[:MAX_FILE_BYTES].decode("utf-8", errors="replace")
    except (WorkspacePathError, OSError):
        return None


def _run_check(
    sandbox: Sandbox, check: RuleCheck, timeout_s: float, report_dir: str, probe_path: str
) -> tuple[bool, str, Limit | None]:
    """(passed, why not, limit hit) of one check."""
    if check.kind in ("file_exists", "file_contains", "parses"):
        assert check.path is not None
        text = _read_text(sandbox, check.path)
        if text is None:
            return False, f"{check.path} does not exist", None
        if check.kind == "file_exists":
            return True, "", None
        if check.kind == "file_contains":
            if check.text is not None and check.text not in text:
                return False, f"{check.path} lacks the expected text", None
            if check.pattern is not None and re.search(check.pattern, text, re.MULTILINE) is None:
                return False, f"{check.path} does not match the pattern", None
            return True, "", None
        try:
            if check.format == "json":
                json.loads(text)
            elif check.format == "toml":
                tomllib.loads(text)
            else:
                read_table(text.encode(), "csv")
        except (ValueError, ArtifactError) as error:
            return False, f"{check.path} is not valid {check.format}: {str(error)[:120]}", None
        return True, "", None
    if check.kind == "command":
        assert check.run is not None
        executed = sandbox.execute(["bash", "-c", check.run], timeout_s=timeout_s, env=COMMAND_ENV)
        hit = limit_of(executed)
        if hit is not None:
            return False, f"{check.run!r} hit the {LIMIT_NAMES[hit]} limit", None
        if executed.exit_code != check.exit_code:
            tail = (executed.stderr.strip() or executed.stdout.strip()).splitlines()[-1:]
            return (
                False,
                f"exit {executed.exit_code}, expected {check.exit_code}: {(tail or [''])[0][:160]}",
                None,
            )
        output = executed.stdout + executed.stderr
        if check.stdout_contains is not None and check.stdout_contains not in output:
            return False, "the output lacks the expected text", None
        return True, "", None
    nonce = secrets.token_hex(16)
    request = {
        "nonce": nonce, "start": check.start, "port": check.port, "http_get": check.http_get,
        "send": check.send, "timeout_s": max(0.1, timeout_s - 1.0),
        "log": f"{report_dir}/service-{check.name}.log",
    }  # fmt: skip
    executed = sandbox.execute(
        ["python", "-I", "-S", probe_path],
        timeout_s=timeout_s + 5.0,
        stdin=json.dumps(request) + "\n",
        env=COMMAND_ENV,
    )
    answer = None
    for line in reversed(executed.stdout.splitlines()):
        try:
            candidate = json.loads(line)
        except ValueError:
            continue
        if isinstance(candidate, dict) and candidate.get("nonce") == nonce:
            answer = candidate
            break
    if answer is None:
        raise ProbeError(f"the service probe printed no result (exit {executed.exit_code}): "
                            f"{executed.stderr.strip()[-200:]}")  # fmt: skip
    if not answer["connected"]:
        return False, f"nothing answered on port {check.port}: {answer['error'][:160]}", None
    if check.expect_status is not None and answer["status"] != check.expect_status:
        return False, f"HTTP {answer['status']}, expected {check.expect_status}", None
    if check.expect_contains is not None and check.expect_contains not in answer["body"]:
        return False, "the answer lacks the expected text", None
    return True, "", None
