"""Settings tasks: a small package's `settings.py` holds a few constants; the instruction names
one whose value is wrong and the value it must have. Its pytest suite checks every constant.

Two vocabularies: `settings` (integer constants of one of several packages) and `flags` (boolean
flags of the one package `app`: the edit is a choice among a closed set — which flag, True or
False — that the instruction decides, for models too small to copy numbers out of a prompt).

Sized for a tiny language model acting through tool calls: the prompt (system, tools,
instruction) stays within ~600 tokens, and one exact edit solves a task. The constants and their
values are drawn per task (and the package, for `settings`), and the hidden test checks the value
the instruction asks for: a policy that writes the wrong name or value, edits another constant or
breaks the file fails the tests. Without the instruction a `flags` task is a guess among the
file's 3-4 flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import random
from collections.abc import Callable
from pathlib import Path

from tasks_lib.format.model import DEFAULT_HIDDEN_DIR, DEFAULT_WORKSPACE_DIR
from tasks_lib.sources.authoring.writer import (
    FIX_PATCH,
    REWARD_FROM_EXIT,
    TaskFiles,
    dockerfile,
    harbor_test_sh,
    patch_solve_sh,
    write_numbered_tasks,
    write_task,
)

FAMILY = "settings"
FLAGS_FAMILY = "flags"
FLAGS_PACKAGE = "app"
# Words that the tiny models' BPE tokenizer (`training.lm.tiny`) keeps as one token wherever they
# stand (after a backquote, a quote or a newline): the flag a reply names is then one token that
# also stands in the instruction, not a spelling to assemble from pieces.
FLAGS = ("cache", "verify", "report", "strip", "copy", "raw", "append", "split")
PACKAGES = ("billing", "crawler", "mailer", "reports", "scheduler", "uploader", "search", "cache")
CONSTANTS = (
    "MAX_RETRIES",
    "TIMEOUT_S",
    "BATCH_SIZE",
    "PAGE_SIZE",
    "POOL_SIZE",
    "PORT",
    "MAX_WORKERS",
    "CACHE_TTL_S",
    "QUEUE_LIMIT",
    "CHUNK_SIZE",
    "MAX_ITEMS",
    "BACKOFF_MS",
)
HIDDEN_SUBDIR = DEFAULT_HIDDEN_DIR.removeprefix("tests/")
TEST_COMMAND = "python -m pytest tests"


@dataclasses.dataclass(frozen=True, slots=True)
class SettingsTaskPlan:
    task_id: str
    seed: int
    index: int
    package: str
    values: tuple[tuple[str, int | bool], ...]
    """The constants as the task wants them, in file order."""
    target: str
    """The constant whose value is wrong in the workspace."""
    wrong_value: int | bool
    family: str = FAMILY

    @property
    def right_value(self) -> int | bool:
        return dict(self.values)[self.target]


def plan_settings_task(seed: int, index: int) -> SettingsTaskPlan:
    """The task of `index` under `seed` (the same whatever the count)."""
    rng = random.Random(f"rollyard-settings:{seed}:{index}")
    names = rng.sample(CONSTANTS, rng.randint(3, 4))
    values = tuple((name, rng.randrange(2, 100)) for name in names)
    target = rng.choice(names)
    right = dict(values)[target]
    wrong = rng.choice([v for v in range(2, 100) if v != right])
    return SettingsTaskPlan(
        task_id=f"settings-{seed}-{index:04d}",
        seed=seed,
        index=index,
        package=rng.choice(PACKAGES),
        values=values,
        target=target,
        wrong_value=wrong,
    )


def plan_flags_task(seed: int, index: int) -> SettingsTaskPlan:
    """The `flags` task of `index` under `seed`: 3-4 boolean flags of `app/settings.py`, one of
    them the opposite of what the task wants."""
    rng = random.Random(f"rollyard-flags:{seed}:{index}")
    names = rng.sample(FLAGS, rng.randint(3, 4))
    values = tuple((name, rng.random() < 0.5) for name in names)
    target = rng.choice(names)
    return SettingsTaskPlan(
        task_id=f"{FLAGS_FAMILY}-{seed}-{index:04d}",
        seed=seed,
        index=index,
        package=FLAGS_PACKAGE,
        values=values,
        target=target,
        wrong_value=not dict(values)[target],
        family=FLAGS_FAMILY,
    )


def _settings_py(plan: SettingsTaskPlan, *, fixed: bool) -> str:
    lines = [f'"""Settings of {plan.package}."""', ""]
    for name, value in plan.values:
        shown = value if fixed or name != plan.target else plan.wrong_value
        lines.append(f"{name} = {shown}")
    return "\n".join(lines) + "\n"


def _test_module(plan: SettingsTaskPlan) -> str:
    lines = [f"from {plan.package} import settings", ""]
    for name, value in plan.values:
        lines += ["", f"def test_{name.lower()}():", f"    assert settings.{name} == {value}", ""]
    return "\n".join(lines)


def _instruction(plan: SettingsTaskPlan) -> str:
    # A flag's current value goes unsaid: it is the opposite of the value asked for, and saying
    # it would put both `True` and `False` in the instruction, to be told apart by position
    # alone. The file shows it too.
    current = "" if plan.family == FLAGS_FAMILY else f"It is {plan.wrong_value} now. "
    return (
        f"Set `{plan.target}` in `{plan.package}/settings.py` to {plan.right_value}. "
        f"{current}Keep the other settings. Tests: `{TEST_COMMAND}`.\n"
    )


_TEST_SH = harbor_test_sh(
    "installs the hidden tests, runs the suite, writes the reward.",
    "cp -r /tests/hidden/. /workspace/\n"
    "cd /workspace\n"
    "PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 PYTHONDONTWRITEBYTECODE=1 \\\n"
    "    python -m pytest -p no:cacheprovider -q tests\n" + REWARD_FROM_EXIT,
)


def write_settings_task(plan: SettingsTaskPlan, task_dir: Path) -> Path:
    """Write `plan` as a Harbor task directory (replacing `task_dir` if it exists)."""
    path = f"{plan.package}/settings.py"
    broken, fixed = _settings_py(plan, fixed=False), _settings_py(plan, fixed=True)
    patch = "".join(
        difflib.unified_diff(
            broken.splitlines(keepends=True),
            fixed.splitlines(keepends=True),
            fromfile=f"a/{path}",
            tofile=f"b/{path}",
        )
    )
    test_file = "tests/test_settings.py"
    tests = [f"{test_file}::test_{name.lower()}" for name, _ in plan.values]
    target_test = f"{test_file}::test_{plan.target.lower()}"
    files = TaskFiles(
        task_id=plan.task_id,
        instruction=_instruction(plan),
        workspace={
            f"{plan.package}/__init__.py": f'"""{plan.package}."""\n',
            path: broken,
            test_file: _test_module(plan),
        },
        rollyard={
            "id": plan.task_id,
            "version": "1",
            "family": plan.family,
            "source": f"rollyard {plan.family} generator, seed {plan.seed}, index {plan.index}",
            "difficulty": "easy",
            "workspace_dir": DEFAULT_WORKSPACE_DIR,
            "test_command": TEST_COMMAND,
            "hidden_dir": DEFAULT_HIDDEN_DIR,
            "fail_to_pass": [target_test],
            "pass_to_pass": [t for t in tests if t != target_test],
            "hidden_tests": [],
            "limits": {"wall_time_s": 60.0, "memory_mb": 1024, "verify_timeout_s": 120.0},
        },
        solve_sh=patch_solve_sh(f"set {plan.target} to {plan.right_value}."),
        # The hidden copy of the suite replaces the visible one at grading: editing the tests
        # gains nothing.
        tests={f"{HIDDEN_SUBDIR}/{test_file}": _test_module(plan)},
        solution={FIX_PATCH: patch},
        test_sh=_TEST_SH,
        metadata={
            "author_name": f"rollyard {plan.family} generator",
            "difficulty": "easy",
            "category": "configuration",
            "tags": ["python", "settings", "tiny-model"],
        },
        dockerfile=dockerfile('"pytest>=8,<10"'),
    )
    return write_task(files, task_dir)


def generate_settings_tasks(
    out_dir: str | Path,
    count: int,
    seed: int = 0,
    *,
    progress: Callable[[int, Path], None] | None = None,
) -> list[Path]:
    """Write `count` settings tasks under `out_dir` (one directory per task id)."""
    return write_numbered_tasks(
        out_dir,
        count,
        write_one=lambda index, task_dir: write_settings_task(
            plan_settings_task(seed, index), task_dir
        ),
        name=lambda index: f"settings-{seed}-{index:04d}",
        progress=progress,
    )


def generate_flags_tasks(
    out_dir: str | Path,
    count: int,
    seed: int = 0,
    *,
    progress: Callable[[int, Path], None] | None = None,
) -> list[Path]:
    """Write `count` flags tasks under `out_dir` (one directory per task id)."""
    return write_numbered_tasks(
        out_dir,
        count,
        write_one=lambda index, task_dir: write_settings_task(
            plan_flags_task(seed, index), task_dir
        ),
        name=lambda index: f"{FLAGS_FAMILY}-{seed}-{index:04d}",
        progress=progress,
    )
