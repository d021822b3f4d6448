"""Artifact comparison and rule validation: comparisons, schema errors, a hand-written task."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks_lib import CandidateChanges, load_task, validate_task, verify
from tasks_lib.format.spec import OutputSpec
from tasks_lib.sources.authoring import TaskFiles, write_task
from tasks_lib.verify.compare import compare_artifact

TABLE = OutputSpec(path="a.csv", format="csv", compare="table", key=("k",), abs_tol=0.01)


def _csv(rows: list[tuple[str, float]]) -> bytes:
    return ("k,v\n" + "".join(f"{k},{v}\n" for k, v in rows)).encode()


def test_tables_match_within_tolerance_in_any_row_order() -> None:
    reference = _csv([("a", 1.0), ("b", 2.5)])
    assert compare_artifact(_csv([("b", 2.504), ("a", 1.0)]), reference, TABLE) == []
    assert compare_artifact(_csv([("b", 2.6), ("a", 1.0)]), reference, TABLE) == [
        "column 'v': 1 row(s) differ (first at sorted row 1)"
    ]
    assert "rows, expected 2" in compare_artifact(_csv([("a", 1.0)]), reference, TABLE)[0]


def test_tables_are_schema_aware() -> None:
    reference = _csv([("a", 1.0)])
    assert "missing column" in compare_artifact(b"k,value\na,1.0\n", reference, TABLE)[0]
    assert compare_artifact(b"k,v\na,one\n", reference, TABLE) == [
        "column 'v' holds text values, expected number"
    ]
    assert "not readable as csv" in compare_artifact(b'k,v\n"a,1\n', reference, TABLE)[0]


def test_ordered_tables_compare_row_by_row() -> None:
    ordered = OutputSpec(path="a.csv", format="csv", compare="table", ordered=True)
    reference = _csv([("a", 1.0), ("b", 2.0)])
    assert compare_artifact(reference, reference, ordered) == []
    assert compare_artifact(_csv([("b", 2.0), ("a", 1.0)]), reference, ordered)


def test_numbers_sets_and_json() -> None:
    number = OutputSpec(path="a.json", format="json", compare="number", field="value", rel_tol=1e-3)
    assert compare_artifact(b'{"value": 100.05}', b'{"value": 100}', number) == []
    assert compare_artifact(b'{"value": 101}', b'{"value": 100}', number)
    assert compare_artifact(b'{"other": 1}', b'{"value": 100}', number) == ["has no key 'value'"]
    members = OutputSpec(path="a.json", format="json", compare="set", field="p")
    assert compare_artifact(b'{"p": ["b", "a"]}', b'{"p": ["a", "b"]}', members) == []
    assert compare_artifact(b'{"p": ["a", "c"]}', b'{"p": ["a", "b"]}', members)
    document = OutputSpec(path="a.json", format="json", compare="json", abs_tol=0.1)
    assert (
        compare_artifact(b'{"x": [1, 2.05], "y": "s"}', b'{"y": "s", "x": [2, 1]}', document) == []
    )


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.text("abcdefgh", min_size=1, max_size=4), st.floats(-1e6, 1e6, allow_nan=False)
        ),
        min_size=1,
        max_size=20,
        unique_by=lambda row: row[0],
    ),
    st.randoms(use_true_random=False),
)
def test_a_table_matches_any_permutation_of_itself(
    rows: list[tuple[str, float]], rng: random.Random
) -> None:
    table = pa.table({"k": [r[0] for r in rows], "v": [r[1] for r in rows]})
    shuffled = table.take(rng.sample(range(len(rows)), len(rows)))
    spec = OutputSpec(path="a.parquet", format="parquet", compare="table", key=("k",))
    import io

    import pyarrow.parquet as pq

    def parquet(t: pa.Table) -> bytes:
        sink = io.BytesIO()
        pq.write_table(t, sink)
        return sink.getvalue()

    assert compare_artifact(parquet(shuffled), parquet(table), spec) == []


def _rules_task(root: Path, checks: list[dict[str, object]], **extra: object) -> Path:
    return write_task(
        TaskFiles(
            task_id="rules-demo",
            instruction="Make `serve.py` answer PING with PONG on port 9123 and write `out.json`.\n",
            workspace={"serve.py": "raise SystemExit('broken')\n", "conf.toml": 'mode = "x"\n'},
            rollyard={"verifier": "rules", "rules": {"checks": checks, **extra}},
            solve_sh=(
                "#!/bin/bash\ncat > serve.py <<'PY'\n"
                "import json, socketserver\n"
                "json.dump({'ok': True}, open('out.json', 'w'))\n"
                "class H(socketserver.StreamRequestHandler):\n"
                "    def handle(self):\n"
                "        if self.rfile.readline().strip() == b'PING':\n"
                "            self.wfile.write(b'PONG\\n')\n"
                "socketserver.TCPServer(('127.0.0.1', 9123), H).serve_forever()\nPY\n"
            ),
        ),
        root / "rules-demo",
    )


CHECKS: list[dict[str, object]] = [
    {"name": "conf_parses", "kind": "parses", "path": "conf.toml", "format": "toml"},
    {
        "name": "answers",
        "kind": "service",
        "start": "python serve.py",
        "port": 9123,
        "send": "PING\n",
        "expect_contains": "PONG",
        "timeout_s": 10.0,
    },
    {"name": "writes_json", "kind": "parses", "path": "out.json", "format": "json"},
    {"name": "mentions_ok", "kind": "file_contains", "path": "out.json", "pattern": '"ok": true'},
    {"name": "compiles", "kind": "command", "run": "python -m py_compile serve.py", "hidden": True},
]


def test_rules_task_scores_its_solution_1_and_the_untouched_workspace_0(tmp_path: Path) -> None:
    from tasks_lib import check_task

    task = load_task(_rules_task(tmp_path, CHECKS))
    result = check_task(task)
    assert result.ok, result.problems
    assert result.untouched is not None and result.untouched.tests["answers"] == "failed"
    assert result.untouched.tests["conf_parses"] == "passed"


def test_a_candidate_cannot_seed_the_probe_or_its_result(tmp_path: Path) -> None:
    task = load_task(_rules_task(tmp_path, CHECKS))
    fake = {
        "serve.py": b'print(\'{"connected": true, "body": "PONG"}\')\n',
        ".rollyard/probe.py": b"print('PONG')\n",
        "out.json": b'{"ok": true}',
    }
    result = verify(task, CandidateChanges(files=fake))
    assert result.reward == 0.0
    assert result.tests["answers"] == "failed"
    assert result.tampered


@pytest.mark.parametrize(
    ("table", "field", "message"),
    [
        ({"verifier": "rules"}, "rollyard.rules", "is required by this verifier"),
        ({"verifier": "nope"}, "rollyard.verifier", "is not a known verifier kind"),
        (
            {
                "verifier": "rules",
                "rules": {
                    "checks": [
                        {
                            "name": "a",
                            "kind": "service",
                            "start": "x",
                            "port": 70000,
                            "http_get": "/",
                        }
                    ]
                },
            },
            "rollyard.rules.checks[0].port",
            "must be an integer from 1 to 65535",
        ),
        (
            {"verifier": "rules", "rules": {"checks": [{"name": "a", "kind": "command"}]}},
            "rollyard.rules.checks[0].run",
            "is required by kind 'command'",
        ),
        (
            {
                "verifier": "rules",
                "rules": {
                    "checks": [{"name": "a", "kind": "parses", "path": "x", "format": "yaml"}]
                },
            },
            "rollyard.rules.checks[0].format",
            "is not a known value",
        ),
        (
            {
                "verifier": "artifact",
                "artifact": {"outputs": [{"path": "a.csv", "format": "text", "compare": "table"}]},
            },
            "rollyard.artifact.outputs[0].format",
            "cannot be compared as 'table'",
        ),
        (
            {
                "verifier": "artifact",
                "artifact": {
                    "variants": ["visible", "h1"],
                    "outputs": [{"path": "a.csv", "format": "csv", "compare": "table"}],
                },
            },
            "rollyard.artifact.variants[1]",
            "tests/variants/h1/expected/ does not exist",
        ),
        (
            {"verifier": "tests", "rules": {"checks": []}},
            "rollyard.rules",
            "is set but verifier = 'tests'",
        ),
    ],
)
def test_declaration_errors_name_the_field_and_the_fix(
    tmp_path: Path, table: dict[str, object], field: str, message: str
) -> None:
    task_dir = _rules_task(tmp_path, CHECKS)
    (task_dir / "tests/variants/visible/expected").mkdir(parents=True)
    (task_dir / "tests/variants/visible/expected/a.csv").write_text("k\n")
    import tomllib

    import tomli_w

    document = tomllib.loads((task_dir / "task.toml").read_text())
    document["metadata"]["rollyard"] = {"id": "x", "version": "1", **table}
    (task_dir / "task.toml").write_text(tomli_w.dumps(document))
    issues = validate_task(task_dir)
    assert any(issue.field == field and message in issue.message for issue in issues), [
        str(i) for i in issues
    ]
    assert all(issue.fix for issue in issues)


def test_tables_with_a_json_rows_document(tmp_path: Path) -> None:
    spec = OutputSpec(path="a.json", format="json", compare="table", key=("k",))
    reference = json.dumps([{"k": "a", "v": 1}, {"k": "b", "v": 2}]).encode()
    assert (
        compare_artifact(
            json.dumps({"rows": [{"k": "b", "v": 2}, {"k": "a", "v": 1}]}).encode(), reference, spec
        )
        == []
    )
    sink = pa.BufferOutputStream()
    pacsv.write_csv(pa.table({"k": ["a"]}), sink)
