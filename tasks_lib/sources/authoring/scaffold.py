"""`rollyard tasks new FAMILY_NAME`: a family module to start from, with its test and docs.

The scaffold is a working family (it generates tasks that pass validation and the oracle check
as written), so an author changes one thing at a time and the test says when something broke:

    <dir>/<name>/__init__.py            exports generate_tasks
    <dir>/<name>/generate.py            plan (seeded) -> files -> write_task
    <dir>/<name>/README.md              what the family asks, how it is verified, what to change
    <dir>/<name>/test_<name>_family.py  generate, validate, oracle check, lint, determinism
"""

from __future__ import annotations

import keyword
import re
from pathlib import Path

from tasks_lib.errors import ScaffoldError

NAME_PATTERN = re.compile(r"^[a-z][a-z0-9_]{0,47}$")
VERIFIER_CHOICES = ("artifact", "rules")


_INIT = '''\
"""The {name} task family."""

from .generate import FAMILY, generate_tasks, plan_task

__all__ = ["FAMILY", "generate_tasks", "plan_task"]
'''

_GENERATE_HEAD = '''\
"""The {name} family: {summary}

Everything is drawn from `random.Random(f"{name}:{{seed}}:{{index}}")`, so a seed fixes the tasks
and task N is the same whatever the count. Change `plan_task` (what a task is), `_files` (what
the agent sees, the references, the reference solution) and the verifier table in `_rollyard`.
"""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path

from tasks_lib.sources.authoring.writer import TaskFiles, write_task

FAMILY = "{name}"
WORDS = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel")
HIDDEN_VARIANTS = 2


@dataclasses.dataclass(frozen=True, slots=True)
class Plan:
    task_id: str
    seed: int
    index: int
    visible: tuple[str, ...]
    """The words of the visible input file."""
    hidden: tuple[tuple[str, ...], ...]
    """The words of each hidden variant (same format, other content)."""


def _words(rng: random.Random) -> tuple[str, ...]:
    while True:
        words = tuple(rng.choice(WORDS) for _ in range(rng.randint(20, 60)))
        counts = sorted((words.count(w) for w in set(words)), reverse=True)
        if len(counts) < 2 or counts[0] != counts[1]:  # one clear answer
            return words


def plan_task(seed: int, index: int) -> Plan:
    rng = random.Random(f"{name}:{{seed}}:{{index}}")
    visible = _words(rng)
    hidden = tuple(_words(rng) for _ in range(HIDDEN_VARIANTS))
    return Plan(f"{task_prefix}-{{seed}}-{{index:04d}}", seed, index, visible, hidden)


def _most_common(words: tuple[str, ...]) -> str:
    return max(sorted(set(words)), key=words.count)
'''

_ARTIFACT_BODY = """

def _answer(words: tuple[str, ...]) -> str:
    return json.dumps({{"word": _most_common(words), "count": words.count(_most_common(words))}})


def _files(plan: Plan) -> TaskFiles:
    variants = ["visible", *(f"hidden-{{i + 1}}" for i in range(len(plan.hidden)))]
    tests = {{"variants/visible/expected/answer.json": _answer(plan.visible)}}
    for name, words in zip(variants[1:], plan.hidden, strict=True):
        tests[f"variants/{{name}}/overlay/input.txt"] = " ".join(words) + "\\n"
        tests[f"variants/{{name}}/expected/answer.json"] = _answer(words)
    return TaskFiles(
        task_id=plan.task_id,
        instruction=(
            "# Find the most common word\\n\\n"
            "Edit `solve.py` so that `python solve.py` reads `input.txt` and writes `answer.json` "
            'as `{{"word": ..., "count": ...}}`. It is run again on other inputs.\\n'
        ),
        workspace={{
            "input.txt": " ".join(plan.visible) + "\\n",
            "solve.py": 'raise NotImplementedError("read input.txt, write answer.json")\\n',
        }},
        rollyard=_rollyard(plan, variants),
        solve_sh="#!/bin/bash\\nset -euo pipefail\\ncp \\"$(dirname \\"$0\\")/solve.py\\" solve.py\\n",
        solution={{"solve.py": (
            "import collections, json\\n"
            "words = open('input.txt').read().split()\\n"
            "counts = collections.Counter(words)\\n"
            "word = max(sorted(counts), key=counts.__getitem__)\\n"
            "json.dump({{'word': word, 'count': counts[word]}}, open('answer.json', 'w'))\\n"
        )}},
        tests=tests,
        metadata={{"category": "{name}"}},
    )


def _rollyard(plan: Plan, variants: list[str]) -> dict[str, object]:
    return {{
        "family": FAMILY,
        "source": f"{name} generator, seed {{plan.seed}}, index {{plan.index}}",
        "difficulty": "easy",
        "verifier": "artifact",
        "protected": ["input.txt"],
        "artifact": {{
            "command": "python solve.py",
            "timeout_s": 30.0,
            "variants": variants,
            "outputs": [{{"path": "answer.json", "format": "json", "compare": "json"}}],
        }},
    }}
"""

_RULES_BODY = """

def _files(plan: Plan) -> TaskFiles:
    hidden = plan.hidden[0]
    return TaskFiles(
        task_id=plan.task_id,
        instruction=(
            "# Fix the word-count job\\n\\n"
            "`python job.py` should read `input.txt` and write `out/summary.json` as "
            '`{{"top": <most common word>, "words": <word count>}}`, but it crashes. Fix it; '
            "it is run again on other inputs.\\n"
        ),
        workspace={{
            "input.txt": " ".join(plan.visible) + "\\n",
            "job.py": (
                "import collections, json, os\\n"
                "words = open('input.txt').read().split()\\n"
                "counts = collections.Counter(words)\\n"
                "top = max(sorted(counts), key=counts.__getitem__)\\n"
                "os.makedirs('out', exist_ok=True)\\n"
                "json.dump({{'top': top, 'words': len(word)}}, open('out/summary.json', 'w'))\\n"
            ),
        }},
        rollyard=_rollyard(plan, hidden),
        solve_sh="#!/bin/bash\\nset -euo pipefail\\nsed -i 's/len(word)/len(words)/' job.py\\n",
        tests={{"overlay/input.txt": " ".join(hidden) + "\\n"}},
        metadata={{"category": "{name}"}},
    )


def _rollyard(plan: Plan, hidden: tuple[str, ...]) -> dict[str, object]:
    return {{
        "family": FAMILY,
        "source": f"{name} generator, seed {{plan.seed}}, index {{plan.index}}",
        "difficulty": "easy",
        "verifier": "rules",
        "protected": ["input.txt"],
        "rules": {{
            "overlay_dir": "tests/overlay",
            "checks": [
                {{"name": "job_completes", "kind": "command", "run": "python job.py"}},
                {{"name": "summary_parses", "kind": "parses", "path": "out/summary.json", "format": "json"}},
                {{
                    "name": "summary_right", "kind": "file_contains", "path": "out/summary.json",
                    "text": json.dumps({{"top": _most_common(hidden), "words": len(hidden)}}),
                    "hidden": True,
                }},
            ],
        }},
    }}
"""

_GENERATE_TAIL = '''

def generate_tasks(out_dir: str | Path, count: int, seed: int = 0) -> list[Path]:
    """Write `count` tasks of the family under `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for index in range(count):
        plan = plan_task(seed, index)
        paths.append(write_task(_files(plan), out / plan.task_id))
    return paths
'''

_TEST = '''\
"""The {name} family: every generated task validates, passes the oracle check and lint."""

import filecmp
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from {name} import generate_tasks  # noqa: E402

from tasks_lib import check_task, load_task, validate_task  # noqa: E402
from tasks_lib.sources.authoring.lint import lint_task  # noqa: E402


def test_generated_tasks_validate_and_pass_the_oracle_check(tmp_path):
    for task_dir in generate_tasks(tmp_path / "tasks", count=2, seed=0):
        assert validate_task(task_dir) == ()
        result = check_task(load_task(task_dir))
        assert result.ok, result.problems


def test_generated_tasks_are_not_weak(tmp_path):
    (task_dir,) = generate_tasks(tmp_path / "tasks", count=1, seed=1)
    report = lint_task(task_dir)
    assert not report.weak, report.to_json()


def test_same_seed_same_tasks(tmp_path):
    first = generate_tasks(tmp_path / "a", count=2, seed=3)
    second = generate_tasks(tmp_path / "b", count=2, seed=3)
    for left, right in zip(first, second):
        comparison = filecmp.dircmp(left, right)
        assert not comparison.diff_files and not comparison.left_only and not comparison.right_only
'''

_README = """\
# The `{name}` task family

Scaffolded by `rollyard tasks new {name} --verifier {verifier}`. {summary}

- `generate.py`: `plan_task(seed, index)` draws a task; `_files(plan)` says what the agent sees
  (`workspace`), what the verifier compares or checks (`tests`, never visible to the agent), and
  the reference solution (`solve_sh`, `solution`); `_rollyard` declares the verifier.
- `test_{name}_family.py`: every generated task validates, its solution scores 1 and its
  untouched workspace 0, `rollyard tasks lint` finds nothing weak, and a seed fixes the tasks.

Run it: `python -m pytest {name}/test_{name}_family.py`. Generate tasks:

    python -c "from {name} import generate_tasks; generate_tasks('tasks/{name}', 10, seed=0)"
    rollyard tasks validate tasks/{name} && rollyard tasks check tasks/{name} && rollyard tasks lint tasks/{name}

See docs/authoring.md of rollyard for the walk-through.
"""

SUMMARIES = {
    "artifact": "the agent writes a script whose answer file is compared with references, on the "
    "visible input and on hidden variants (artifact verifier).",
    "rules": "the agent fixes a job; rules check that it completes and that its output is right "
    "on hidden input (rule verifier).",
}


def scaffold_family(name: str, dest_dir: str | Path, *, verifier: str = "artifact") -> list[Path]:
    """Write the family `name` under `dest_dir/name`; returns the files written."""
    if not NAME_PATTERN.match(name) or keyword.iskeyword(name):
        raise ScaffoldError(
            f"family name {name!r} is not a Python package name; use lower-case letters, digits "
            "and '_', starting with a letter"
        )
    if verifier not in VERIFIER_CHOICES:
        raise ScaffoldError(f"verifier {verifier!r}: choose one of {', '.join(VERIFIER_CHOICES)}")
    package = Path(dest_dir) / name
    if package.exists():
        raise ScaffoldError(f"{package} already exists; choose another name or directory")
    summary = SUMMARIES[verifier]
    values = {
        "name": name,
        "task_prefix": name.replace("_", "-"),
        "summary": summary,
        "verifier": verifier,
    }
    body = _ARTIFACT_BODY if verifier == "artifact" else _RULES_BODY
    files = {
        "__init__.py": _INIT.format(**values),
        "generate.py": (_GENERATE_HEAD + body + _GENERATE_TAIL).format(**values),
        "README.md": _README.format(**values),
        f"test_{name}_family.py": _TEST.format(**values),
    }
    partial = package.with_name(name + ".partial")
    partial.mkdir(parents=True)
    for rel, text in files.items():
        (partial / rel).write_text(text, encoding="utf-8")
    partial.rename(package)
    return [package / rel for rel in files]
