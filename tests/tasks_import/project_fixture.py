"""A small generated Python project with a pytest suite, for synthesis tests."""

from __future__ import annotations

from pathlib import Path

LIBRARY = '''\
"""Small text and number helpers (with a non-ASCII docstring: café)."""


def clamp(value, low, high):
    if low > high:
        raise ValueError("low must not exceed high")
    if value < low:
        return low
    if value > high:
        return high
    return value


def total(values):
    result = 0
    for value in values:
        if value is None:
            continue
        result += value
    return result


def first_negative(values):
    for index, value in enumerate(values):
        if value < 0:
            break
    else:
        return None
    return index


def slug(text):
    words = [word.lower() for word in text.split() if word]
    return "-".join(words)


class Counter:
    def __init__(self):
        self.counts = {}

    def add(self, key, amount=1):
        self.counts[key] = self.counts.get(key, 0) + amount
        return self.counts[key]

    def most_common(self):
        if not self.counts:
            return None
        return max(self.counts, key=lambda key: (self.counts[key], key))
'''

TESTS = """\
import pytest

from helpers.core import Counter, clamp, first_negative, slug, total


def test_clamp_inside():
    assert clamp(5, 0, 10) == 5


def test_clamp_low():
    assert clamp(-3, 0, 10) == 0


def test_clamp_high():
    assert clamp(30, 0, 10) == 10


def test_clamp_rejects_bad_bounds():
    with pytest.raises(ValueError):
        clamp(1, 5, 0)


def test_total_skips_none():
    assert total([1, None, 2, 3]) == 6


def test_first_negative():
    assert first_negative([3, 1, -2, -5]) == 2
    assert first_negative([1, 2]) is None


def test_slug():
    assert slug("Hello  Big World") == "hello-big-world"


class TestCounter:
    def test_add(self):
        counter = Counter()
        counter.add("a")
        assert counter.add("a", 2) == 3

    def test_most_common(self):
        counter = Counter()
        counter.add("a")
        counter.add("b", 3)
        assert counter.most_common() == "b"
        assert Counter().most_common() is None
"""


def make_project(root: Path, *, src_layout: bool = False) -> Path:
    package = (root / "src" / "helpers") if src_layout else (root / "helpers")
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('"""helpers."""\n')
    (package / "core.py").write_text(LIBRARY, encoding="utf-8")
    (root / "tests").mkdir()
    (root / "tests" / "test_core.py").write_text(TESTS)
    (root / "pyproject.toml").write_text('[project]\nname = "helpers"\nversion = "0.1"\n')
    # Things that must never reach a task workspace:
    (root / ".git").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (package / "__pycache__").mkdir()
    (package / "__pycache__" / "core.cpython-311.pyc").write_bytes(b"\0compiled")
    (package / "core.py.orig").write_text(LIBRARY)
    (package / "core.py~").write_text(LIBRARY)
    return root
