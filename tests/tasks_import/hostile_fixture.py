"""A small src-layout project whose tests use the styles real repositories use: parametrized ids
holding `%`, `-`, `+`, `:`, brackets, spaces and non-ASCII text, data-driven cases read from a
JSON file, unittest classes (one inheriting its tests from a module that is not a test file), and
one test whose parametrized ids change on every run."""

from __future__ import annotations

import json
from pathlib import Path

LIBRARY = '''\
"""Date formatting and small helpers."""


def pad(number, width):
    text = str(abs(number))
    while len(text) < width:
        text = "0" + text
    return ("-" if number < 0 else "") + text


def format_date(year, month, day, pattern):
    """A tiny strftime: %Y, %m, %d and %% in `pattern`."""
    out = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if char == "%" and index + 1 < len(pattern):
            code = pattern[index + 1]
            if code == "Y":
                out.append(pad(year, 4))
            elif code == "m":
                out.append(pad(month, 2))
            elif code == "d":
                out.append(pad(day, 2))
            elif code == "%":
                out.append("%")
            else:
                raise ValueError("unknown code %" + code)
            index += 2
        else:
            out.append(char)
            index += 1
    return "".join(out)


def is_leap(year):
    return year % 4 == 0 and (year % 100 != 0 or year % 400 == 0)


def clamp(value, low, high):
    if value < low:
        return low
    if value > high:
        return high
    return value
'''

TEST_IDS = """\
import uuid

import pytest

from dateish.fmt import format_date, pad


@pytest.mark.parametrize(
    "year, month, day, pattern, expected",
    [
        (1985, 4, 12, "%Y-%m-%d", "1985-04-12"),
        (1985, 4, 12, "%Y%m%d", "19850412"),
        (2024, 1, 2, "+%Y [%m] %d", "+2024 [01] 02"),
        (7, 11, 30, "%Y:%m:%d", "0007:11:30"),
        (2000, 2, 29, "100%% %d", "100% 29"),
    ],
)
def test_format(year, month, day, pattern, expected):
    assert format_date(year, month, day, pattern) == expected


@pytest.mark.parametrize(
    "number, width, expected",
    [
        pytest.param(5, 3, "005", id="with space [x] %s + -1"),
        pytest.param(-5, 3, "-005", id="a::b"),
        pytest.param(12, 2, "12", id="12:30"),
        pytest.param(1, 1, "1", id="na\\u00efve-\\u65e5\\u672c"),
    ],
)
def test_pad(number, width, expected):
    assert pad(number, width) == expected


def test_unknown_code():
    with pytest.raises(ValueError):
        format_date(1, 1, 1, "%Q")


@pytest.mark.parametrize("width", [1, 2], ids=lambda width: f"run-{uuid.uuid4().hex[:8]}")
def test_varying(width):
    assert len(pad(7, width)) == width
"""

TEST_DATA = """\
import json
from pathlib import Path

import pytest

from dateish.fmt import is_leap

CASES = json.loads((Path(__file__).parent / "data" / "leap.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize("case", CASES, ids=[case["name"] for case in CASES])
def test_leap(case):
    assert is_leap(case["year"]) is case["leap"]
"""

LEAP_CASES = [
    {"name": "2024: leap", "year": 2024, "leap": True},
    {"name": "1900 (century) — not leap", "year": 1900, "leap": False},
    {"name": "2000 [400 rule]", "year": 2000, "leap": True},
    {"name": "2023", "year": 2023, "leap": False},
]

BASE_CASES = '''\
from dateish.fmt import clamp


class ClampCases:
    """Tests shared by unittest classes; this module is not a test file."""

    def test_inside(self):
        self.assertEqual(clamp(3, 0, 5), 3)

    def test_low(self):
        self.assertEqual(clamp(-1, 0, 5), 0)
'''

TEST_UNIT = """\
import unittest

from base_cases import ClampCases

from dateish.fmt import clamp, pad


class TestClamp(ClampCases, unittest.TestCase):
    def test_high(self):
        self.assertEqual(clamp(9, 0, 5), 5)


class TestPad(unittest.TestCase):
    def test_negative(self):
        self.assertEqual(pad(-42, 4), "-0042")

    def test_wide(self):
        self.assertEqual(pad(42, 1), "42")
"""


def make_hostile_project(root: Path) -> Path:
    package = root / "src" / "dateish"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""dateish."""\n')
    (package / "fmt.py").write_text(LIBRARY, encoding="utf-8")
    tests = root / "tests"
    (tests / "data").mkdir(parents=True)
    (tests / "test_ids.py").write_text(TEST_IDS, encoding="utf-8")
    (tests / "test_data.py").write_text(TEST_DATA, encoding="utf-8")
    (tests / "data" / "leap.json").write_text(
        json.dumps(LEAP_CASES, ensure_ascii=False), encoding="utf-8"
    )
    (tests / "base_cases.py").write_text(BASE_CASES, encoding="utf-8")
    (tests / "test_unit.py").write_text(TEST_UNIT, encoding="utf-8")
    (root / "pyproject.toml").write_text('[project]\nname = "dateish"\nversion = "0.1"\n')
    return root
