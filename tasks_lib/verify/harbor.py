"""The verifier of plain Harbor tasks (no `[rollyard]` table): run the task's `tests/test.sh` in a
fresh sandbox and read the reward it writes to `reward.txt`.

The script was written for an image where tests sit at /tests, logs at /logs and the workspace at
the Dockerfile's WORKDIR; here all of them live under the workspace, so those paths are rewritten.
"""

from __future__ import annotations

import re
from pathlib import Path

from rollyard.status import EpisodeStatus
from sandboxes import WORKSPACE_MOUNT, SandboxError
from tasks_lib.verify.context import (
    VerifyResult,
    VerifyRun,
    install_tree,
    limit_of,
    output_tail,
)
from tasks_lib.verify.pytest import VERIFY_ENV


def verify_harbor_script(run: VerifyRun) -> VerifyResult:
    """Score the candidate with the task's `tests/test.sh` (a reward in [0, 1] in reward.txt)."""
    task = run.task
    with run.sandbox() as sandbox:
        tests_prefix = f"{run.report_dir}/tests/"
        install_tree(sandbox, task.tests_dir, tests_prefix)
        logs = f"{WORKSPACE_MOUNT}/{run.report_dir}/logs/verifier"
        sandbox.write_file(f"{run.report_dir}/logs/verifier/.keep", b"")
        script = (task.tests_dir / "test.sh").read_text(encoding="utf-8", errors="replace")
        script = script.replace("/logs/verifier", logs)
        script = re.sub(
            r"(?<![\w./-])/tests\b", f"{WORKSPACE_MOUNT}/{tests_prefix}".rstrip("/"), script
        )
        workdir = dockerfile_workdir(task.path / "environment" / "Dockerfile")
        if workdir and workdir not in ("/", WORKSPACE_MOUNT):
            script = re.sub(rf"(?<![\w./-]){re.escape(workdir)}\b", WORKSPACE_MOUNT, script)
        sandbox.write_file(f"{run.report_dir}/run.sh", script)
        # test.sh usually runs pytest: the same plugin and bytecode settings as the hardened run.
        executed = sandbox.execute(
            ["bash", f"{run.report_dir}/run.sh"], timeout_s=run.timeout_s, env=VERIFY_ENV
        )
        limit = limit_of(executed)
        if limit is not None:
            return run.limit_result(limit, executed, ())
        try:
            text = sandbox.read_file(f"{run.report_dir}/logs/verifier/reward.txt").decode().strip()
            reward = float(text)
        except (SandboxError, OSError, UnicodeDecodeError, ValueError) as error:
            return run.result(
                EpisodeStatus.VERIFIER_ERROR,
                None,
                {},
                f"tests/test.sh wrote no readable reward.txt ({type(error).__name__}); "
                f"exit {executed.exit_code}: {output_tail(executed)}",
            )
        if not 0.0 <= reward <= 1.0:
            return run.result(
                EpisodeStatus.VERIFIER_ERROR,
                None,
                {},
                f"reward.txt holds {reward}, outside [0, 1]",
            )
        return run.result(EpisodeStatus.OK, reward, {}, f"reward.txt = {text}", reward)


def dockerfile_workdir(dockerfile: Path) -> str | None:
    """The last WORKDIR of a Dockerfile (None when it has none or cannot be read)."""
    try:
        lines = dockerfile.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    workdir = None
    for line in lines:
        match = re.match(r"\s*WORKDIR\s+(\S+)", line, flags=re.IGNORECASE)
        if match:
            workdir = match.group(1).rstrip("/") or "/"
    return workdir
