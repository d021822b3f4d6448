"""The artifact verifier: the candidate's outputs against references, per data variant.

For each variant a fresh sandbox starts from the pristine snapshot with the guarded changes; the
outputs are removed, the variant's overlay (hidden data) is written, the task's command runs, and
every output is read out of the sandbox and compared on the host with the variant's reference
(`compare`). References stay in the task directory: the agent never sees or changes them. Per-output
outcomes are reported as tests (`variant::path`); the reward is 1 when every one passes.
"""

from __future__ import annotations

from sandboxes import WorkspacePathError
from tasks_lib.errors import VerifierSetupError
from tasks_lib.verify.compare import compare_artifact
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

MAX_ARTIFACT_BYTES = 32 * 1024 * 1024


def verify_artifacts(run: VerifyRun) -> VerifyResult:
    """Score the candidate's outputs against the references of every variant."""
    spec = run.task.artifact
    assert spec is not None, "an artifact task always has its [rollyard.artifact] table"
    guarded = run.guarded
    tests: dict[str, Outcome] = {}
    problems: list[str] = []
    hidden: set[str] = set()
    limit: Limit | None = None
    outputs = [output.path for output in spec.outputs]
    if spec.command is not None:
        for path in outputs:
            if path in guarded.files:
                run.flag("artifact_preseeded", path, "output shipped by the candidate; removed")
    for variant in spec.variants:
        ids = {output.path: f"{variant.name}::{output.path}" for output in spec.outputs}
        if variant.hidden:
            hidden.update(ids.values())
        remaining = run.remaining_s()
        if limit is not None or remaining <= 0:
            limit = limit or "wall_time"
            tests.update({test_id: "missing" for test_id in ids.values()})
            continue
        with run.sandbox() as sandbox:
            if spec.command is not None:
                cleared = sandbox.execute(["rm", "-rf", "--", *outputs], timeout_s=30)
                if not cleared.ok:
                    raise VerifierSetupError(
                        f"could not clear outputs: {cleared.stderr.strip()[:200]}"
                    )
                if variant.overlay_dir is not None:
                    install_tree(sandbox, variant.overlay_dir, "")
                executed = sandbox.execute(
                    ["bash", "-c", spec.command],
                    timeout_s=max(0.1, min(spec.timeout_s, remaining)),
                    env=COMMAND_ENV,
                )
                limit = limit_of(executed)
                if limit is not None:
                    problems.append(
                        f"{variant.name}: the command hit the {LIMIT_NAMES[limit]} limit"
                    )
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
                    # Read no further than the cap: the candidate's code wrote this file.
                    written = sandbox.read_file_ends(output.path, max_bytes=MAX_ARTIFACT_BYTES)
                except (WorkspacePathError, OSError):
                    tests[test_id] = "missing"
                    problems.append(f"{test_id}: not produced")
                    continue
                produced = written.head
                if written.truncated:
                    tests[test_id] = "failed"
                    problems.append(f"{test_id}: larger than {MAX_ARTIFACT_BYTES} bytes")
                    continue
                mismatches = compare_artifact(produced, reference, output)
                tests[test_id] = "failed" if mismatches else "passed"
                problems += [f"{test_id}: {line}" for line in mismatches[:2]]
    return finish_checks(run, tests, problems, limit, hidden)
