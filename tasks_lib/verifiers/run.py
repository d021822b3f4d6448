"""The artifact and rule verifiers: the same guarantees as the test verifier, other judgements.

Both start from the pristine snapshot in a fresh sandbox and apply the candidate's changes after
the guard dropped protected paths. References, hidden data and check definitions stay in the task
directory: artifacts are read out of the sandbox and compared on the host, hidden data is written
over the workspace only in the verifier's sandbox, and the service probe is the verifier's own
program (run isolated, `python -I -S`, from a directory whose name is drawn per run).

- artifact: per variant, a fresh sandbox: candidate changes, outputs removed, the variant's
  overlay written, the command run, every output compared with the variant's reference.
- rules: one fresh sandbox: candidate changes, the overlay written, each check in order (state
  carries over: a migration check leaves the database the service check reads).

Per-check outcomes are reported as `tests` (`variant::path` or the check's name); the reward is 1
when every one passes. A verifier or sandbox failure is a status, never a reward of 0.
"""

from __future__ import annotations

import json
import re
import secrets
import time
import tomllib
from typing import TYPE_CHECKING

from sandboxes import ExecResult, Sandbox, SandboxError, WorkspacePathError, open_sandbox
from tasks_lib.guard import GuardedChanges, GuardPolicy
from tasks_lib.junit import Outcome
from tasks_lib.model import Task
from tasks_lib.verifiers.compare import ArtifactError, compare_artifact, read_table
from tasks_lib.verifiers.spec import ArtifactSpec, RuleCheck, RulesSpec

if TYPE_CHECKING:
    from tasks_lib.verify import Status, VerifyResult, _Run

COMMAND_ENV = {"PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
MAX_ARTIFACT_BYTES = 32 * 1024 * 1024

PYTEST_ONLY_RULES = (
    "early_exit",
    "test_framework_internals",
    "skip_marker",
    "constant_eq",
    "runner_introspection",
    "builtins_or_sys_modules",
)
"""Source rules that catch code fooling a pytest run in-process. An artifact or rule verifier
runs no test code next to the candidate's, so `sys.exit(main())` in an analysis script is no hack;
left on, they would zero honest work."""


def kind_policy(policy: GuardPolicy) -> GuardPolicy:
    """`policy` with the pytest-only source rules off, unless the caller set them."""
    severities = {rule: "off" for rule in PYTEST_ONLY_RULES}
    severities.update(policy.severities)
    return GuardPolicy(severities=severities, zero_on_tamper=policy.zero_on_tamper)


def verify_declared(task: Task, guarded: GuardedChanges, run: _Run, backend: str) -> VerifyResult:
    """Score `guarded` with the task's artifact or rule verifier."""
    try:
        if task.verifier == "artifact":
            assert task.artifact is not None
            return _artifact(task, task.artifact, guarded, run, backend)
        assert task.rules is not None
        return _rules(task, task.rules, guarded, run, backend)
    except SandboxError as error:
        return run.result(
            "infra_error", None, {}, f"sandbox failed: {type(error).__name__}: {error}"
        )
    except OSError as error:
        return run.result("task_error", None, {}, f"cannot read task files: {error}")


def _apply(sandbox: Sandbox, guarded: GuardedChanges) -> None:
    from tasks_lib.verify import _apply as apply_changes

    apply_changes(sandbox, guarded)


def _overlay(sandbox: Sandbox, source: object) -> None:
    from tasks_lib.verify import _install_tree

    _install_tree(sandbox, source, "")  # type: ignore[arg-type]


def _remaining(run: _Run) -> float:
    return run.timeout_s - (time.monotonic() - run.started)


def _finish(
    run: _Run,
    tests: dict[str, Outcome],
    problems: list[str],
    limit: Status | None,
    hidden: set[str],
) -> VerifyResult:
    passed = sum(outcome == "passed" for outcome in tests.values())
    partial = passed / len(tests) if tests else 0.0
    visible = [t for t in tests if t not in hidden]
    if (
        hidden and visible
        and all(tests[t] == "passed" for t in visible)
        and any(tests[t] != "passed" for t in hidden)
    ):  # fmt: skip
        failing = sum(tests[t] != "passed" for t in hidden)
        run.flag("visible_pass_hidden_fail", "-",
                 f"all {len(visible)} visible checks pass, {failing}/{len(hidden)} hidden fail")  # fmt: skip
    summary = f"{passed}/{len(tests)} checks passed"
    if problems:
        summary += ": " + "; ".join(problems[:4])
    if limit is not None:
        return run.result(limit, 0.0, tests, summary, partial)
    reward = 1.0 if tests and passed == len(tests) else 0.0
    return run.result("ok", reward, tests, summary, partial)


def _limit_of(executed: ExecResult) -> Status | None:
    if executed.timed_out:
        return "timeout"
    if executed.oom_killed:
        return "oom"
    return None


# -- artifact comparison --------------------------------------------------------------------------


def _artifact(
    task: Task, spec: ArtifactSpec, guarded: GuardedChanges, run: _Run, backend: str
) -> VerifyResult:
    tests: dict[str, Outcome] = {}
    problems: list[str] = []
    hidden: set[str] = set()
    limit: Status | None = None
    outputs = [output.path for output in spec.outputs]
    if spec.command is not None:
        for path in outputs:
            if path in guarded.files:
                run.flag("artifact_preseeded", path, "output shipped by the candidate; removed")
    for variant in spec.variants:
        ids = {output.path: f"{variant.name}::{output.path}" for output in spec.outputs}
        if variant.hidden:
            hidden.update(ids.values())
        remaining = _remaining(run)
        if limit is not None or remaining <= 0:
            limit = limit or "timeout"
            tests.update({test_id: "missing" for test_id in ids.values()})
            continue
        with open_sandbox(task.snapshot_dir, backend=backend, limits=task.limits) as sandbox:
            run.digest = sandbox.snapshot_digest
            _apply(sandbox, guarded)
            if spec.command is not None:
                cleared = sandbox.execute(["rm", "-rf", "--", *outputs], timeout_s=30)
                if not cleared.ok:
                    raise SandboxError(f"could not clear outputs: {cleared.stderr.strip()[:200]}")
                if variant.overlay_dir is not None:
                    _overlay(sandbox, variant.overlay_dir)
                executed = sandbox.execute(
                    ["bash", "-c", spec.command],
                    timeout_s=max(0.1, min(spec.timeout_s, remaining)),
                    env=COMMAND_ENV,
                )
                limit = _limit_of(executed)
                if limit is not None:
                    problems.append(f"{variant.name}: the command hit the {limit} limit")
                    tests.update({test_id: "failed" for test_id in ids.values()})
                    continue
                if not executed.ok:
                    tail = (executed.stderr.strip() or executed.stdout.strip()).splitlines()[-1:]
                    problems.append(
                        f"{variant.name}: command exit {executed.exit_code}: {(tail or [''])[0][:160]}"
                    )
            for output in spec.outputs:
                test_id = ids[output.path]
                reference = (variant.expected_dir / output.path).read_bytes()
                try:
                    produced = sandbox.read_file(output.path)
                except (WorkspacePathError, OSError):
                    tests[test_id] = "missing"
                    problems.append(f"{test_id}: not produced")
                    continue
                if len(produced) > MAX_ARTIFACT_BYTES:
                    tests[test_id] = "failed"
                    problems.append(f"{test_id}: larger than {MAX_ARTIFACT_BYTES} bytes")
                    continue
                mismatches = compare_artifact(produced, reference, output)
                tests[test_id] = "failed" if mismatches else "passed"
                problems += [f"{test_id}: {line}" for line in mismatches[:2]]
    return _finish(run, tests, problems, limit, hidden)


# -- rule validation ------------------------------------------------------------------------------

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


def _rules(
    task: Task, spec: RulesSpec, guarded: GuardedChanges, run: _Run, backend: str
) -> VerifyResult:
    tests: dict[str, Outcome] = {}
    problems: list[str] = []
    limit: Status | None = None
    hidden = {check.name for check in spec.checks if check.hidden}
    with open_sandbox(task.snapshot_dir, backend=backend, limits=task.limits) as sandbox:
        run.digest = sandbox.snapshot_digest
        _apply(sandbox, guarded)
        if spec.overlay_dir is not None:
            _overlay(sandbox, spec.overlay_dir)
        probe_path = f"{run.report_dir}/probe.py"
        if any(check.kind == "service" for check in spec.checks):
            sandbox.write_file(probe_path, _PROBE)
        for check in spec.checks:
            remaining = _remaining(run)
            if limit is not None or remaining <= 0:
                limit = limit or "timeout"
                tests[check.name] = "missing"
                continue
            timeout_s = max(0.1, min(check.timeout_s, remaining))
            passed, why, hit = _run_check(sandbox, check, timeout_s, run.report_dir, probe_path)
            tests[check.name] = "passed" if passed else "failed"
            if hit is not None:
                limit = hit
            if not passed:
                problems.append(f"{check.name}: {why}")
    return _finish(run, tests, problems, limit, hidden)


def _read_text(sandbox: Sandbox, path: str) -> str | None:
    try:
        return sandbox.read_file(path)[:MAX_ARTIFACT_BYTES].decode("utf-8", errors="replace")
    except (WorkspacePathError, OSError):
        return None


def _run_check(
    sandbox: Sandbox, check: RuleCheck, timeout_s: float, report_dir: str, probe_path: str
) -> tuple[bool, str, Status | None]:
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
        hit = _limit_of(executed)
        if hit is not None:
            return False, f"{check.run!r} hit the {hit} limit", None
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
        raise _ProbeFailure(f"the service probe printed no result (exit {executed.exit_code}): "
                            f"{executed.stderr.strip()[-200:]}")  # fmt: skip
    if not answer["connected"]:
        return False, f"nothing answered on port {check.port}: {answer['error'][:160]}", None
    if check.expect_status is not None and answer["status"] != check.expect_status:
        return False, f"HTTP {answer['status']}, expected {check.expect_status}", None
    if check.expect_contains is not None and check.expect_contains not in answer["body"]:
        return False, "the answer lacks the expected text", None
    return True, "", None


class _ProbeFailure(SandboxError):
    """The verifier's own probe did not report: an infra failure, not the candidate's."""
