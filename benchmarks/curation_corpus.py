"""The curation benchmark's distinct tasks: two small generated repositories (for synthesis) and
the labelled corpus of demo-family and synthesized tasks (`distinct_tasks`), cached under the
work directory between runs with the same arguments."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import time
import tomllib
from pathlib import Path

from sandboxes import SandboxError
from tasks_lib import generate_demo_tasks, load_task
from tasks_lib.sources.synthesize import synthesize_tasks

ATTEMPTS = 8
"""Tries of a step that opens sandboxes: on a shared host other jobs' mounts come and go, and
bwrap's setup fails now and then (`Can't bind mount /oldroot/`); that is the host, not curation."""

# -- two generated repositories --------------------------------------------------------------------

REPOSITORIES = {
    "geomkit": (
        "geomkit/shapes.py",
        '''\
"""Plane geometry helpers."""


def rectangle_area(width, height):
    if width < 0 or height < 0:
        raise ValueError("sides must not be negative")
    return width * height


def perimeter(points):
    total = 0.0
    for index in range(len(points)):
        x1, y1 = points[index]
        x2, y2 = points[(index + 1) % len(points)]
        total += ((x2 - x1) ** 2 + (y2 - y1) ** 2) ** 0.5
    return total


def bounding_box(points):
    if not points:
        return None
    xs = [x for x, _ in points]
    ys = [y for _, y in points]
    return (min(xs), min(ys), max(xs), max(ys))


def contains(box, point):
    left, bottom, right, top = box
    x, y = point
    return left <= x <= right and bottom <= y <= top


def centroid(points):
    count = len(points)
    if count == 0:
        raise ValueError("no points")
    return (sum(x for x, _ in points) / count, sum(y for _, y in points) / count)


def scale_points(points, factor, origin=(0, 0)):
    ox, oy = origin
    return [(ox + (x - ox) * factor, oy + (y - oy) * factor) for x, y in points]


def manhattan(a, b):
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def closest_pair_distance(points):
    best = None
    for i in range(len(points)):
        for j in range(i + 1, len(points)):
            distance = manhattan(points[i], points[j])
            if best is None or distance < best:
                best = distance
    return best
''',
        """\
import pytest

from geomkit.shapes import (
    bounding_box, centroid, closest_pair_distance, contains, manhattan, perimeter,
    rectangle_area, scale_points,
)


def test_rectangle_area():
    assert rectangle_area(3, 4) == 12
    assert rectangle_area(0, 5) == 0


def test_rectangle_area_rejects_negative_sides():
    with pytest.raises(ValueError):
        rectangle_area(-1, 2)


def test_perimeter_of_square():
    assert perimeter([(0, 0), (2, 0), (2, 2), (0, 2)]) == 8.0


def test_perimeter_of_triangle():
    assert perimeter([(0, 0), (3, 0), (3, 4)]) == 12.0


def test_bounding_box():
    assert bounding_box([(1, 5), (-2, 3), (4, -1)]) == (-2, -1, 4, 5)
    assert bounding_box([]) is None


def test_contains_inside_and_edge():
    assert contains((0, 0, 4, 4), (2, 3))
    assert contains((0, 0, 4, 4), (4, 0))


def test_contains_outside():
    assert not contains((0, 0, 4, 4), (5, 1))
    assert not contains((0, 0, 4, 4), (1, -1))


def test_centroid():
    assert centroid([(0, 0), (4, 0), (4, 4), (0, 4)]) == (2.0, 2.0)


def test_centroid_of_nothing():
    with pytest.raises(ValueError):
        centroid([])


def test_scale_points_about_origin():
    assert scale_points([(1, 2), (3, 4)], 2) == [(2, 4), (6, 8)]


def test_scale_points_about_center():
    assert scale_points([(3, 3)], 3, origin=(1, 1)) == [(7, 7)]


def test_manhattan():
    assert manhattan((1, 1), (4, 5)) == 7
    assert manhattan((-1, 0), (1, 0)) == 2


def test_closest_pair_distance():
    assert closest_pair_distance([(0, 0), (5, 5), (1, 1), (9, 0)]) == 2
    assert closest_pair_distance([(0, 0)]) is None
""",
    ),
    "ledgerbook": (
        "ledgerbook/entries.py",
        '''\
"""Bookkeeping over simple ledger entries: (account, amount in cents) pairs."""


def balance(entries, account):
    total = 0
    for name, amount in entries:
        if name == account:
            total += amount
    return total


def accounts(entries):
    seen = []
    for name, _ in entries:
        if name not in seen:
            seen.append(name)
    return sorted(seen)


def largest_debit(entries):
    debits = [amount for _, amount in entries if amount < 0]
    if not debits:
        return 0
    return min(debits)


def format_cents(cents):
    sign = "-" if cents < 0 else ""
    cents = abs(cents)
    return f"{sign}{cents // 100}.{cents % 100:02d}"


def split_evenly(total, parts):
    if parts <= 0:
        raise ValueError("parts must be positive")
    share, left = divmod(total, parts)
    return [share + 1 if index < left else share for index in range(parts)]


def running_totals(amounts):
    totals = []
    current = 0
    for amount in amounts:
        current += amount
        totals.append(current)
    return totals


def overdrawn(entries):
    return [name for name in accounts(entries) if balance(entries, name) < 0]


def apply_fee(amount, percent, minimum=25):
    fee = amount * percent // 100
    return amount - max(fee, minimum)
''',
        """\
import pytest

from ledgerbook.entries import (
    accounts, apply_fee, balance, format_cents, largest_debit, overdrawn, running_totals,
    split_evenly,
)

ENTRIES = [("cash", 500), ("rent", -300), ("cash", -120), ("food", -80), ("rent", 100)]


def test_balance():
    assert balance(ENTRIES, "cash") == 380
    assert balance(ENTRIES, "none") == 0


def test_accounts_sorted_unique():
    assert accounts(ENTRIES) == ["cash", "food", "rent"]


def test_largest_debit():
    assert largest_debit(ENTRIES) == -300
    assert largest_debit([("a", 5)]) == 0


def test_format_cents():
    assert format_cents(12345) == "123.45"
    assert format_cents(-5) == "-0.05"
    assert format_cents(100) == "1.00"


def test_split_evenly():
    assert split_evenly(10, 3) == [4, 3, 3]
    assert split_evenly(9, 3) == [3, 3, 3]


def test_split_evenly_rejects_no_parts():
    with pytest.raises(ValueError):
        split_evenly(10, 0)


def test_running_totals():
    assert running_totals([5, -2, 10]) == [5, 3, 13]
    assert running_totals([]) == []


def test_overdrawn():
    assert overdrawn(ENTRIES) == ["food", "rent"]


def test_apply_fee_percent():
    assert apply_fee(10000, 2) == 9800


def test_apply_fee_minimum():
    assert apply_fee(1000, 1) == 975
""",
    ),
}


def make_repository(root: Path, name: str) -> Path:
    module, source, tests = REPOSITORIES[name]
    project = root / name
    (project / module).parent.mkdir(parents=True)
    (project / module).parent.joinpath("__init__.py").write_text(f'"""{name}."""\n')
    (project / module).write_text(source)
    (project / "tests").mkdir()
    (project / "tests" / f"test_{Path(module).stem}.py").write_text(tests)
    (project / "pyproject.toml").write_text(f'[project]\nname = "{name}"\nversion = "0.1"\n')
    return project


# -- labelled corpus -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    """A task directory with its label."""

    task_dir: Path
    task_id: str
    group: str
    """Ground truth: tasks with one group are one task (an original and its copies)."""
    origin: str
    """`demo`, or the repository a synthesized task comes from."""
    kind: str | None = None
    """The planted copy's transformation; None for a distinct task."""


def _bugs(task_dir: Path) -> tuple[str, ...]:
    document = tomllib.loads((task_dir / "task.toml").read_text())
    return tuple(sorted(document["metadata"]["bugs"]))


def distinct_tasks(
    root: Path, demo_tasks: int, synth_tasks: int, seed: int
) -> tuple[list[Item], int]:
    """The distinct tasks and how many demo tasks were set aside as the same bug set again;
    generated under `root/corpus`, or read back from an earlier run with the same arguments."""
    manifest = root / "corpus" / "manifest.json"
    wanted = {"demo_tasks": demo_tasks, "synth_tasks": synth_tasks, "seed": seed}
    if manifest.is_file():
        saved = json.loads(manifest.read_text())
        if saved["arguments"] == wanted:
            items = [Item(Path(d["task_dir"]), d["task_id"], d["group"], d["origin"])
                     for d in saved["items"]]  # fmt: skip
            return items, saved["same_bugs"]
    shutil.rmtree(root / "corpus", ignore_errors=True)
    items, same_bugs = _generate(root / "corpus", demo_tasks, synth_tasks, seed)
    manifest.write_text(json.dumps({
        "arguments": wanted, "same_bugs": same_bugs,
        "items": [{"task_dir": str(i.task_dir), "task_id": i.task_id, "group": i.group,
                   "origin": i.origin} for i in items],
    }))  # fmt: skip
    return items, same_bugs


def _generate(root: Path, demo_tasks: int, synth_tasks: int, seed: int) -> tuple[list[Item], int]:
    items: list[Item] = []
    seen: set[tuple[str, ...]] = set()
    same_bugs = 0
    for task_dir in generate_demo_tasks(root / "demo", demo_tasks, seed=seed):
        bugs = _bugs(task_dir)
        if bugs in seen:
            same_bugs += 1
            continue
        seen.add(bugs)
        items.append(Item(task_dir, load_task(task_dir).id, task_dir.name, "demo"))
    for name in REPOSITORIES:
        project = make_repository(root / "projects", name)
        for attempt in range(ATTEMPTS):
            try:
                report = synthesize_tasks(project, root / name, max_tasks=synth_tasks, seed=seed)
                break
            except SandboxError as error:  # the host's sandboxes broke, not the benchmark
                print(f"synthesis of {name}, attempt {attempt + 1}: {error}", file=sys.stderr)
                shutil.rmtree(root / name, ignore_errors=True)
                time.sleep(2)
        else:
            raise SystemExit(f"synthesis of {name} failed {ATTEMPTS} times on sandbox errors")
        for task_dir in map(Path, report.task_dirs):
            items.append(Item(task_dir, load_task(task_dir).id, task_dir.name, name))
    return items, same_bugs
