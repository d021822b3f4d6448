"""The error contract: every project error is a `RollyardError` defined in an `errors` module,
pickles with its exit code, and reaches the CLI as one line and its class's exit code, which
`rollyard --help` documents."""

from __future__ import annotations

import ast
import os
import pickle
import re
from pathlib import Path

import pytest

from flows.cli import main, one_line
from flows.errors import (
    CliError,
    FlowError,
    FlowSettingsError,
    GateStoppedRun,
    NoWorkersError,
    PrefectServerError,
)
from rollyard.errors import EXIT_CODE_MEANINGS, RollyardError, SettingsError, exit_code_for
from sandboxes.errors import (
    InvalidLimitsError,
    SandboxClosedError,
    SandboxCrashedError,
    SandboxError,
    SandboxSetupError,
    SandboxUnavailableError,
    SnapshotError,
    UnknownBackendError,
    WorkspacePathError,
)
from training.errors import (
    ActionParseError,
    EnvInfrastructureError,
    EnvLifecycleError,
    PolicyError,
    PolicyServerError,
    TrainerError,
    TrainingError,
    TrainingSettingsError,
)

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES_WITH_ONE_ERRORS_MODULE = ("rollyard", "sandboxes", "training", "flows")

EXPECTED_EXIT_CODES = [
    (SandboxError("x"), 1),
    (SandboxClosedError("x"), 1),
    (SandboxUnavailableError("x"), 3),
    (SandboxSetupError("x"), 3),
    (SandboxCrashedError("x"), 3),
    (UnknownBackendError("x"), 2),
    (SnapshotError("x"), 2),
    (WorkspacePathError("x"), 2),
    (InvalidLimitsError("x"), 2),
    (TrainingError("x"), 1),
    (PolicyError("x"), 1),
    (PolicyServerError("x", 503), 3),
    (ActionParseError("x"), 2),
    (TrainerError("x"), 4),
    (EnvLifecycleError("x"), 1),
    (EnvInfrastructureError("x", "verifier_error", "obs", {"step": 3}), 3),
    (SettingsError("x"), 2),
    (TrainingSettingsError("x"), 2),
    (FlowError("x"), 1),
    (CliError("x"), 1),
    (CliError("x", 4), 4),
    (FlowSettingsError("x"), 2),
    (PrefectServerError("x"), 3),
    (NoWorkersError("x"), 3),
    (GateStoppedRun("x"), 1),
]


@pytest.mark.parametrize(
    ("error", "code"),
    EXPECTED_EXIT_CODES,
    ids=[f"{type(e).__name__}-{c}" for e, c in EXPECTED_EXIT_CODES],
)
def test_errors_share_one_root_and_pickle_with_their_exit_code(
    error: RollyardError, code: int
) -> None:
    assert isinstance(error, RollyardError) and exit_code_for(error) == code
    assert code in dict(EXIT_CODE_MEANINGS)
    copy = pickle.loads(pickle.dumps(error))  # Dask and Prefect move errors between processes
    assert type(copy) is type(error) and str(copy) == str(error) and exit_code_for(copy) == code


def test_errors_outside_the_tree_exit_1() -> None:
    assert exit_code_for(RuntimeError("a bug")) == 1


def _exception_classes(package: str) -> dict[str, list[str]]:
    """module path -> exception classes it defines (bases named *Error/*Exception, or a class
    of the package already known to be one), from the source."""
    trees = {
        path: ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted((REPO_ROOT / package).rglob("*.py"))
    }
    known: set[str] = set()
    found: dict[str, list[str]] = {}
    changed = True
    while changed:
        changed = False
        for path, tree in trees.items():
            for node in ast.walk(tree):
                if not isinstance(node, ast.ClassDef) or node.name in known:
                    continue
                bases = [ast.unparse(base).rsplit(".", 1)[-1] for base in node.bases]
                if any(b.endswith(("Error", "Exception")) or b in known for b in bases):
                    known.add(node.name)
                    found.setdefault(str(path.relative_to(REPO_ROOT)), []).append(node.name)
                    changed = True
    return found


@pytest.mark.parametrize("package", PACKAGES_WITH_ONE_ERRORS_MODULE)
def test_every_exception_class_lives_in_an_errors_module(package: str) -> None:
    found = _exception_classes(package)
    assert found, f"no exception classes found in {package}: the scan is broken"
    outside = {path: names for path, names in found.items() if not path.endswith("errors.py")}
    assert outside == {}, f"exception classes outside {package}'s errors module: {outside}"


def test_help_documents_every_exit_code(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["--help"])
    assert exited.value.code == 0
    help_text = capsys.readouterr().out
    for code, meaning in EXIT_CODE_MEANINGS:
        first_words = re.escape(" ".join(meaning.split()[:3]))
        assert re.search(rf"^\s+{code}\s+{first_words}", help_text, re.MULTILINE), code


def test_a_library_error_reaches_the_user_as_one_line_and_its_exit_code(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    os.symlink("/etc/passwd", workspace / "escape")  # a snapshot refuses links that leave it
    assert main(["sandbox", "run", str(workspace), "--", "true"]) == SnapshotError.exit_code
    err = capsys.readouterr().err
    assert err.startswith("rollyard: error: snapshot ") and "points outside" in err
    assert err.count("\n") == 1


def test_a_multi_line_message_is_printed_on_one_line() -> None:
    assert one_line(PrefectServerError("exited:\n  Traceback ...\n\n  OSError: port")) == (
        "exited:; Traceback ...; OSError: port"
    )
