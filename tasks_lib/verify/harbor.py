"""The verifier of plain Harbor tasks (no rollyard table): run the task's `tests/test.sh` in a
fresh sandbox, as Harbor runs it, and read the reward it writes.

The script was written for an image where tests sit at /tests, logs at /logs and the workspace at
the image's WORKDIR; here all of them live under the workspace, so those paths are rewritten.
The verifier's env (`[verifier].env`, `[environment].env`) is passed on. Rewards are read as
Harbor reads them: `/logs/verifier/reward.json` (named metrics) first, else `reward.txt` (one
number, the metric `reward`). The primary reward, the one that trains, is the metric named
`reward`, else the only metric; several metrics with none named `reward` have no primary.

No false zeros: a run that writes no reward file, an unreadable or out-of-range reward, or a run
whose output shows the environment failing before any test could judge the candidate (a command
not found, a package index or host that cannot be reached, pytest missing) is a `verifier_error`
with no reward, whatever the script wrote. (A candidate that prints such lines itself turns its
own 0 into a verifier_error: the gate's infra-error rate counts every one.)
"""

from __future__ import annotations

import json
import math
import re

from rollyard.status import EpisodeStatus
from sandboxes import WORKSPACE_MOUNT, Sandbox, SandboxError
from tasks_lib.format.harbor import REWARD_KEY
from tasks_lib.format.model import Task
from tasks_lib.verify.context import (
    VerifyResult,
    VerifyRun,
    install_tree,
    limit_of,
    output_tail,
)
from tasks_lib.verify.pytest import VERIFY_ENV

ENVIRONMENT_FAILURES = re.compile(
    r"command not found|Could not resolve host|Temporary failure in name resolution"
    r"|Name or service not known|Network is unreachable|Failed to establish a new connection"
    r"|No matching distribution found|Could not find a version that satisfies"
    r"|No module named '?pytest|Unable to locate package|Failed to fetch http"
    # A test.sh that installs as root: task commands never run as root (docs/harbor.md).
    r"|are you root\?|must be (?:run as )?(?:superuser|root)",
    flags=re.IGNORECASE,
)
"""Lines that say the verifier's environment failed, not the candidate."""


def harbor_script(task: Task, script: str, report_dir: str) -> str:
    """`script` with Harbor's standard paths (/tests, /solution, /logs, the WORKDIR) rewritten to
    where they sit in the sandbox's workspace."""
    root = f"{WORKSPACE_MOUNT}/{report_dir}"
    script = re.sub(r"(?<![\w./-])/logs/(verifier|agent)\b", rf"{root}/logs/\1", script)
    for name in ("tests", "solution"):
        script = re.sub(rf"(?<![\w./-])/{name}\b", f"{root}/{name}", script)
    workdir = task.workdir.rstrip("/")
    if workdir and workdir != WORKSPACE_MOUNT:
        script = re.sub(rf"(?<![\w./-]){re.escape(workdir)}\b", WORKSPACE_MOUNT, script)
    return script


def harbor_env(task: Task) -> dict[str, str]:
    """The environment test.sh runs with: the hardened verifier settings, then the task's."""
    return {**VERIFY_ENV, **task.harbor.environment.env, **task.harbor.verifier_env}


def verify_harbor_script(run: VerifyRun) -> VerifyResult:
    """Score the candidate with the task's `tests/test.sh` and its reward file."""
    task = run.task
    with run.sandbox() as sandbox:
        install_tree(sandbox, task.tests_dir, f"{run.report_dir}/tests/")
        for phase in ("verifier", "agent"):
            sandbox.write_file(f"{run.report_dir}/logs/{phase}/.keep", b"")
        script = (task.tests_dir / "test.sh").read_text(encoding="utf-8", errors="replace")
        sandbox.write_file(f"{run.report_dir}/run.sh", harbor_script(task, script, run.report_dir))
        executed = sandbox.execute(
            ["bash", f"{run.report_dir}/run.sh"], timeout_s=run.timeout_s, env=harbor_env(task)
        )
        limit = limit_of(executed)
        if limit is not None:
            return run.limit_result(limit, executed, ())
        metrics, problem = _read_rewards(sandbox, f"{run.report_dir}/logs/verifier")
        failure = ENVIRONMENT_FAILURES.search(f"{executed.stdout}\n{executed.stderr}")
        if problem is None and failure is not None:
            line = _line_at(f"{executed.stdout}\n{executed.stderr}", failure.start())
            problem = f"the verifier's environment failed before a test could run: {line!r}"
        if problem is not None:
            return run.result(EpisodeStatus.VERIFIER_ERROR, None, {},
                              f"{problem}; exit {executed.exit_code}: {output_tail(executed)}",
                              metrics=metrics)  # fmt: skip
        reward, problem = primary_reward(metrics)
        if reward is None:
            return run.result(EpisodeStatus.VERIFIER_ERROR, None, {}, problem, metrics=metrics)
        shown = ", ".join(f"{name}={value:g}" for name, value in metrics.items())
        return run.result(EpisodeStatus.OK, reward, {}, shown, reward, metrics=metrics)


def _line_at(text: str, index: int) -> str:
    start = text.rfind("\n", 0, index) + 1
    end = text.find("\n", index)
    return text[start : end if end >= 0 else None].strip()[:200]


MAX_REWARD_FILE_BYTES = 1 << 20
"""Bytes of `reward.json` or `reward.txt` read; a larger one is refused unread."""


def _read_rewards(sandbox: Sandbox, logs: str) -> tuple[dict[str, float], str | None]:
    """The metrics of `reward.json` (else `reward.txt` as `reward`), or why there are none."""
    for name in ("reward.json", "reward.txt"):
        try:
            written = sandbox.read_file_ends(f"{logs}/{name}", max_bytes=MAX_REWARD_FILE_BYTES)
        except (SandboxError, OSError):
            continue
        if written.truncated:  # test.sh runs the candidate's code, which can write it
            return {}, f"{name} is larger than {MAX_REWARD_FILE_BYTES} bytes"
        try:
            text = written.head.decode("utf-8").strip()
        except UnicodeDecodeError:
            return {}, f"{name} is not text"
        if not text:
            return {}, f"{name} is empty"
        try:
            value = json.loads(text) if name == "reward.json" else {REWARD_KEY: float(text)}
        except ValueError:
            return {}, f"{name} is not a number: {text[:80]!r}"
        if not isinstance(value, dict) or not value:
            return {}, f"{name} must hold an object of named numbers, not {text[:80]!r}"
        metrics: dict[str, float] = {}
        for key, number in value.items():
            if isinstance(number, bool) or not isinstance(number, int | float):
                return {}, f"{name}: {key!r} is not a number ({number!r})"
            if not math.isfinite(number):
                return {}, f"{name}: {key!r} is not finite ({number!r})"
            metrics[str(key)] = float(number)
        return metrics, None
    return {}, "tests/test.sh wrote neither reward.json nor reward.txt"


def primary_reward(metrics: dict[str, float]) -> tuple[float | None, str]:
    """The reward that trains: the metric `reward`, else the only metric; it must be in [0, 1]."""
    if REWARD_KEY in metrics:
        name = REWARD_KEY
    elif len(metrics) == 1:
        name = next(iter(metrics))
    else:
        return None, (f"reward.json holds {sorted(metrics)} and none is named {REWARD_KEY!r}; "
                      f"name the metric that trains {REWARD_KEY!r}")  # fmt: skip
    value = metrics[name]
    if not 0.0 <= value <= 1.0:
        return None, f"the primary reward {name} = {value} is outside [0, 1]"
    return value, ""
