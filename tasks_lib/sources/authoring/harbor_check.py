"""Stdlib-only checker for Harbor images: runs a task's declared artifact or rule checks.

    python3 /tests/harbor_check.py /tests/harbor_spec.json /workspace   # prints the reward

Copied into every generated task's `tests/` next to `harbor_spec.json` (the task's `[rollyard]`
artifact or rules table). It mirrors rollyard's verifier in a Harbor container, where the
container itself is the fresh environment: CSV and JSON artifacts (Parquet needs pyarrow, used
when the image has it), number/set/table/json/exact comparisons, file/command/service rules.
"""

import csv
import http.client
import io
import json
import math
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import tomllib
from collections.abc import Callable
from typing import Any

TESTS = os.path.dirname(os.path.abspath(__file__))

# A table of harbor_spec.json (artifact, output, rules or check) and a parsed artifact row: plain
# JSON/CSV whose shape the spec declares, so their values stay untyped.
Spec = dict[str, Any]
Row = dict[str, Any]

PARSERS: dict[str, Callable[[str], object]] = {
    "json": json.loads,
    "toml": tomllib.loads,
    "csv": lambda t: list(csv.reader(io.StringIO(t))),
}


def task_path(rel: str) -> str:
    # Declared paths are task-relative ("tests/variants/..."); here tests/ is this directory.
    return os.path.join(TESTS, rel[len("tests/") :] if rel.startswith("tests/") else rel)


def close(a: float | str, b: float | str, out: Spec) -> bool:
    return math.isclose(
        float(a), float(b), rel_tol=out.get("rel_tol", 0.0), abs_tol=out.get("abs_tol", 0.0)
    )


def rows(data: bytes, fmt: str) -> list[Row]:
    if fmt == "parquet":
        import pyarrow.parquet as pq

        parquet_rows: list[Row] = pq.read_table(io.BytesIO(data)).to_pylist()
        return parquet_rows
    if fmt == "json":
        value = json.loads(data)
        json_rows: list[Row] = value["rows"] if isinstance(value, dict) else value
        return json_rows
    return list(csv.DictReader(io.StringIO(data.decode())))


def field(data: bytes, name: str | None) -> Any:
    value = json.loads(data)
    for part in name.split(".") if name else ():
        value = value[part]
    return value


def number_like(text: Any) -> bool:
    try:
        float(text)
        return True
    except (TypeError, ValueError):
        return False


def same(got: bytes, want: bytes, out: Spec) -> bool:
    mode, fmt = out["compare"], out["format"]
    if mode == "exact":
        return got.decode().strip() == want.decode().strip()
    if mode == "json":
        return json_same(json.loads(got), json.loads(want), out)
    if mode == "number":
        pick: Callable[[bytes], Any] = (
            (lambda d: field(d, out.get("field")))
            if fmt == "json"
            else (
                lambda d: (
                    d.decode().strip() if fmt == "text" else next(iter(rows(d, "csv")[0].values()))
                )
            )
        )
        return close(pick(got), pick(want), out)
    if mode == "set":
        if fmt == "json":
            g, w = field(got, out.get("field")), field(want, out.get("field"))
        elif fmt == "text":
            g, w = got.decode().split(), want.decode().split()
        else:
            g = [next(iter(r.values())) for r in rows(got, fmt)]
            w = [next(iter(r.values())) for r in rows(want, fmt)]
        norm = lambda v: str(v).strip()  # noqa: E731
        return (
            (list(map(norm, g)) == list(map(norm, w)))
            if out.get("ordered")
            else set(map(norm, g)) == set(map(norm, w))
        )
    g, w = rows(got, fmt), rows(want, fmt)
    cols = out.get("columns") or (list(w[0]) if w else [])
    if len(g) != len(w) or any(c not in r for r in g for c in cols):
        return False
    if not out.get("ordered"):
        keys = (
            out.get("key")
            or [c for c in cols if not (w and number_like(w[0][c]) and "." in str(w[0][c]))]
            or cols
        )
        g = sorted(g, key=lambda r: [str(r[k]) for k in keys])
        w = sorted(w, key=lambda r: [str(r[k]) for k in keys])
    for gr, wr in zip(g, w, strict=True):
        for c in cols:
            a, b = gr[c], wr[c]
            if number_like(b) and number_like(a):
                if not close(a, b, out):
                    return False
            elif str(a).strip() != str(b).strip():
                return False
    return True


def json_same(g: object, w: object, out: Spec) -> bool:
    if isinstance(w, bool) or isinstance(g, bool):
        return g is w
    if isinstance(w, (int, float)) and isinstance(g, (int, float)):
        return close(g, w, out)
    if isinstance(w, dict) and isinstance(g, dict):
        return set(w) <= set(g) and all(json_same(g[k], w[k], out) for k in w)
    if isinstance(w, list) and isinstance(g, list):
        if len(g) != len(w):
            return False
        if not out.get("ordered"):
            g = sorted(g, key=lambda x: json.dumps(x, sort_keys=True))
            w = sorted(w, key=lambda x: json.dumps(x, sort_keys=True))
        return all(json_same(a, b, out) for a, b in zip(g, w, strict=True))
    return g == w


def overlay(src: str, workspace: str) -> None:
    if src and os.path.isdir(src):
        shutil.copytree(src, workspace, dirs_exist_ok=True)


def artifact(spec: Spec, workspace: str) -> int:
    variants_dir = spec.get("variants_dir", "tests/variants")
    pristine = workspace + ".harbor-pristine"
    shutil.copytree(workspace, pristine, dirs_exist_ok=True)
    for name in spec.get("variants", ["visible"]):
        base = task_path(os.path.join(variants_dir, name))
        shutil.rmtree(workspace)
        shutil.copytree(pristine, workspace)
        if spec.get("command"):
            for out in spec["outputs"]:
                target = os.path.join(workspace, out["path"])
                if os.path.exists(target):
                    os.remove(target)
            overlay(os.path.join(base, "overlay"), workspace)
            try:
                subprocess.run(
                    ["bash", "-c", spec["command"]],
                    cwd=workspace,
                    timeout=spec.get("timeout_s", 60),
                )
            except subprocess.TimeoutExpired:
                return 0
        for out in spec["outputs"]:
            produced = os.path.join(workspace, out["path"])
            if not os.path.isfile(produced):
                return 0
            with (
                open(produced, "rb") as got,
                open(os.path.join(base, "expected", out["path"]), "rb") as want,
            ):
                try:
                    if not same(got.read(), want.read(), out):
                        return 0
                except Exception:
                    return 0
    return 1


def probe(check: Spec, workspace: str) -> bool:
    service = subprocess.Popen(
        ["bash", "-c", check["start"]],
        cwd=workspace,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    deadline = time.monotonic() + check.get("timeout_s", 30)
    status: int | None
    try:
        while time.monotonic() < deadline:
            try:
                if check.get("http_get"):
                    conn = http.client.HTTPConnection("127.0.0.1", check["port"], timeout=2)
                    conn.request("GET", check["http_get"])
                    answer = conn.getresponse()
                    status, body = answer.status, answer.read().decode("utf-8", "replace")
                else:
                    with socket.create_connection(("127.0.0.1", check["port"]), timeout=2) as sock:
                        sock.sendall(check["send"].encode())
                        sock.shutdown(socket.SHUT_WR)
                        status, body = None, sock.recv(65536).decode("utf-8", "replace")
                if check.get("expect_status") is not None and status != check["expect_status"]:
                    return False
                return check.get("expect_contains", "") in body
            except (OSError, http.client.HTTPException):
                time.sleep(0.1)
        return False
    finally:
        os.killpg(service.pid, 9)


def rule(check: Spec, workspace: str) -> bool:
    kind = check["kind"]
    path = os.path.join(workspace, check.get("path", ""))
    if kind in ("file_exists", "file_contains", "parses"):
        if not os.path.isfile(path):
            return False
        with open(path, encoding="utf-8", errors="replace") as handle:
            text = handle.read()
        if kind == "file_contains":
            return ("text" not in check or check["text"] in text) and (
                "pattern" not in check
                or re.search(check["pattern"], text, re.MULTILINE) is not None
            )
        if kind == "parses":
            try:
                PARSERS[check["format"]](text)
            except Exception:
                return False
        return True
    if kind == "command":
        try:
            done = subprocess.run(
                ["bash", "-c", check["run"]],
                cwd=workspace,
                capture_output=True,
                text=True,
                timeout=check.get("timeout_s", 30),
            )
        except subprocess.TimeoutExpired:
            return False
        return (
            done.returncode == check.get("exit_code", 0)
            and check.get("stdout_contains", "") in done.stdout + done.stderr
        )
    return probe(check, workspace)


def main() -> None:
    with open(sys.argv[1]) as handle:
        spec = json.load(handle)
    workspace = os.path.abspath(sys.argv[2])
    if spec["kind"] == "artifact":
        print(artifact(spec["artifact"], workspace))
        return
    rules = spec["rules"]
    if rules.get("overlay_dir"):
        overlay(task_path(rules["overlay_dir"]), workspace)
    print(1 if all(rule(check, workspace) for check in rules["checks"]) else 0)


if __name__ == "__main__":
    main()
