"""How `rollyard` commands print: results to stdout in one `--format table|json|csv` (json is JSON
lines, one object per row, printed as rows come), progress bars and logs to stderr.

Every command that prints results adds the option with `add_format_option` and hands each result
row to `emit` (a mapping of column to value); `flows.cli.main` prints them in the chosen format
(`printing_results`). Free text (a summary line, a hint) goes to stderr through `note`. A
command running for more than a few seconds shows a `progress` bar, silent when stderr is not a
terminal.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

FORMATS = ("table", "json", "csv")
TABLE_MAX_ROWS = 200
"""A terminal table longer than this is cut; --format csv or json prints every row."""
CELL_MAX_CHARS = 60


def add_format_option(parser: argparse.ArgumentParser, *, default: str = "table") -> None:
    """The `--format` option of a command that prints results (`default`: what it printed before
    the option existed, so scripts keep working)."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default=default,
        help="how results are printed: an aligned table for people, json (one object per line) "
        "or csv for programs",
    )


class ResultPrinter:
    """Prints result rows to stdout in one format: json and csv as each row comes (a stream can
    be piped while it runs), table once all rows are in (`close`, or leaving the `with`)."""

    def __init__(self, output_format: str, *, columns: Sequence[str] | None = None) -> None:
        if output_format not in FORMATS:
            raise ValueError(f"output format {output_format!r}; use one of {FORMATS}")
        self.output_format = output_format
        self.columns = list(columns) if columns is not None else None
        self._rows: list[Mapping[str, Any]] = []
        self._csv: Any = None
        self._count = 0

    def __enter__(self) -> ResultPrinter:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if error is None:
            self.close()

    def row(self, row: Mapping[str, Any]) -> None:
        """Print (or, for a table, keep) one result row."""
        self._count += 1
        if self.output_format == "json":
            print(json.dumps(dict(row), default=str), flush=True)
        elif self.output_format == "csv":
            if self._csv is None:
                self.columns = self.columns or list(row)
                self._csv = csv.writer(sys.stdout, lineterminator="\n")
                self._csv.writerow(self.columns)
            self._csv.writerow([_csv_cell(row.get(column)) for column in self.columns or ()])
            sys.stdout.flush()
        elif len(self._rows) < TABLE_MAX_ROWS:
            self._rows.append(row)  # the rest are only counted: a table shows this many

    def rows(self, rows: Iterable[Mapping[str, Any]]) -> None:
        for row in rows:
            self.row(row)

    def close(self) -> None:
        """Print the table (table format); nothing for the streaming formats."""
        if self.output_format != "table" or (self._count == 0 and self.columns is None):
            return  # streamed already, or a command that printed no rows (it rendered its own)
        columns = self.columns or list(dict.fromkeys(k for row in self._rows for k in row))
        shown = self._rows
        cells = [[_table_cell(row.get(c)) for c in columns] for row in shown]
        widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
        if columns:
            print("  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True)).rstrip())
            print("  ".join("-" * w for w in widths))
        for cell_row in cells:
            print("  ".join(c.ljust(w) for c, w in zip(cell_row, widths, strict=True)).rstrip())
        more = self._count - len(shown)
        suffix = f" ({more} not shown; use --format csv or json)" if more > 0 else ""
        print(f"({self._count} row{'s' if self._count != 1 else ''}){suffix}")
        self._rows, self._count = [], 0


_PRINTER: ResultPrinter | None = None


@contextmanager
def printing_results(output_format: str | None) -> Iterator[None]:
    """Rows given to `emit` while the block runs are printed in `output_format` (json when
    None); a table once the block ends without an error."""
    global _PRINTER
    outer = _PRINTER
    _PRINTER = ResultPrinter(output_format or "json")
    try:
        yield
        _PRINTER.close()
    finally:
        _PRINTER = outer


def emit(row: Mapping[str, Any]) -> None:
    """Print one result row in the command's `--format` (JSON lines outside a command)."""
    if _PRINTER is None:
        print(json.dumps(dict(row), default=str), flush=True)
    else:
        _PRINTER.row(row)


def note(text: str) -> None:
    """A line for the person at the terminal (a summary, a hint), on stderr: never a result."""
    print(text, file=sys.stderr, flush=True)


def print_results(
    rows: Iterable[Mapping[str, Any]], output_format: str, *, columns: Sequence[str] | None = None
) -> None:
    """Print result rows in `output_format` (see `ResultPrinter`)."""
    with ResultPrinter(output_format, columns=columns) as printer:
        printer.rows(rows)


def _csv_cell(value: Any) -> Any:
    # Python's csv rather than Arrow's: Arrow cannot write list columns such as `flags`.
    if value is None:
        return ""
    if isinstance(value, list | tuple | dict):
        return json.dumps(value, default=str)
    return value


def _table_cell(value: Any) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, list | tuple | dict):
        value = json.dumps(value, default=str)
    text = str(value).replace("\n", "\\n")
    return text if len(text) <= CELL_MAX_CHARS else text[: CELL_MAX_CHARS - 1] + "…"


@contextmanager
def progress(description: str, total: int | None = None) -> Iterator[Callable[[int], None]]:
    """A progress bar on stderr while the block runs, for commands that run for more than a few
    seconds; yields `advance(n)`. Silent when stderr is not a terminal (pipes, CI, tests)."""
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        SpinnerColumn,
        TextColumn,
        TimeElapsedColumn,
    )

    console = Console(file=sys.stderr)
    bar = Progress(
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )
    with bar:
        task = bar.add_task(description, total=total)

        def advance(steps: int = 1) -> None:
            bar.advance(task, steps)

        yield advance
