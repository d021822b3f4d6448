"""Artifact comparison: a candidate's output bytes against a reference, with declared tolerances.

Runs on the host, never in the sandbox: the reference is read from the task directory and the
candidate's artifact is only parsed (Arrow's CSV and Parquet readers, `json`), never executed.
Every mismatch comes back as one line naming the column, row or value, so a reviewer (or an LLM
agent reading its observation) can see what was wrong.
"""

from __future__ import annotations

import io
import json
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from tasks_lib.errors import ArtifactError
from tasks_lib.format.spec import OutputSpec

if TYPE_CHECKING:
    import pyarrow as pa

# pyarrow is imported where tables are read and compared: loading it costs most of a second,
# which a verifier process that never meets a table (pytest tasks) should not pay.

MAX_ROWS = 200_000
MAX_REPORTED = 3


def read_table(data: bytes, fmt: str) -> pa.Table:
    """`data` as an Arrow table of format `fmt` (csv, parquet or json rows)."""
    import pyarrow as pa
    import pyarrow.csv as pacsv
    import pyarrow.parquet as pq

    try:
        if fmt == "csv":
            table = pacsv.read_csv(io.BytesIO(data))
        elif fmt == "parquet":
            table = pq.read_table(io.BytesIO(data))
        elif fmt == "json":
            rows = json.loads(data)
            if isinstance(rows, dict) and "rows" in rows:
                rows = rows["rows"]
            if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
                raise ArtifactError("a JSON table must be a list of objects")
            table = pa.Table.from_pylist(rows)
        else:
            raise ArtifactError(f"format {fmt!r} holds no table")
    except (pa.ArrowException, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactError(f"not readable as {fmt}: {str(error).splitlines()[0][:200]}") from error
    if table.num_rows > MAX_ROWS:
        raise ArtifactError(f"{table.num_rows} rows; at most {MAX_ROWS} are compared")
    return table


def _json_value(data: bytes, field: str | None) -> Any:
    try:
        value = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ArtifactError(f"not valid JSON: {error}") from error
    for part in (field or "").split(".") if field else ():
        if not isinstance(value, dict) or part not in value:
            raise ArtifactError(f"has no key {field!r}")
        value = value[part]
    return value


def _number(value: Any) -> float:
    if isinstance(value, bool):
        raise ArtifactError(f"{value!r} is not a number")
    if isinstance(value, int | float):
        return float(value)
    try:
        return float(str(value).strip())
    except ValueError:
        raise ArtifactError(f"{str(value)[:60]!r} is not a number") from None


def _close(a: float, b: float, spec: OutputSpec) -> bool:
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    return math.isclose(a, b, rel_tol=spec.rel_tol, abs_tol=spec.abs_tol)


def _scalar_text(data: bytes, fmt: str, field: str | None) -> Any:
    if fmt == "json":
        return _json_value(data, field)
    if fmt == "csv":
        table = read_table(data, "csv")
        if table.num_columns < 1 or table.num_rows < 1:
            raise ArtifactError("the CSV holds no value")
        return table.column(0)[0].as_py()
    return data.decode("utf-8", errors="replace").strip()


def _values(data: bytes, fmt: str, field: str | None) -> list[Any]:
    if fmt in ("csv", "parquet"):
        table = read_table(data, fmt)
        if table.num_columns < 1:
            raise ArtifactError("the table has no column")
        values: list[Any] = table.column(0).to_pylist()
        return values
    if fmt == "json":
        value = _json_value(data, field)
        if not isinstance(value, list):
            raise ArtifactError("the JSON value is not a list")
        return value
    return [
        line.strip() for line in data.decode("utf-8", errors="replace").splitlines() if line.strip()
    ]


def _normal(value: Any) -> Any:
    """Set members compare by value: 3 and 3.0 are one member, text is stripped."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, str):
        return value.strip()
    return value


def compare_artifact(candidate: bytes, reference: bytes, spec: OutputSpec) -> list[str]:
    """Mismatches of `candidate` against `reference` (empty when they match)."""
    try:
        if spec.compare == "table":
            return compare_tables(
                read_table(candidate, spec.format), read_table(reference, spec.format), spec
            )
        if spec.compare == "number":
            got = _number(_scalar_text(candidate, spec.format, spec.field))
            want = _number(_scalar_text(reference, spec.format, spec.field))
            return (
                [] if _close(got, want, spec) else [f"value {got!r} differs from the expected one"]
            )
        if spec.compare == "set":
            got_items = [_normal(v) for v in _values(candidate, spec.format, spec.field)]
            want_items = [_normal(v) for v in _values(reference, spec.format, spec.field)]
            if spec.ordered:
                return (
                    [] if got_items == want_items else ["the items differ from the expected list"]
                )
            missing, extra = set(want_items) - set(got_items), set(got_items) - set(want_items)
            problems = []
            if missing:
                problems.append(f"{len(missing)} expected item(s) missing")
            if extra:
                problems.append(
                    f"{len(extra)} unexpected item(s), e.g. {sorted(map(str, extra))[:MAX_REPORTED]}"
                )
            return problems
        if spec.compare == "json":
            return _json_diff(
                _json_value(candidate, spec.field), _json_value(reference, spec.field), spec, "$"
            )
        got_text = candidate.decode("utf-8", errors="replace").strip()
        want_text = reference.decode("utf-8", errors="replace").strip()
        return [] if got_text == want_text else ["the text differs from the expected one"]
    except ArtifactError as error:
        return [str(error)]
    except TypeError as error:  # unhashable set members and the like
        return [f"cannot compare: {error}"]


def _json_diff(got: Any, want: Any, spec: OutputSpec, where: str) -> list[str]:
    if isinstance(want, bool) or isinstance(got, bool):
        return [] if got is want else [f"{where}: {got!r} != expected"]
    if isinstance(want, int | float) and isinstance(got, int | float):
        return [] if _close(float(got), float(want), spec) else [f"{where}: {got!r} differs"]
    if isinstance(want, dict) and isinstance(got, dict):
        problems = [f"{where}.{k}: missing" for k in sorted(set(want) - set(got))]
        for key in sorted(set(want) & set(got)):
            problems += _json_diff(got[key], want[key], spec, f"{where}.{key}")
        return problems[:MAX_REPORTED]
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{where}: {len(got)} items, expected {len(want)}"]
        if not spec.ordered:
            key = lambda item: json.dumps(item, sort_keys=True)  # noqa: E731
            want, got = sorted(want, key=key), sorted(got, key=key)
        problems = []
        for index, (g, w) in enumerate(zip(got, want, strict=True)):
            problems += _json_diff(g, w, spec, f"{where}[{index}]")
        return problems[:MAX_REPORTED]
    return [] if got == want else [f"{where}: {str(got)[:40]!r} != expected"]


def _is_numeric(type_: pa.DataType) -> bool:
    import pyarrow as pa

    return bool(
        pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)
    )


def _kind(type_: pa.DataType) -> str:
    import pyarrow as pa

    if _is_numeric(type_):
        return "number"
    if pa.types.is_boolean(type_):
        return "boolean"
    if pa.types.is_temporal(type_):
        return "temporal"
    if pa.types.is_null(type_):
        return "null"
    return "text"


def compare_tables(got: pa.Table, want: pa.Table, spec: OutputSpec) -> list[str]:
    """Schema-aware: the compared columns must exist with a compatible kind (number, text,
    boolean, temporal); the row count must match; numbers compare within the tolerances; rows
    are matched on `key` (or every non-float column) unless `ordered`."""
    import pyarrow as pa

    columns = list(spec.columns or want.column_names)
    problems = []
    missing = [c for c in columns if c not in got.column_names]
    if missing:
        return [f"missing column(s) {missing}; the table has {got.column_names[:10]}"]
    for name in columns:
        want_kind, got_kind = (
            _kind(want.schema.field(name).type),
            _kind(got.schema.field(name).type),
        )
        if "null" not in (want_kind, got_kind) and want_kind != got_kind:
            problems.append(f"column {name!r} holds {got_kind} values, expected {want_kind}")
    if problems:
        return problems
    if got.num_rows != want.num_rows:
        return [f"{got.num_rows} rows, expected {want.num_rows}"]
    got, want = got.select(columns), want.select(columns)
    if not spec.ordered:
        keys = list(spec.key) or [
            c for c in columns if not pa.types.is_floating(want.schema.field(c).type)
        ]
        keys = keys or columns
        got, want = _sorted(got, keys), _sorted(want, keys)
    for name in columns:
        numeric = _is_numeric(want.schema.field(name).type)
        left, right = got.column(name).to_pylist(), want.column(name).to_pylist()
        bad = [
            index for index, (g, w) in enumerate(zip(left, right, strict=True))
            if not _cell_equal(g, w, numeric, spec)
        ]  # fmt: skip
        if bad:
            problems.append(
                f"column {name!r}: {len(bad)} row(s) differ (first at sorted row {bad[0]})"
            )
    return problems


def _sorted(table: pa.Table, keys: Sequence[str]) -> pa.Table:
    import pyarrow as pa
    import pyarrow.compute as pc

    casted = {
        k: pc.cast(table.column(k), pa.string())
        if _kind(table.schema.field(k).type) == "text"
        else table.column(k)
        for k in keys
    }
    order = pc.sort_indices(pa.table(casted), sort_keys=[(k, "ascending") for k in keys])
    return table.take(order)


def _cell_equal(got: Any, want: Any, numeric: bool, spec: OutputSpec) -> bool:
    if got is None or want is None:
        return got is None and want is None
    if numeric:
        return _close(float(got), float(want), spec)
    if isinstance(got, str) and isinstance(want, str):
        return got.strip() == want.strip()
    return bool(got == want)
