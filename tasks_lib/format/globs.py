"""Path globs for protected paths: `**` spans directories, `*` stays inside one name, and a
pattern without `/` matches a file or directory name at any depth (as in .gitignore)."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable


@functools.lru_cache(maxsize=1024)
def _compile(pattern: str) -> re.Pattern[str]:
    anchored = "/" in pattern.rstrip("/")
    body = pattern.strip("/")
    out: list[str] = []
    i = 0
    while i < len(body):
        if body.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif body.startswith("**", i):
            out.append(".*")
            i += 2
        elif body[i] == "*":
            out.append("[^/]*")
            i += 1
        elif body[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(body[i]))
            i += 1
    regex = "".join(out)
    # A pattern also covers everything below a directory it names.
    if anchored:
        return re.compile(f"^{regex}(?:/.*)?$")
    return re.compile(f"^(?:.*/)?{regex}(?:/.*)?$")


def glob_matches(pattern: str, path: str) -> bool:
    """Whether the workspace-relative POSIX `path` falls under `pattern`."""
    return _compile(pattern).match(path) is not None


def first_match(patterns: Iterable[str], path: str) -> str | None:
    for pattern in patterns:
        if glob_matches(pattern, path):
            return pattern
    return None
