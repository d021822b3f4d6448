"""Escapes through the query surface: `rollyard query` (and the connection notebooks and the
report use) must neither write, nor read a file outside the store, nor reach for extensions.

Each attack runs through the real CLI entry point and must fail with one line, and the host must
show nothing of it afterwards (no file written, no store file changed, no extension installed).
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from flows.cli import main
from storage import QueryError, TrajectoryStore

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(60)]


def _query(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["query", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _refused(code: int, out: str, err: str, phrase: str = "refused") -> None:
    assert code != 0, out
    assert len(err.strip().splitlines()) == 1 and phrase in err, err
    assert "Traceback" not in err


def _store_digest(store: TrajectoryStore) -> dict[str, str]:
    return {
        str(path.relative_to(store.root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(Path(store.root).rglob("*"))
        if path.is_file()
    }


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private HOME: DuckDB installs extensions under ~/.duckdb."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


@pytest.mark.parametrize(
    "sql",
    [
        "COPY (SELECT 'pwned' AS x) TO '{target}'",
        "COPY episodes TO '{target}' (FORMAT parquet)",
        "ATTACH '{target}' AS pwned",
        "EXPORT DATABASE '{target}'",
        "EXPLAIN ANALYZE COPY (SELECT 1) TO '{target}'",
        "SELECT 1; COPY (SELECT 1) TO '{target}'",
    ],
)
def test_writes_to_a_host_file_are_refused(
    store: TrajectoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str], sql: str
) -> None:
    target = tmp_path / "outside" / "pwned.out"
    target.parent.mkdir()
    _refused(*_query(capsys, "--store", store.root, sql.format(target=target)))
    assert list(target.parent.iterdir()) == []


def test_overwriting_a_store_data_file_is_refused(
    store: TrajectoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    # A store file is readable, so it is on DuckDB's allowlist: only the statement check stops a
    # COPY onto it (DuckDB's allowlist does not tell reads from writes).
    data_file = next(Path(store.root, "episodes").rglob("*.parquet"))
    before = _store_digest(store)
    sql = f"COPY (SELECT 1 AS x) TO '{data_file}' (FORMAT parquet, USE_TMP_FILE false)"
    _refused(*_query(capsys, "--store", store.root, sql))
    assert _store_digest(store) == before


@pytest.mark.parametrize(
    ("sql", "secret"),
    [
        ("SELECT * FROM read_text('/etc/shadow')", "root:"),
        ("SELECT * FROM read_csv('/etc/passwd', sep = ':')", "root:x:0"),
        ("SELECT * FROM read_blob('/etc/hostname')", ""),
        ("SELECT * FROM glob('/etc/*')", "/etc/passwd"),
        # a bare path is no table once external access is off (DuckDB scans no file for it)
        ("SELECT * FROM '/etc/passwd'", "root:x:0"),
        ("SELECT * FROM read_text('{store}/../../../../etc/passwd')", "root:x:0"),
        ("SELECT * FROM read_csv('/proc/self/environ')", "PATH"),
    ],
)
def test_reading_host_files_is_refused(
    store: TrajectoryStore, capsys: pytest.CaptureFixture[str], sql: str, secret: str
) -> None:
    code, out, err = _query(capsys, "--store", store.root, sql.format(store=store.root))
    _refused(code, out, err, "does not exist" if sql.endswith("'/etc/passwd'") else "refused")
    assert out == "" and (not secret or secret not in err)


@pytest.mark.parametrize(
    "sql",
    [
        "INSTALL httpfs",
        "FORCE INSTALL httpfs",
        "LOAD httpfs",
        "SELECT * FROM read_parquet('https://example.invalid/x.parquet')",
        "SET enable_external_access = true",
        "SET allowed_directories = ['/']",
        "RESET lock_configuration",
        "PRAGMA enable_profiling",
    ],
)
def test_extensions_and_configuration_are_out_of_reach(
    store: TrajectoryStore, home: Path, capsys: pytest.CaptureFixture[str], sql: str
) -> None:
    _refused(*_query(capsys, "--store", store.root, sql))
    assert not (home / ".duckdb").exists()


@pytest.mark.parametrize(
    "sql",
    [
        "CREATE TABLE pwned AS SELECT 1",
        "INSERT INTO episodes SELECT * FROM episodes",
        "DROP VIEW episodes",
        "CREATE OR REPLACE VIEW episodes AS SELECT 1",
        "CREATE SECRET pwned (TYPE s3, KEY_ID 'x', SECRET 'y')",
        "CALL checkpoint()",
    ],
)
def test_catalog_writes_are_refused(
    store: TrajectoryStore, capsys: pytest.CaptureFixture[str], sql: str
) -> None:
    before = _store_digest(store)
    _refused(*_query(capsys, "--store", store.root, sql))
    assert _store_digest(store) == before


def test_reading_the_store_still_works(
    store: TrajectoryStore, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _query(
        capsys, "--store", store.root, "--format", "csv", "SELECT count(*) AS n FROM steps"
    )
    assert code == 0, err
    assert out.splitlines()[0] == "n" and int(out.splitlines()[1]) > 0
    code, out, err = _query(capsys, "--store", store.root, "EXPLAIN SELECT * FROM episodes")
    assert code == 0, err


def test_allow_writes_to_writes_only_there(
    store: TrajectoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    exports = tmp_path / "exports"
    exports.mkdir()
    sql = f"COPY (SELECT count(*) AS n FROM episodes) TO '{exports / 'n.csv'}'"
    code, _, err = _query(capsys, "--store", store.root, "--allow-writes-to", str(exports), sql)
    assert code == 0, err
    assert (exports / "n.csv").read_text().split() == ["n", "8"]

    before = _store_digest(store)
    elsewhere = tmp_path / "elsewhere.csv"
    data_file = next(Path(store.root, "episodes").rglob("*.parquet"))
    for target in (elsewhere, exports / ".." / "escaped.csv", data_file):
        sql = f"COPY (SELECT 1 AS x) TO '{target}' (FORMAT csv, USE_TMP_FILE false)"
        _refused(*_query(capsys, "--store", store.root, "--allow-writes-to", str(exports), sql))
    assert not elsewhere.exists() and not (tmp_path / "escaped.csv").exists()
    assert _store_digest(store) == before
    _refused(
        *_query(
            capsys, "--store", store.root, "--allow-writes-to", str(exports),
            "CREATE TABLE t AS SELECT 1",
        )
    )  # fmt: skip


@pytest.mark.parametrize("inside", ["store", "store/episodes", "."])
def test_an_export_directory_overlapping_the_store_is_refused(
    store: TrajectoryStore, tmp_path: Path, capsys: pytest.CaptureFixture[str], inside: str
) -> None:
    directory = tmp_path / inside
    code, _, err = _query(
        capsys, "--store", store.root, "--allow-writes-to", str(directory), "SELECT 1"
    )
    assert code != 0 and "overlaps the store" in err and len(err.strip().splitlines()) == 1


def test_the_notebook_connection_runs_reading_sql_only(
    store: TrajectoryStore, tmp_path: Path
) -> None:
    target = tmp_path / "pwned.csv"
    with store.connect() as con:
        assert con.sql("SELECT count(*) FROM episodes").fetchall() == [(8,)]
        for sql in (
            f"COPY (SELECT 1) TO '{target}'",
            "SELECT * FROM read_text('/etc/shadow')",
            "INSTALL httpfs",
            "SET enable_external_access = true",
        ):
            with pytest.raises(QueryError, match="refused"):
                con.sql(sql)
        # The Python relation API meets the locked allowlist too.
        with pytest.raises(Exception, match="disabled by configuration"):
            con.sql("SELECT 1 AS x").write_csv(str(target))
    assert not target.exists()
    assert os.listdir(tmp_path) == ["store"]
