"""Small hand-made Harbor tasks for the curation tests: a clean one, flaky ones (random, clock,
order-dependent tests), copies, near-copies and contaminated ones. Each verifies in well under a
second, so flakiness runs stay cheap."""

from __future__ import annotations

import textwrap
from pathlib import Path

import tomli_w

BUGGY = '''\
"""Small arithmetic helpers."""


def add(a, b):
    """Return the sum of a and b."""
    return a - b


def scale(values, factor):
    """Multiply every value by factor."""
    return [value * factor for value in values]
'''
FIXED = BUGGY.replace("return a - b", "return a + b  # the sum, not the difference")

CLEAN_TESTS = """\
from calc import add, scale


def test_add_small():
    assert add(2, 3) == 5


def test_add_negative():
    assert add(-4, 1) == -3


def test_scale():
    assert scale([1, 2], 3) == [3, 6]
"""

FLAKY_EXTRA = {
    # Three tests that each pass half the time: a flip shows in 3 runs with near certainty.
    "random": "".join(
        f"""

def test_scale_random_{i}():
    import random
    assert random.random() < 0.5
"""
        for i in range(3)
    ),
    "clock": "".join(
        f"""

def test_scale_clock_{i}():
    import time
    assert time.perf_counter_ns() // 1000 % 2 == 0
"""
        for i in range(3)
    ),
    "order": """

_seen = []


def test_scale_setup():
    _seen.append(scale([2], 2))


def test_scale_uses_setup():
    assert _seen == [[4]]
""",
}

INSTRUCTION = """\
# Fix `add` in `calc`

`calc.add(a, b)` should return the sum of its arguments, but the test suite in `tests/` fails
for it. Make `python -m pytest tests` pass by changing `calc.py` only. Mind the negative numbers
and keep `scale` working as it does today.
"""


def write_task(
    root: Path,
    task_id: str,
    *,
    tests: str = CLEAN_TESTS,
    instruction: str = INSTRUCTION,
    buggy: str = BUGGY,
    fixed: str = FIXED,
    fail_to_pass: tuple[str, ...] = (
        "tests/test_calc.py::test_add_small",
        "tests/test_calc.py::test_add_negative",
    ),
    pass_to_pass: tuple[str, ...] = ("tests/test_calc.py::test_scale",),
) -> Path:
    task = root / task_id
    workspace = task / "environment" / "workspace"
    (workspace / "tests").mkdir(parents=True)
    (workspace / "calc.py").write_text(buggy)
    (workspace / "tests" / "test_calc.py").write_text(tests)
    (task / "environment" / "Dockerfile").write_text(
        'FROM python:3.11-slim\nRUN pip install "pytest>=8"\nWORKDIR /workspace\n'
        "COPY workspace/ /workspace/\n"
    )
    (task / "instruction.md").write_text(instruction)
    (task / "solution").mkdir()
    (task / "solution" / "calc.py").write_text(fixed)
    solve = task / "solution" / "solve.sh"
    solve.write_text('#!/bin/bash\nset -eu\ncp "$(dirname "$0")/calc.py" calc.py\n')
    solve.chmod(0o755)
    (task / "tests").mkdir()
    test_sh = task / "tests" / "test.sh"
    test_sh.write_text(
        textwrap.dedent("""\
        #!/bin/bash
        mkdir -p /logs/verifier
        cd /workspace
        if python -m pytest -q -p no:cacheprovider tests; then echo 1; else echo 0; fi \\
            > /logs/verifier/reward.txt
        """)
    )
    test_sh.chmod(0o755)
    document = {
        "version": "1.0",
        "metadata": {"difficulty": "easy", "category": "debugging"},
        "verifier": {"timeout_sec": 60.0},
        "agent": {"timeout_sec": 120.0},
        "rollyard": {
            "id": task_id,
            "version": "1",
            "family": "tiny",
            "source": "curation tests",
            "difficulty": "easy",
            "workspace_dir": "environment/workspace",
            "test_command": "python -m pytest tests",
            "fail_to_pass": list(fail_to_pass),
            "pass_to_pass": list(pass_to_pass),
            "limits": {"wall_time_s": 30.0, "memory_mb": 512, "verify_timeout_s": 60.0},
        },
    }
    (task / "task.toml").write_bytes(tomli_w.dumps(document).encode())
    return task


def flaky_task(root: Path, task_id: str, kind: str) -> Path:
    extra_ids = {
        "random": tuple(f"tests/test_calc.py::test_scale_random_{i}" for i in range(3)),
        "clock": tuple(f"tests/test_calc.py::test_scale_clock_{i}" for i in range(3)),
        "order": (
            "tests/test_calc.py::test_scale_setup",
            "tests/test_calc.py::test_scale_uses_setup",
        ),
    }[kind]
    # A distinct instruction per kind keeps the flaky tasks from being duplicates of each other.
    instruction = INSTRUCTION + f"\nThis variant also checks `scale` ({kind} flavour).\n"
    return write_task(
        root,
        task_id,
        tests=CLEAN_TESTS + FLAKY_EXTRA[kind],
        instruction=instruction,
        pass_to_pass=("tests/test_calc.py::test_scale", *extra_ids),
    )
