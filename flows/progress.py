"""Where the train flow reports its progress (the CLI's live view), as `(event, values)` calls."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

ProgressHook = Callable[[str, dict[str, Any]], None]
_progress_hook: ProgressHook | None = None


def set_progress_hook(hook: ProgressHook | None) -> None:
    """Where the flow reports progress (the CLI's progress bars); None to stop reporting."""
    global _progress_hook
    _progress_hook = hook


def report_progress(event: str, **values: Any) -> None:
    """Tell the progress hook, if one is set, that `event` happened."""
    if _progress_hook is not None:
        _progress_hook(event, values)
