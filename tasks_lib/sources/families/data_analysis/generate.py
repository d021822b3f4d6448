"""Data-analysis tasks: an orders table (CSV or Parquet), a question, an answer artifact.

Each task draws a dataset and one question template from `random.Random(f"...:{seed}:{index}")`.
The agent edits `analysis.py` so that `python analysis.py` reads the data and writes the answer
(`answer.csv` or `answer.json`); DuckDB, pandas and pyarrow are available in the sandbox. The
verifier runs the script once on the visible data and once per hidden variant (other rows of the
same schema, written over `data/` only in the verifier's sandbox) and compares each answer with
the reference computed here, in plain Python, at generation time. The reference solution answers
with DuckDB SQL, so every oracle check cross-checks two independent implementations.
"""

from __future__ import annotations

import dataclasses
import io
import json
import random
import statistics
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq

from tasks_lib.errors import GenerationError
from tasks_lib.sources.authoring.writer import TaskFiles, write_numbered_tasks, write_task

FAMILY = "data_analysis"
HIDDEN_VARIANTS = 2
REGIONS = ("north", "south", "east", "west", "central")
PRODUCTS = (
    "anvil", "bolt", "cable", "drill", "easel", "fuse", "gasket", "hinge", "ink", "jack",
    "kettle", "lever", "mallet", "nozzle", "oiler", "pulley",
)  # fmt: skip
STATUSES = ("shipped", "delivered", "cancelled", "returned")
YEARS = (2022, 2023)


@dataclasses.dataclass(frozen=True, slots=True)
class Order:
    order_id: int
    order_date: str
    region: str
    product: str
    quantity: int
    unit_price: float
    status: str

    @property
    def value(self) -> float:
        return self.quantity * self.unit_price


@dataclasses.dataclass(frozen=True, slots=True)
class Question:
    """One question template: its prose, answer file, how it is compared and solved."""

    name: str
    output: str
    output_spec: dict[str, Any]
    prose: Callable[[dict[str, Any]], str]
    answer: Callable[[list[Order], dict[str, Any]], bytes]
    """Reference answer in plain Python."""
    sql: Callable[[dict[str, Any]], str]
    """Reference solution: the DuckDB query whose result is written as the answer."""
    writer: str
    """How the reference solution writes the query result: `csv` or `json:<key>` / `scalar:<key>`."""


def _live(orders: list[Order]) -> list[Order]:
    return [o for o in orders if o.status != "cancelled"]


def _csv(header: tuple[str, ...], rows: list[tuple[Any, ...]]) -> bytes:
    out = io.StringIO()
    out.write(",".join(header) + "\n")
    for row in rows:
        out.write(",".join(f"{v:.2f}" if isinstance(v, float) else str(v) for v in row) + "\n")
    return out.getvalue().encode()


def _revenue_by_region(orders: list[Order], _params: dict[str, Any]) -> bytes:
    totals: dict[str, float] = defaultdict(float)
    for order in _live(orders):
        totals[order.region] += order.value
    rows = sorted(((r, round(v, 2)) for r, v in totals.items()), key=lambda row: (-row[1], row[0]))
    return _csv(("region", "revenue"), rows)


def _top_products(orders: list[Order], params: dict[str, Any]) -> bytes:
    units: Counter[str] = Counter()
    for order in _live(orders):
        if order.order_date.startswith(str(params["year"])):
            units[order.product] += order.quantity
    ranked = sorted(units.items(), key=lambda item: (-item[1], item[0]))[: params["k"]]
    return json.dumps({"products": [name for name, _ in ranked]}).encode()


def _median_value(orders: list[Order], params: dict[str, Any]) -> bytes:
    values = [o.value for o in orders if o.status == params["status"]]
    return json.dumps({"value": round(statistics.median(values), 4)}).encode()


def _monthly_orders(orders: list[Order], params: dict[str, Any]) -> bytes:
    months: Counter[str] = Counter(o.order_date[:7] for o in orders if o.region == params["region"])
    return _csv(("month", "orders"), sorted(months.items()))


QUESTIONS: dict[str, Question] = {
    q.name: q
    for q in (
        Question(
            "revenue_by_region",
            "answer.csv",
            {
                "format": "csv",
                "compare": "table",
                "key": ["region"],
                "abs_tol": 0.011,
                "rel_tol": 1e-9,
            },
            lambda p: (
                "What is the total revenue (quantity x unit_price) per region, counting every "
                "order whose status is not `cancelled`? Write `answer.csv` with the columns `region` "
                "and `revenue` (one row per region that has such orders; revenue rounded to cents)."
            ),
            _revenue_by_region,
            lambda p: (
                "SELECT region, round(sum(quantity * unit_price), 2) AS revenue FROM orders "
                "WHERE status <> 'cancelled' GROUP BY region ORDER BY revenue DESC, region"
            ),
            "csv",
        ),
        Question(
            "top_products",
            "answer.json",
            {"format": "json", "compare": "set", "field": "products"},
            lambda p: (
                f"Which {p['k']} products sold the most units in {p['year']} (order dates in "
                f"that year, orders not `cancelled`)? Break ties by product name, alphabetically. "
                'Write `answer.json` as `{"products": [...]}` (any order).'
            ),
            _top_products,
            lambda p: (
                "SELECT product FROM orders WHERE status <> 'cancelled' AND "
                f"CAST(order_date AS VARCHAR) LIKE '{p['year']}-%' GROUP BY product "
                f"ORDER BY sum(quantity) DESC, product LIMIT {p['k']}"
            ),
            "json:products",
        ),
        Question(
            "median_order_value",
            "answer.json",
            {
                "format": "json",
                "compare": "number",
                "field": "value",
                "abs_tol": 0.001,
                "rel_tol": 1e-9,
            },
            lambda p: (
                f"What is the median order value (quantity x unit_price) over the orders whose "
                f'status is `{p["status"]}`? Write `answer.json` as `{{"value": <number>}}`.'
            ),
            _median_value,
            lambda p: (
                "SELECT median(quantity * unit_price) AS value FROM orders "
                f"WHERE status = '{p['status']}'"
            ),
            "scalar:value",
        ),
        Question(
            "monthly_orders",
            "answer.csv",
            {"format": "csv", "compare": "table", "ordered": True},
            lambda p: (
                f"How many orders were placed per month in the `{p['region']}` region? Write "
                "`answer.csv` with the columns `month` (`YYYY-MM`) and `orders`, one row per month "
                "that has orders, sorted by month."
            ),
            _monthly_orders,
            lambda p: (
                "SELECT strftime(CAST(order_date AS DATE), '%Y-%m') AS month, count(*) AS orders "
                f"FROM orders WHERE region = '{p['region']}' GROUP BY month ORDER BY month"
            ),
            "csv",
        ),
    )
}


@dataclasses.dataclass(frozen=True, slots=True)
class DataTaskPlan:
    task_id: str
    seed: int
    index: int
    question: str
    params: dict[str, Any]
    data_format: str
    """`csv` or `parquet`."""
    visible: list[Order]
    hidden: list[list[Order]]

    @property
    def data_file(self) -> str:
        return f"data/orders.{self.data_format}"


def _orders(
    rng: random.Random, count: int, regions: tuple[str, ...], products: tuple[str, ...]
) -> list[Order]:
    orders = []
    for order_id in range(1, count + 1):
        year = rng.choice(YEARS)
        orders.append(
            Order(
                order_id=order_id + rng.randrange(1000) * 1000,
                order_date=f"{year}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                region=rng.choice(regions),
                product=rng.choice(products),
                quantity=rng.randint(1, 20),
                unit_price=round(rng.uniform(1.0, 250.0), 2),
                status=rng.choices(STATUSES, weights=(5, 4, 1, 1))[0],
            )
        )
    return orders


def _usable(orders: list[Order], question: str, params: dict[str, Any]) -> bool:
    """The question has a clear answer on these orders (present values, no tie at the cut)."""
    if question == "median_order_value":
        return bool(sum(o.status == params["status"] for o in orders) >= 3)
    if question == "monthly_orders":
        return any(o.region == params["region"] for o in orders)
    if question == "top_products":
        units: Counter[str] = Counter()
        for order in _live(orders):
            if order.order_date.startswith(str(params["year"])):
                units[order.product] += order.quantity
        ranked = sorted(units.values(), reverse=True)
        return bool(len(ranked) > params["k"] and ranked[params["k"] - 1] != ranked[params["k"]])
    return bool(_live(orders))


def plan_data_task(seed: int, index: int) -> DataTaskPlan:
    """The task of `index` under `seed` (the same whatever the count)."""
    rng = random.Random(f"rollyard-data-analysis:{seed}:{index}")
    question = rng.choice(sorted(QUESTIONS))
    params = {
        "year": rng.choice(YEARS),
        "k": rng.randint(2, 4),
        "status": rng.choice(("shipped", "delivered")),
        "region": rng.choice(REGIONS),
    }
    products = tuple(rng.sample(PRODUCTS, rng.randint(6, 10)))
    data_format = rng.choice(("csv", "csv", "parquet"))
    sets: list[list[Order]] = []
    for _variant in range(1 + HIDDEN_VARIANTS):
        for _attempt in range(50):
            orders = _orders(rng, rng.randint(40, 120), REGIONS, products)
            answers = {QUESTIONS[question].answer(orders, params)} | {
                QUESTIONS[question].answer(other, params) for other in sets
            }
            # Each variant must change the answer, or a hard-coded answer would pass it.
            if _usable(orders, question, params) and len(answers) == len(sets) + 1:
                sets.append(orders)
                break
        else:
            raise GenerationError(f"no usable data for {question} at seed {seed}, index {index}")
    return DataTaskPlan(
        task_id=f"data-{seed}-{index:04d}", seed=seed, index=index, question=question,
        params=params, data_format=data_format, visible=sets[0], hidden=sets[1:],
    )  # fmt: skip


def _table(orders: list[Order]) -> pa.Table:
    return pa.Table.from_pylist([dataclasses.asdict(o) for o in orders])


def _data_bytes(orders: list[Order], data_format: str) -> bytes:
    sink = io.BytesIO()
    if data_format == "parquet":
        pq.write_table(_table(orders), sink)
    else:
        pacsv.write_csv(_table(orders), sink, pacsv.WriteOptions(quoting_style="none"))
    return sink.getvalue()


_STUB = '''\
"""Answer the question in the task: read {data_file}, write {output}.

Run as `python analysis.py` from the workspace root. pandas, pyarrow and duckdb are installed.
"""

raise NotImplementedError("write the analysis")
'''

_SOLUTION = '''\
"""Reference solution: DuckDB SQL over the data file."""

import json

import duckdb

con = duckdb.connect()
con.execute("CREATE VIEW orders AS SELECT * FROM '{data_file}'")
query = """{sql}"""
writer = "{writer}"
if writer == "csv":
    con.execute(f"COPY ({{query}}) TO '{output}' (HEADER, DELIMITER ',')")
else:
    kind, key = writer.split(":")
    rows = [row[0] for row in con.execute(query).fetchall()]
    value = rows[0] if kind == "scalar" else rows
    with open("{output}", "w") as handle:
        json.dump({{key: value}}, handle)
'''


def _instruction(plan: DataTaskPlan) -> str:
    question = QUESTIONS[plan.question]
    reader = (
        "pandas.read_parquet / duckdb" if plan.data_format == "parquet" else "pandas / duckdb / csv"
    )
    return (
        f"# Answer a question about the orders data\n\n"
        f"`{plan.data_file}` holds one row per order with the columns `order_id`, `order_date` "
        "(`YYYY-MM-DD`), `region`, `product`, `quantity`, `unit_price` and `status` "
        f"(`{'`, `'.join(STATUSES)}`).\n\n"
        f"{question.prose(plan.params)}\n\n"
        f"Edit `analysis.py` so that `python analysis.py`, run from the workspace root, reads "
        f"`{plan.data_file}` ({reader}) and writes `{question.output}`.\n\n"
        "Grading runs your script again on other data with the same schema, so compute the answer "
        "from the data; do not write it by hand. Do not change the files under `data/`.\n"
    )


def write_data_task(plan: DataTaskPlan, task_dir: Path) -> Path:
    question = QUESTIONS[plan.question]
    variants = ["visible", *(f"hidden-{i + 1}" for i in range(len(plan.hidden)))]
    tests: dict[str, str | bytes] = {
        f"variants/visible/expected/{question.output}": question.answer(plan.visible, plan.params)
    }
    for name, orders in zip(variants[1:], plan.hidden, strict=True):
        tests[f"variants/{name}/overlay/{plan.data_file}"] = _data_bytes(orders, plan.data_format)
        tests[f"variants/{name}/expected/{question.output}"] = question.answer(orders, plan.params)
    solution = _SOLUTION.format(
        data_file=plan.data_file, sql=question.sql(plan.params), writer=question.writer,
        output=question.output,
    )  # fmt: skip
    files = TaskFiles(
        task_id=plan.task_id,
        instruction=_instruction(plan),
        workspace={
            plan.data_file: _data_bytes(plan.visible, plan.data_format),
            "analysis.py": _STUB.format(data_file=plan.data_file, output=question.output),
        },
        rollyard={
            "family": FAMILY,
            "source": f"rollyard data-analysis generator, seed {plan.seed}, index {plan.index}",
            "difficulty": "easy"
            if plan.question in ("median_order_value", "revenue_by_region")
            else "medium",
            "verifier": "artifact",
            "protected": ["data/**"],
            "limits": {"wall_time_s": 60.0, "memory_mb": 1024, "verify_timeout_s": 120.0},
            "artifact": {
                "command": "python analysis.py",
                "timeout_s": 60.0,
                "variants_dir": "tests/variants",
                "variants": variants,
                "outputs": [{"path": question.output, **question.output_spec}],
            },
        },
        solve_sh="#!/bin/bash\n# Reference solution: DuckDB SQL.\nset -euo pipefail\n"
        'cp "$(dirname "$0")/analysis.py" analysis.py\n',
        solution={"analysis.py": solution},
        tests=tests,
        metadata={
            "author_name": "rollyard data-analysis generator",
            "category": "data-analysis",
            "tags": ["sql", "duckdb", "pandas", plan.question],
            "question": plan.question,
            "params": plan.params,
        },
    )
    return write_task(files, task_dir)


def generate_data_analysis_tasks(
    out_dir: str | Path,
    count: int,
    seed: int = 0,
    *,
    progress: Callable[[int, Path], None] | None = None,
) -> list[Path]:
    """Write `count` data-analysis tasks under `out_dir` (one directory per task id)."""
    return write_numbered_tasks(
        out_dir,
        count,
        write_one=lambda index, task_dir: write_data_task(plan_data_task(seed, index), task_dir),
        name=lambda index: f"data-{seed}-{index:04d}",
        progress=progress,
    )
