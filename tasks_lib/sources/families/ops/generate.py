"""Ops tasks: an inventory-style HTTP service (config, SQLite migrations, a supervisor script and
a report job) with one realistic fault, drawn by seed:

- `bad_config`: the listen address carries the port (`host = "127.0.0.1:8123"`): the server
  cannot bind and the supervisor gives up after three restarts;
- `permissions`: a hardening setting makes the database file read-only: `/health` answers 500;
- `failing_migration`: a migration indexes a column by its old name: the migration fails;
- `crash_loop`: the server's cache warm-up reads a column the data file does not have: it crashes
  at start, restart after restart.

The rule verifier runs the migration, starts the service with `sh run.sh`, asks `/health` and an
item of the hidden data set (written over `data/items.csv` only in the verifier's sandbox), runs
the report job and checks its total. A stub server or a hard-coded report scores 0.
"""

from __future__ import annotations

import dataclasses
import json
import random
from collections.abc import Callable
from pathlib import Path

from tasks_lib.sources.authoring.writer import TaskFiles, write_numbered_tasks, write_task

FAMILY = "ops"
SCENARIOS = ("bad_config", "permissions", "failing_migration", "crash_loop")
SERVICES = ("inventory", "catalog", "parts", "stock", "warehouse")
WORDS = (
    "bolt",
    "nut",
    "gear",
    "belt",
    "pump",
    "valve",
    "seal",
    "hose",
    "clamp",
    "spring",
    "chain",
    "wheel",
)


@dataclasses.dataclass(frozen=True, slots=True)
class Item:
    sku: str
    name: str
    price: float
    stock: int


@dataclasses.dataclass(frozen=True, slots=True)
class OpsTaskPlan:
    task_id: str
    seed: int
    index: int
    scenario: str
    service: str
    port: int
    visible: tuple[Item, ...]
    hidden: tuple[Item, ...]
    probe_sku: str
    """Hidden item the verifier asks the service for."""


def _items(rng: random.Random, prefix: str) -> tuple[Item, ...]:
    count = rng.randint(5, 9)
    names = rng.sample(WORDS, count)
    return tuple(
        Item(
            f"{prefix}-{rng.randrange(100, 999)}{i}",
            name,
            round(rng.uniform(0.5, 90.0), 2),
            rng.randint(1, 60),
        )
        for i, name in enumerate(names)
    )


def plan_ops_task(seed: int, index: int) -> OpsTaskPlan:
    """The task of `index` under `seed` (the same whatever the count)."""
    rng = random.Random(f"rollyard-ops:{seed}:{index}")
    # Scenarios cycle with the index (from a seeded offset), so any four tasks in a row hold all.
    offset = random.Random(f"rollyard-ops-offset:{seed}").randrange(len(SCENARIOS))
    scenario = SCENARIOS[(index + offset) % len(SCENARIOS)]
    visible = _items(rng, "SKU")
    hidden = _items(rng, "HID")
    return OpsTaskPlan(
        task_id=f"ops-{seed}-{index:04d}", seed=seed, index=index, scenario=scenario,
        service=rng.choice(SERVICES), port=rng.randrange(8100, 8999), visible=visible,
        hidden=hidden, probe_sku=rng.choice(hidden).sku,
    )  # fmt: skip


def _items_csv(items: tuple[Item, ...]) -> str:
    lines = ["sku,name,price,stock"] + [f"{i.sku},{i.name},{i.price},{i.stock}" for i in items]
    return "\n".join(lines) + "\n"


def _total(items: tuple[Item, ...]) -> str:
    return f"{sum(i.price * i.stock for i in items):.2f}"


CONFIG = """\
# {service} API settings
[server]
host = "{host}"
port = {port}

[storage]
db_path = "state/app.db"
# File mode of the database after migrations (octal).
db_mode = "{db_mode}"

[report]
output = "out/report.csv"
"""

CONFIG_PY = '''\
"""Settings from config/app.toml."""

import tomllib


def load(path="config/app.toml"):
    with open(path, "rb") as handle:
        return tomllib.load(handle)
'''

MIGRATE_PY = '''\
"""Build the database: apply migrations/*.sql in order, load data/items.csv, set the file mode."""

import csv
import os
import sqlite3
from pathlib import Path

from app.config import load


def main():
    config = load()
    db = Path(config["storage"]["db_path"])
    db.parent.mkdir(parents=True, exist_ok=True)
    if db.exists():
        db.unlink()
    con = sqlite3.connect(db)
    for migration in sorted(Path("migrations").glob("*.sql")):
        print(f"applying {migration.name}")
        con.executescript(migration.read_text())
    with open("data/items.csv", newline="") as handle:
        rows = [(r["sku"], r["name"], float(r["price"]), int(r["stock"])) for r in csv.DictReader(handle)]
    con.executemany("INSERT INTO items (sku, name, price, stock) VALUES (?, ?, ?, ?)", rows)
    con.commit()
    con.close()
    os.chmod(db, int(config["storage"]["db_mode"], 8))
    print(f"loaded {len(rows)} items into {db}")


if __name__ == "__main__":
    main()
'''

SERVER_PY = '''\
"""The {service} API: GET /health and GET /items/<sku>, JSON answers."""

import csv
import json
import sqlite3
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from app.config import load

CONFIG = load()
DB = CONFIG["storage"]["db_path"]


def warm_cache():
    """Item names by sku, read once at start (the catalog page reads them from here)."""
    with open("data/items.csv", newline="") as handle:
        return {{row["sku"]: row["{name_column}"] for row in csv.DictReader(handle)}}


NAMES = warm_cache()


class Handler(BaseHTTPRequestHandler):
    def send_json(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        try:
            with sqlite3.connect(DB) as con:
                if self.path == "/health":
                    con.execute("UPDATE stats SET hits = hits + 1")
                    count = con.execute("SELECT count(*) FROM items").fetchone()[0]
                    self.send_json(200, {{"status": "ok", "items": count}})
                elif self.path.startswith("/items/"):
                    sku = self.path.split("/", 2)[2]
                    row = con.execute(
                        "SELECT sku, price, stock FROM items WHERE sku = ?", (sku,)
                    ).fetchone()
                    if row is None:
                        self.send_json(404, {{"error": f"no item {{sku}}"}})
                    else:
                        self.send_json(200, {{"sku": row[0], "name": NAMES.get(row[0]),
                                              "price": row[1], "stock": row[2]}})
                else:
                    self.send_json(404, {{"error": "not found"}})
        except Exception as error:
            self.send_json(500, {{"error": f"{{type(error).__name__}}: {{error}}"}})

    def log_message(self, format, *args):
        pass


def main():
    server = ThreadingHTTPServer((CONFIG["server"]["host"], CONFIG["server"]["port"]), Handler)
    print(f"listening on {{CONFIG['server']['host']}}:{{CONFIG['server']['port']}}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
'''

REPORT_PY = '''\
"""Nightly stock-value report: one row per item (sku, price x stock), then the total."""

import sqlite3
from pathlib import Path

from app.config import load


def main():
    config = load()
    out = Path(config["report"]["output"])
    out.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(config["storage"]["db_path"])
    rows = con.execute("SELECT sku, price * stock FROM items ORDER BY sku").fetchall()
    lines = ["sku,value"] + [f"{sku},{value:.2f}" for sku, value in rows]
    lines.append(f"total,{sum(value for _, value in rows):.2f}")
    out.write_text("\\n".join(lines) + "\\n")
    print(f"wrote {len(rows)} rows to {out}")


if __name__ == "__main__":
    main()
'''

RUN_SH = """\
#!/bin/sh
# Supervisor: build the database, then keep the API up (a crashed server is restarted, 3 tries).
python -m app.migrate || exit 1
tries=0
while [ "$tries" -lt 3 ]; do
    python -m app.server && exit 0
    tries=$((tries + 1))
    echo "server exited; restart $tries of 3" >&2
    sleep 0.2
done
echo "giving up: the server keeps crashing" >&2
exit 1
"""

MIGRATION_1 = """\
CREATE TABLE items (sku TEXT PRIMARY KEY, name TEXT NOT NULL, price REAL NOT NULL);
CREATE TABLE stats (hits INTEGER NOT NULL);
INSERT INTO stats VALUES (0);
"""
MIGRATION_2_GOOD = """\
ALTER TABLE items ADD COLUMN stock INTEGER NOT NULL DEFAULT 0;
CREATE INDEX items_by_name ON items (name);
"""
# The column was renamed to `name` before this migration was written against the old schema.
MIGRATION_2_BAD = """\
ALTER TABLE items ADD COLUMN stock INTEGER NOT NULL DEFAULT 0;
CREATE INDEX items_by_name ON items (item_name);
"""

SYMPTOMS = {
    "bad_config": "`sh run.sh` builds the database, then the server exits at start; the "
    "supervisor restarts it three times and gives up.",
    "permissions": "Since the last hardening change the service starts, but `GET /health` answers "
    "HTTP 500.",
    "failing_migration": "Deploys stop at `python -m app.migrate`: it fails before the service "
    "can start.",
    "crash_loop": "The server is in a crash loop: the supervisor (`sh run.sh`) restarts it three "
    "times and gives up.",
}


def _workspace(plan: OpsTaskPlan) -> dict[str, str | bytes]:
    host = f"127.0.0.1:{plan.port}" if plan.scenario == "bad_config" else "127.0.0.1"
    db_mode = "0444" if plan.scenario == "permissions" else "0644"
    name_column = "product_name" if plan.scenario == "crash_loop" else "name"
    migration_2 = MIGRATION_2_BAD if plan.scenario == "failing_migration" else MIGRATION_2_GOOD
    return {
        "config/app.toml": CONFIG.format(
            service=plan.service, host=host, port=plan.port, db_mode=db_mode
        ),
        "app/__init__.py": f'"""The {plan.service} service."""\n',
        "app/config.py": CONFIG_PY,
        "app/migrate.py": MIGRATE_PY,
        "app/server.py": SERVER_PY.format(service=plan.service, name_column=name_column),
        "jobs/__init__.py": '"""Batch jobs."""\n',
        "jobs/report.py": REPORT_PY,
        "migrations/001_create_items.sql": MIGRATION_1,
        "migrations/002_add_stock.sql": migration_2,
        "data/items.csv": _items_csv(plan.visible),
        "run.sh": RUN_SH,
        "RUNBOOK.md": (
            f"# {plan.service} service\n\n"
            "- `python -m app.migrate`: rebuild `state/app.db` from `migrations/` and `data/items.csv`\n"
            "- `sh run.sh`: migrate, then serve on the host and port of `config/app.toml`\n"
            "- `python -m jobs.report`: write the stock-value report to `out/report.csv`\n"
        ),
    }


# Each fix: (file, broken text, fixed text), applied by solution/fix.py.
def _fix(plan: OpsTaskPlan) -> tuple[str, str, str]:
    if plan.scenario == "bad_config":
        return ("config/app.toml", f'host = "127.0.0.1:{plan.port}"', 'host = "127.0.0.1"')
    if plan.scenario == "permissions":
        return ("config/app.toml", 'db_mode = "0444"', 'db_mode = "0644"')
    if plan.scenario == "failing_migration":
        return ("migrations/002_add_stock.sql", MIGRATION_2_BAD, MIGRATION_2_GOOD)
    return ("app/server.py", 'row["product_name"]', 'row["name"]')


FIX_PY = '''\
"""Reference fix: replace the faulty text (exactly once) in the file at fault."""

import json
import sys
from pathlib import Path

path, broken, fixed = json.loads(Path(sys.argv[1]).read_text())
text = Path(path).read_text()
if text.count(broken) != 1:
    sys.exit(f"{path}: expected the faulty text once")
Path(path).write_text(text.replace(broken, fixed))
'''


def _instruction(plan: OpsTaskPlan) -> str:
    return (
        f"# Incident: the {plan.service} service is down\n\n"
        f"{SYMPTOMS[plan.scenario]}\n\n"
        f"The workspace holds the service (`app/`), its migrations, its supervisor `run.sh`, a "
        f"report job (`jobs/report.py`) and a runbook (`RUNBOOK.md`). Find the root cause and fix "
        f"it so that:\n\n"
        f"1. `python -m app.migrate` completes;\n"
        f"2. `sh run.sh` serves on `127.0.0.1:{plan.port}`: `GET /health` answers 200 with "
        '`"status": "ok"` and `GET /items/<sku>` answers the item\'s price and stock;\n'
        "3. `python -m jobs.report` writes `out/report.csv` with the right total.\n\n"
        "Keep the port and the file layout. Do not edit `data/items.csv`: grading loads another "
        "data set with the same columns, so the service and the job must work from the data.\n"
    )


def write_ops_task(plan: OpsTaskPlan, task_dir: Path) -> Path:
    probe = next(item for item in plan.hidden if item.sku == plan.probe_sku)
    item_text = f'"price": {json.dumps(probe.price)}, "stock": {probe.stock}'
    checks = [
        {"name": "migration_completes", "kind": "command", "run": "python -m app.migrate", "timeout_s": 30.0},
        {"name": "config_parses", "kind": "parses", "path": "config/app.toml", "format": "toml"},
        {
            "name": "service_health", "kind": "service", "start": "sh run.sh", "port": plan.port,
            "http_get": "/health", "expect_status": 200, "expect_contains": '"status": "ok"',
            "timeout_s": 20.0,
        },
        {
            "name": "service_item", "kind": "service", "start": "sh run.sh", "port": plan.port,
            "http_get": f"/items/{plan.probe_sku}", "expect_status": 200,
            "expect_contains": item_text, "hidden": True, "timeout_s": 20.0,
        },
        {"name": "report_job_completes", "kind": "command", "run": "python -m jobs.report", "timeout_s": 30.0},
        {
            "name": "report_total", "kind": "file_contains", "path": "out/report.csv",
            "text": f"total,{_total(plan.hidden)}\n", "hidden": True,
        },
    ]  # fmt: skip
    files = TaskFiles(
        task_id=plan.task_id,
        instruction=_instruction(plan),
        workspace=_workspace(plan),
        rollyard={
            "family": FAMILY,
            "source": f"rollyard ops generator, seed {plan.seed}, index {plan.index}",
            "difficulty": "easy"
            if plan.scenario in ("bad_config", "failing_migration")
            else "medium",
            "verifier": "rules",
            "protected": ["data/**"],
            "limits": {"wall_time_s": 60.0, "memory_mb": 1024, "verify_timeout_s": 150.0},
            "rules": {"overlay_dir": "tests/overlay", "checks": checks},
        },
        solve_sh="#!/bin/bash\n# Reference solution: fix the faulty line.\nset -euo pipefail\n"
        'python "$(dirname "$0")/fix.py" "$(dirname "$0")/fix.json"\n',
        solution={"fix.py": FIX_PY, "fix.json": json.dumps(_fix(plan))},
        tests={"overlay/data/items.csv": _items_csv(plan.hidden)},
        metadata={
            "author_name": "rollyard ops generator",
            "category": "operations",
            "tags": ["troubleshooting", "sqlite", "http", plan.scenario],
            "scenario": plan.scenario,
        },
        dockerfile="FROM python:3.11-slim\nWORKDIR /workspace\nCOPY workspace/ /workspace/\n",
        verifier_timeout_s=150.0,
    )
    return write_task(files, task_dir)


def generate_ops_tasks(
    out_dir: str | Path,
    count: int,
    seed: int = 0,
    *,
    progress: Callable[[int, Path], None] | None = None,
) -> list[Path]:
    """Write `count` ops tasks under `out_dir` (one directory per task id)."""
    return write_numbered_tasks(
        out_dir,
        count,
        write_one=lambda index, task_dir: write_ops_task(plan_ops_task(seed, index), task_dir),
        name=lambda index: f"ops-{seed}-{index:04d}",
        progress=progress,
    )
