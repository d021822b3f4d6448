"""The modules a demo project is assembled from: realistic small functions with docstrings that
state the intended behaviour, hand-picked visible inputs, and random generators for hidden inputs.

Functions use `for` loops only (no `while`, no recursion), so no injected bug can make a test
loop forever.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Callable
from typing import Any

Args = tuple[Any, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class FunctionCases:
    visible: tuple[Args, ...]
    """Inputs of the tests the agent sees (edge cases included)."""
    hidden: Callable[[random.Random], Args]
    """Draws one input for a hidden test."""


@dataclasses.dataclass(frozen=True, slots=True)
class ModuleSpec:
    name: str
    source: str
    cases: dict[str, FunctionCases]
    depends_on: tuple[str, ...] = ()


def _ints(rng: random.Random, low: int, high: int, min_len: int = 0, max_len: int = 7) -> list[int]:
    return [rng.randint(low, high) for _ in range(rng.randint(min_len, max_len))]


def _words(rng: random.Random, count: int) -> str:
    vocabulary = [
        "alpha",
        "beta",
        "Gamma",
        "delta",
        "sun",
        "moon",
        "Sun",
        "river",
        "stone",
        "tree",
        "a",
        "the",
    ]
    punctuation = ["", "", "", ",", ".", "!"]
    return " ".join(rng.choice(vocabulary) + rng.choice(punctuation) for _ in range(count))


def _items(rng: random.Random) -> list[dict[str, Any]]:
    return [
        {
            "sku": f"S{index}{rng.randint(0, 9)}",
            "qty": rng.randint(0, 12),
            "price": rng.randint(1, 900),
        }
        for index in range(rng.randint(1, 5))
    ]


def _entries(rng: random.Random) -> list[tuple[str, int]]:
    accounts = ["cash", "rent", "food", "travel"]
    return [(rng.choice(accounts), rng.randint(-500, 500)) for _ in range(rng.randint(1, 7))]


STATS = ModuleSpec(
    name="stats",
    source='''"""Descriptive statistics over plain lists of numbers."""


def mean(values):
    """Arithmetic mean of `values`, rounded to 6 decimals; 0.0 for an empty list."""
    if len(values) == 0:
        return 0.0
    total = 0
    for value in values:
        total += value
    return round(total / len(values), 6)


def median(values):
    """Middle value of the sorted values (mean of the two middle ones for even lengths);
    None for an empty list."""
    if not values:
        return None
    ordered = sorted(values)
    middle = len(ordered) // 2
    if len(ordered) % 2 == 1:
        return ordered[middle]
    return (ordered[middle - 1] + ordered[middle]) / 2


def value_range(values):
    """Largest minus smallest value; 0 for fewer than two values."""
    if len(values) < 2:
        return 0
    lowest = values[0]
    highest = values[0]
    for value in values[1:]:
        if value < lowest:
            lowest = value
        if value > highest:
            highest = value
    return highest - lowest


def clamp(value, lower, upper):
    """`value` limited to the closed interval [lower, upper]."""
    if value < lower:
        return lower
    if value > upper:
        return upper
    return value


def moving_sum(values, window):
    """Sums of each run of `window` consecutive values; [] when the window does not fit."""
    if window <= 0 or window > len(values):
        return []
    sums = []
    for start in range(len(values) - window + 1):
        sums.append(sum(values[start:start + window]))
    return sums
''',
    cases={
        "mean": FunctionCases(
            ((([1, 2, 3, 4]),), ([],), ([-3, 5, 10],), ([7],)), lambda r: (_ints(r, -20, 50),)
        ),
        "median": FunctionCases(
            (([3, 1, 2],), ([4, 1, 3, 2],), ([],), ([5],)), lambda r: (_ints(r, -9, 30),)
        ),
        "value_range": FunctionCases(
            (([4, 9, 1],), ([5],), ([-2, -8, 3, 0],), ([2, 2],)), lambda r: (_ints(r, -40, 40),)
        ),
        "clamp": FunctionCases(
            ((5, 0, 10), (-3, 0, 10), (12, 0, 10), (10, 0, 10), (0, 0, 10)),
            lambda r: (r.randint(-15, 25), r.randint(-5, 3), r.randint(5, 12)),
        ),
        "moving_sum": FunctionCases(
            (([1, 2, 3, 4], 2), ([1, 2, 3], 3), ([1, 2], 3), ([5, 6, 7], 1), ([1, 2], 0)),
            lambda r: (_ints(r, -9, 9, 1, 7), r.randint(0, 5)),
        ),
    },
)

TEXTFMT = ModuleSpec(
    name="textfmt",
    source='''"""Small text helpers for reports: slugs, truncation, padding, word counts."""


def slugify(text):
    """Lower-case `text`, keep letters and digits, join the words with single dashes."""
    words = []
    current = ""
    for char in text.lower():
        if char.isalnum():
            current += char
        elif current:
            words.append(current)
            current = ""
    if current:
        words.append(current)
    return "-".join(words)


def truncate(text, limit, suffix="..."):
    """`text` cut to at most `limit` characters, ending in `suffix` when it was cut."""
    if len(text) <= limit:
        return text
    if limit <= len(suffix):
        return suffix[:limit]
    return text[:limit - len(suffix)] + suffix


def word_counts(text):
    """How often each lower-cased word occurs (surrounding punctuation stripped), as a dict."""
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,;:!?")
        if not word:
            continue
        counts[word] = counts.get(word, 0) + 1
    return counts


def pad_left(text, width, fill=" "):
    """`text` right-aligned in a field of `width` characters (unchanged when it is wider)."""
    missing = width - len(text)
    if missing <= 0:
        return text
    return fill * missing + text


def initials(name):
    """Upper-case initials of each part of a name, e.g. 'ada lovelace' -> 'AL'."""
    letters = []
    for part in name.split():
        letters.append(part[0].upper())
    return "".join(letters)
''',
    cases={
        "slugify": FunctionCases(
            (("Hello, World!",), ("  many   spaces ",), ("Route 66 north",), ("",)),
            lambda r: (_words(r, r.randint(0, 5)),),
        ),
        "truncate": FunctionCases(
            (("abcdefghij", 6), ("short", 10), ("abcdef", 2), ("abcdef", 6)),
            lambda r: (
                "".join(r.choice("abcdefgh") for _ in range(r.randint(0, 12))),
                r.randint(0, 9),
            ),
        ),
        "word_counts": FunctionCases(
            (("the sun and the moon",), ("Go, go, GO!",), ("",)),
            lambda r: (_words(r, r.randint(0, 8)),),
        ),
        "pad_left": FunctionCases(
            (("7", 3), ("abc", 2), ("ab", 5, "*"), ("", 2, "0")),
            lambda r: (
                "".join(r.choice("xyz") for _ in range(r.randint(0, 5))),
                r.randint(0, 7),
                r.choice([" ", "0", "."]),
            ),
        ),
        "initials": FunctionCases(
            (("ada lovelace",), ("Grace Brewster Hopper",), ("x",)),
            lambda r: (
                _words(r, r.randint(1, 4)).replace(",", "").replace(".", "").replace("!", ""),
            ),
        ),
    },
)

INVENTORY = ModuleSpec(
    name="inventory",
    source='''"""Stock keeping: items are dicts with 'sku', 'qty' and 'price' (in cents)."""


def total_value(items):
    """Value of all stock in cents: the sum of qty * price."""
    total = 0
    for item in items:
        total += item["qty"] * item["price"]
    return total


def low_stock(items, threshold):
    """SKUs whose quantity is below `threshold`, in input order."""
    result = []
    for item in items:
        if item["qty"] < threshold:
            result.append(item["sku"])
    return result


def restock(items, sku, amount):
    """A new item list where `sku` has `amount` more units; the input is not changed."""
    updated = []
    for item in items:
        if item["sku"] == sku:
            item = dict(item, qty=item["qty"] + amount)
        updated.append(item)
    return updated


def most_valuable(items):
    """SKU with the highest qty * price (the first one on ties); None when there are no items."""
    best_sku = None
    best_value = -1
    for item in items:
        value = item["qty"] * item["price"]
        if value > best_value:
            best_value = value
            best_sku = item["sku"]
    return best_sku


def apply_discount(price, percent):
    """`price` in cents reduced by `percent` percent, rounded down to a whole cent; 0 from 100%."""
    if percent >= 100:
        return 0
    return price * (100 - percent) // 100
''',
    cases={
        "total_value": FunctionCases(
            (([{"sku": "A", "qty": 2, "price": 150}, {"sku": "B", "qty": 1, "price": 99}],), ([],)),
            lambda r: (_items(r),),
        ),
        "low_stock": FunctionCases(
            (
                (
                    [
                        {"sku": "A", "qty": 2, "price": 1},
                        {"sku": "B", "qty": 5, "price": 1},
                        {"sku": "C", "qty": 3, "price": 1},
                    ],
                    3,
                ),
            ),
            lambda r: (_items(r), r.randint(0, 10)),
        ),
        "restock": FunctionCases(
            (
                ([{"sku": "A", "qty": 2, "price": 5}, {"sku": "B", "qty": 0, "price": 7}], "B", 4),
                ([{"sku": "A", "qty": 1, "price": 5}], "Z", 3),
            ),
            lambda r: (
                _items(r),
                r.choice(["S0", "S1", "S2"]) + str(r.randint(0, 9)),
                r.randint(1, 6),
            ),
        ),
        "most_valuable": FunctionCases(
            (
                (
                    [
                        {"sku": "A", "qty": 2, "price": 10},
                        {"sku": "B", "qty": 1, "price": 30},
                        {"sku": "C", "qty": 3, "price": 10},
                    ],
                ),
                ([],),
                ([{"sku": "Z", "qty": 0, "price": 5}],),
            ),
            lambda r: (_items(r),),
        ),
        "apply_discount": FunctionCases(
            ((1000, 15), (999, 10), (500, 100), (250, 0)),
            lambda r: (r.randint(1, 5000), r.choice([0, 5, 10, 25, 33, 50, 99, 100, 120])),
        ),
    },
)

SCHEDULE = ModuleSpec(
    name="schedule",
    source='''"""Day arithmetic without datetime: leap years, month lengths and free time slots."""


def is_leap_year(year):
    """Gregorian rule: every 4th year, except centuries not divisible by 400."""
    if year % 400 == 0:
        return True
    if year % 100 == 0:
        return False
    return year % 4 == 0


def days_in_month(year, month):
    """Number of days in `month` (1-12) of `year`."""
    if month == 2:
        return 29 if is_leap_year(year) else 28
    if month in (4, 6, 9, 11):
        return 30
    return 31


def day_of_year(year, month, day):
    """1-based position of the date within its year."""
    total = day
    for earlier in range(1, month):
        total += days_in_month(year, earlier)
    return total


def overlaps(start_a, end_a, start_b, end_b):
    """Whether the half-open intervals [start_a, end_a) and [start_b, end_b) share a moment."""
    return start_a < end_b and start_b < end_a


def free_slots(busy, day_start, day_end):
    """Gaps between sorted, non-overlapping busy (start, end) pairs, within the day."""
    slots = []
    cursor = day_start
    for start, end in busy:
        if start > cursor:
            slots.append((cursor, start))
        cursor = max(cursor, end)
    if cursor < day_end:
        slots.append((cursor, day_end))
    return slots
''',
    cases={
        "is_leap_year": FunctionCases(
            ((2024,), (1900,), (2000,), (2023,)),
            lambda r: (r.choice([1600, 1700, 1996, 2100, 2400, r.randint(1800, 2200)]),),
        ),
        "days_in_month": FunctionCases(
            ((2023, 2), (2024, 2), (2023, 4), (2023, 12)),
            lambda r: (r.choice([1900, 2000, 2023, 2024]), r.randint(1, 12)),
        ),
        "day_of_year": FunctionCases(
            ((2023, 1, 1), (2023, 3, 1), (2024, 3, 1), (2023, 12, 31)),
            lambda r: (r.choice([2000, 2023, 2024]), r.randint(1, 12), r.randint(1, 28)),
        ),
        "overlaps": FunctionCases(
            ((1, 5, 4, 8), (1, 5, 5, 8), (6, 9, 1, 3), (2, 3, 1, 9)),
            lambda r: (lambda a, b: (a, a + r.randint(1, 6), b, b + r.randint(1, 6)))(
                r.randint(0, 10), r.randint(0, 10)
            ),
        ),
        "free_slots": FunctionCases(
            (([(9, 10), (12, 13)], 8, 17), ([(8, 12)], 8, 12), ([], 9, 11)),
            lambda r: (
                sorted({(s, s + 1) for s in range(8, 17, 2) if r.random() < 0.5}),
                r.choice([7, 8, 9]),
                r.choice([16, 17, 18]),
            ),
        ),
    },
)

GRID = ModuleSpec(
    name="grid",
    source='''"""Geometry on an integer grid: points are (x, y) tuples."""


def manhattan(a, b):
    """Manhattan distance between two points."""
    return abs(a[0] - b[0]) + abs(a[1] - b[1])


def bounding_box(points):
    """(min_x, min_y, max_x, max_y) of the points; None when there are none."""
    if not points:
        return None
    xs = [point[0] for point in points]
    ys = [point[1] for point in points]
    return (min(xs), min(ys), max(xs), max(ys))


def neighbours(point, width, height):
    """The up-to-four orthogonal neighbours of `point` inside a width x height grid."""
    x, y = point
    result = []
    for dx, dy in ((1, 0), (-1, 0), (0, 1), (0, -1)):
        nx, ny = x + dx, y + dy
        if 0 <= nx < width and 0 <= ny < height:
            result.append((nx, ny))
    return result


def path_length(points):
    """Total Manhattan length of the path that visits `points` in order."""
    total = 0
    for index in range(1, len(points)):
        total += manhattan(points[index - 1], points[index])
    return total


def inside(point, box):
    """Whether `point` lies within the closed box (min_x, min_y, max_x, max_y)."""
    x, y = point
    min_x, min_y, max_x, max_y = box
    return min_x <= x <= max_x and min_y <= y <= max_y
''',
    cases={
        "manhattan": FunctionCases(
            (((0, 0), (3, 4)), ((2, -1), (-2, 3)), ((5, 5), (5, 5))),
            lambda r: ((r.randint(-9, 9), r.randint(-9, 9)), (r.randint(-9, 9), r.randint(-9, 9))),
        ),
        "bounding_box": FunctionCases(
            (([(1, 2), (3, -1), (0, 5)],), ([],), ([(4, 4)],)),
            lambda r: ([(r.randint(-9, 9), r.randint(-9, 9)) for _ in range(r.randint(0, 5))],),
        ),
        "neighbours": FunctionCases(
            (((0, 0), 3, 3), ((1, 1), 3, 3), ((2, 1), 3, 2)),
            lambda r: ((r.randint(0, 4), r.randint(0, 4)), r.randint(1, 5), r.randint(1, 5)),
        ),
        "path_length": FunctionCases(
            (([(0, 0), (2, 0), (2, 3)],), ([(1, 1)],), ([],)),
            lambda r: ([(r.randint(-5, 5), r.randint(-5, 5)) for _ in range(r.randint(0, 5))],),
        ),
        "inside": FunctionCases(
            (
                ((1, 1), (0, 0, 2, 2)),
                ((2, 0), (0, 0, 2, 2)),
                ((3, 1), (0, 0, 2, 2)),
                ((1, -1), (0, 0, 2, 2)),
            ),
            lambda r: (
                (r.randint(-2, 6), r.randint(-2, 6)),
                (0, 0, r.randint(1, 4), r.randint(1, 4)),
            ),
        ),
    },
)

ACCOUNTS = ModuleSpec(
    name="accounts",
    source='''"""Ledger entries are (account, amount_cents) pairs; positive credits, negative debits."""


def balances(entries):
    """Balance per account."""
    totals = {}
    for account, amount in entries:
        totals[account] = totals.get(account, 0) + amount
    return totals


def overdrawn(entries):
    """Accounts whose balance is negative, sorted by name."""
    result = []
    for account, balance in balances(entries).items():
        if balance < 0:
            result.append(account)
    return sorted(result)


def largest_debit(entries):
    """The most negative single amount, or 0 when there is no debit."""
    worst = 0
    for _account, amount in entries:
        if amount < worst:
            worst = amount
    return worst


def split_evenly(amount, parts):
    """`amount` cents split into `parts` shares differing by at most one cent, largest first."""
    if parts <= 0:
        return []
    base = amount // parts
    remainder = amount % parts
    shares = []
    for index in range(parts):
        if index < remainder:
            shares.append(base + 1)
        else:
            shares.append(base)
    return shares


def format_cents(amount):
    """Cents as a dollar string with two decimals, e.g. -1234 -> '-12.34'."""
    sign = "-" if amount < 0 else ""
    amount = abs(amount)
    return f"{sign}{amount // 100}.{amount % 100:02d}"
''',
    cases={
        "balances": FunctionCases(
            (([("cash", 100), ("rent", -50), ("cash", -30)],), ([],)), lambda r: (_entries(r),)
        ),
        "overdrawn": FunctionCases(
            (
                ([("cash", 100), ("rent", -50), ("food", -5), ("food", 10)],),
                ([("b", -1), ("a", -2)],),
            ),
            lambda r: (_entries(r),),
        ),
        "largest_debit": FunctionCases(
            (([("cash", 100), ("rent", -50), ("food", -75)],), ([("cash", 10)],)),
            lambda r: (_entries(r),),
        ),
        "split_evenly": FunctionCases(
            ((100, 3), (10, 5), (7, 0), (2, 4)), lambda r: (r.randint(0, 50), r.randint(0, 6))
        ),
        "format_cents": FunctionCases(
            ((1234,), (-5,), (100,), (0,)), lambda r: (r.randint(-99999, 99999),)
        ),
    },
)

SUMMARY = ModuleSpec(
    name="summary",
    source='''"""Human-readable summaries built from the statistics and text helpers."""

from . import stats, textfmt


def describe(values):
    """One line with count, mean and range, e.g. 'n=3 mean=2.0 range=2'."""
    return f"n={len(values)} mean={stats.mean(values)} range={stats.value_range(values)}"


def top_words(text, count):
    """The `count` most frequent words, most frequent first, ties in alphabetical order."""
    counts = textfmt.word_counts(text)
    ordered = sorted(counts.items(), key=lambda pair: (-pair[1], pair[0]))
    return [word for word, _ in ordered[:count]]


def table_row(label, value, width):
    """`label` then `value` right-aligned, so the row is `width` characters wide."""
    text = str(value)
    return label + textfmt.pad_left(text, width - len(label))


def percent_change(old, new):
    """Change from `old` to `new` in percent, rounded to one decimal; None when old is 0."""
    if old == 0:
        return None
    return round((new - old) / abs(old) * 100, 1)
''',
    cases={
        "describe": FunctionCases((([1, 2, 3],), ([],), ([10, -2],)), lambda r: (_ints(r, -9, 9),)),
        "top_words": FunctionCases(
            (("b a b c a b", 2), ("one two", 5), ("", 1)),
            lambda r: (_words(r, r.randint(0, 9)), r.randint(1, 3)),
        ),
        "table_row": FunctionCases(
            (("total", 42, 10), ("n", 7, 3), ("label", "x", 4)),
            lambda r: (r.choice(["a", "sum", "count"]), r.randint(0, 999), r.randint(2, 9)),
        ),
        "percent_change": FunctionCases(
            ((50, 75), (200, 150), (0, 5), (-10, 10)),
            lambda r: (r.choice([0, r.randint(-100, 100)]), r.randint(-100, 100)),
        ),
    },
    depends_on=("stats", "textfmt"),
)

MODULES: dict[str, ModuleSpec] = {
    spec.name: spec for spec in (STATS, TEXTFMT, INVENTORY, SCHEDULE, GRID, ACCOUNTS, SUMMARY)
}

PACKAGE_NAMES = (
    "ledgerly",
    "shelfkit",
    "tallyhub",
    "routebook",
    "pantrylog",
    "orbitnote",
    "beaconly",
    "gridwise",
    "quillbox",
    "harborline",
    "mintsheet",
    "cobblestone",
)
