"""A self-contained HTML report of a store: reward curves, named rewards, failure taxonomy,
throughput, quality gate history, evaluations, checkpoints and the task library — one file with
its figures inlined as PNG, readable offline and attachable to a ticket.

    from storage.report import write_report
    write_report(TrajectoryStore("store"), "report.html")
"""

from __future__ import annotations

import base64
import datetime
import html
import io
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollyard.out_paths import check_file_target, replacing_file
from storage.commits import first_line
from storage.errors import QueryError
from storage.gates import ITERATION_SUITE
from storage.gx_project import gate_docs_pages
from storage.schemas import TABLES
from storage.store import TrajectoryStore

Rows = list[dict[str, Any]]

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2rem; } .meta { color: #666; margin-top: 0; }
h2 { border-bottom: 1px solid #ddd; padding-bottom: 0.2rem; margin-top: 2rem; }
table { border-collapse: collapse; margin: 0.5rem 0 1rem; font-size: 0.85rem; }
th, td { border: 1px solid #ddd; padding: 0.2rem 0.5rem; text-align: right; }
th { background: #f4f4f4; } td.text { text-align: left; }
tr.bad td { background: #fde8e8; } .empty { color: #888; font-style: italic; }
div.scroll { overflow-x: auto; } figure { margin: 0.5rem 0; } img { max-width: 100%; }
"""

_QUERIES: dict[str, str] = {
    "runs": """
        SELECT run_id, count(DISTINCT iteration) AS iterations, count(*) AS episodes,
               avg(reward) AS mean_reward, min(started_at) AS started, max(finished_at) AS finished
        FROM episodes GROUP BY run_id ORDER BY run_id
    """,
    "iterations": """
        SELECT c.*, s.quarantined, s.reason AS gate_reason
        FROM ({reward_curve}) c LEFT JOIN iteration_status s USING (run_id, iteration)
        ORDER BY run_id, iteration
    """,
    "evaluations": """
        SELECT run_id, iteration,
               any_value(value) FILTER (WHERE name = 'eval_reward_mean') AS eval_reward_mean,
               any_value(value) FILTER (WHERE name = 'eval_pass_rate') AS eval_pass_rate,
               any_value(value) FILTER (WHERE name = 'eval_episodes') AS eval_episodes,
               any_value(value) FILTER (WHERE name = 'eval_infra_errors') AS eval_infra_errors
        FROM metrics WHERE source = 'evaluation' GROUP BY run_id, iteration ORDER BY 1, 2
    """,
    "training_throughput": """
        SELECT run_id, iteration,
               any_value(value) FILTER (WHERE name = 'rollout_wall_s') AS rollout_s,
               any_value(value) FILTER (WHERE name = 'update_s') AS update_s,
               any_value(value) FILTER (WHERE name = 'sampled_tokens') AS sampled_tokens,
               any_value(value) FILTER (WHERE name = 'sampled_tokens_per_s')
                   AS sampled_tokens_per_s,
               any_value(value) FILTER (WHERE name = 'tokens_trained') AS trained_tokens,
               any_value(value) FILTER (WHERE name = 'trained_tokens_per_s')
                   AS trained_tokens_per_s,
               any_value(value) FILTER (WHERE name = 'logprob_mismatch_max_abs')
                   AS logprob_mismatch_max_abs
        FROM metrics WHERE source = 'train_flow' GROUP BY run_id, iteration ORDER BY 1, 2
    """,
    "gates": """
        SELECT v.run_id, v.iteration, v.suite, v.evaluation, v.quarantined, v.reason,
               v.evaluated_at,
               (SELECT string_agg(g.expectation || ' (' || coalesce(g.observed, '?') || ')', '; ')
                FROM gates g WHERE g.kind = 'expectation' AND NOT g.success
                  AND g.run_id = v.run_id AND g.iteration = v.iteration AND g.suite = v.suite
                  AND g.evaluation = v.evaluation) AS failed_expectations
        FROM gate_verdicts v ORDER BY v.run_id, v.iteration, v.suite
    """,
    "checkpoints": """
        SELECT run_id, iteration, policy_version, parent_policy_version, n_episodes,
               size_bytes, created_at
        FROM checkpoints ORDER BY run_id, iteration
    """,
    "library": """
        SELECT coalesce(difficulty, 'unknown') AS difficulty, status, count(*) AS tasks
        FROM tasks_latest GROUP BY ALL ORDER BY difficulty, status
    """,
    "rejections": """
        SELECT coalesce(reason, '') AS reason, count(*) AS tasks
        FROM tasks_latest WHERE status <> 'accepted' AND status <> 'admitted'
        GROUP BY ALL ORDER BY tasks DESC LIMIT 20
    """,
}

_NAMED_SECTIONS = (
    "failure_taxonomy",
    "throughput",
    "pass_rate_by_difficulty",
    "hack_flag_rates",
    "named_rewards",
)


def collect(store: TrajectoryStore, *, run_id: str | None = None) -> dict[str, Rows]:
    """The report's tables, read in one snapshot of the store (restricted to `run_id` where a
    table has runs)."""
    from storage.queries import NAMED_QUERIES

    sql = dict(_QUERIES)
    sql["iterations"] = sql["iterations"].format(reward_curve=NAMED_QUERIES["reward_curve"].sql)
    for name in _NAMED_SECTIONS:
        sql[name] = NAMED_QUERIES[name].sql
    import duckdb

    con = store.connect()
    try:
        tables = {name: con.sql(query).to_arrow_table().to_pylist() for name, query in sql.items()}
    except duckdb.Error as error:
        # A data file damaged past what the store check before use sees (its bytes, not its
        # size): the error names the file, else says which section failed.
        store.reader.raise_if_corrupt(tuple(TABLES), error)
        raise QueryError(
            f"{store.root}: the report's queries failed: {first_line(error)}"
        ) from error
    finally:
        con.close()
    if run_id is not None:
        for name, rows in tables.items():
            if rows and "run_id" in rows[0]:
                tables[name] = [r for r in rows if r["run_id"] == run_id]
    return tables


# -- figures ------------------------------------------------------------------------------------


def _png(figure: Any) -> str:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=90)
    return base64.b64encode(buffer.getvalue()).decode("ascii")


def reward_curve_png(
    iterations: Rows, evaluations: Rows | None = None, *, title: str = ""
) -> bytes:
    """A PNG of mean reward, pass rate and the p10-p90 band per iteration (one run's rows of
    the `reward_curve` query), with held-out evaluations as points when given."""
    return base64.b64decode(_reward_curve(iterations, evaluations or [], title))


def _reward_curve(iterations: Rows, evaluations: Rows, title: str) -> str:
    from matplotlib.figure import Figure  # no pyplot: no global state, no GUI backend
    from matplotlib.ticker import MaxNLocator

    figure = Figure(figsize=(7, 3.2))
    axis = figure.subplots()
    xs = [r["iteration"] for r in iterations]
    if xs:
        axis.fill_between(
            xs,
            [r["reward_p10"] for r in iterations],
            [r["reward_p90"] for r in iterations],
            alpha=0.2,
            label="reward p10-p90",
        )
        axis.plot(xs, [r["mean_reward"] for r in iterations], marker="o", label="mean reward")
        axis.plot(xs, [r["pass_rate"] for r in iterations], marker="s", label="pass rate")
    points = [r for r in evaluations if r.get("eval_reward_mean") is not None]
    if points:
        axis.plot(
            [r["iteration"] for r in points],
            [r["eval_reward_mean"] for r in points],
            linestyle="none",
            marker="*",
            markersize=11,
            label="held-out reward",
        )
    axis.set_xlabel("iteration")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_ylim(-0.05, 1.05)
    axis.set_title(title)
    axis.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    return _png(figure)


def _failure_bars(rows: Rows, title: str) -> str:
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    iterations = sorted({r["iteration"] for r in rows})
    statuses = sorted({r["status"] for r in rows})
    share = {(r["iteration"], r["status"]): r["share"] for r in rows}
    figure = Figure(figsize=(7, 2.8))
    axis = figure.subplots()
    bottom = [0.0] * len(iterations)
    for status in statuses:
        heights = [share.get((i, status), 0.0) for i in iterations]
        axis.bar(iterations, heights, bottom=bottom, label=status)
        bottom = [b + h for b, h in zip(bottom, heights, strict=True)]
    axis.set_xlabel("iteration")
    axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    axis.set_ylabel("share of episodes")
    axis.set_title(title)
    axis.legend(loc="upper left", fontsize="small")
    figure.tight_layout()
    return _png(figure)


# -- HTML ---------------------------------------------------------------------------------------


def _cell(value: Any) -> tuple[str, bool]:
    """The cell's text and whether it is left-aligned text."""
    if value is None:
        return "", False
    if isinstance(value, bool):
        return ("yes" if value else "no"), False
    if isinstance(value, float):
        return f"{value:.4g}", False
    if isinstance(value, datetime.datetime):
        return value.strftime("%Y-%m-%d %H:%M:%S"), True
    if isinstance(value, int):
        return str(value), False
    if isinstance(value, list):
        value = ", ".join(str(v) for v in value)
    return str(value), True


def _table(rows: Rows, *, empty: str, bad_column: str | None = None) -> str:
    if not rows:
        return f'<p class="empty">{html.escape(empty)}</p>'
    names = list(rows[0])
    head = "".join(f"<th>{html.escape(n)}</th>" for n in names)
    body = []
    for row in rows:
        cells = []
        for name in names:
            text, is_text = _cell(row[name])
            css = ' class="text"' if is_text else ""
            cells.append(f"<td{css}>{html.escape(text)}</td>")
        bad = ' class="bad"' if bad_column and row.get(bad_column) else ""
        body.append(f"<tr{bad}>{''.join(cells)}</tr>")
    return (
        f'<div class="scroll"><table><thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _figure(png_base64: str, alt: str) -> str:
    return (
        f'<figure><img alt="{html.escape(alt)}" src="data:image/png;base64,{png_base64}"></figure>'
    )


def render_html(
    tables: dict[str, Rows],
    *,
    title: str,
    source: str,
    gate_docs: Sequence[tuple[str, str]] = (),
) -> str:
    """The report page for tables from `collect`; `gate_docs` are (label, href) links to the
    GX Data Docs pages of the gate runs."""
    generated = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f"<h1>{html.escape(title)}</h1>",
        f'<p class="meta">store {html.escape(source)} &middot; generated {generated}</p>',
        '<h2 id="runs">Runs</h2>',
        _table(tables["runs"], empty="No episodes in this store yet."),
        '<h2 id="curves">Reward curves</h2>',
    ]
    runs = sorted({r["run_id"] for r in tables["iterations"]})
    for run in runs:
        rows = [r for r in tables["iterations"] if r["run_id"] == run]
        evaluations = [r for r in tables["evaluations"] if r["run_id"] == run]
        parts.append(f"<h3>{html.escape(run)}</h3>")
        parts.append(_figure(_reward_curve(rows, evaluations, f"run {run}"), f"reward curve {run}"))
        parts.append(_table(rows, empty="", bad_column="quarantined"))
    if not runs:
        parts.append('<p class="empty">No iterations yet.</p>')
    parts.append('<h2 id="named-rewards">Named rewards</h2>')
    parts.append(
        _table(tables["named_rewards"], empty="No verifier wrote named rewards (reward.json).")
    )
    parts.append('<h2 id="evaluation">Held-out evaluation</h2>')
    parts.append(_table(tables["evaluations"], empty="No checkpoint has been evaluated yet."))
    parts.append('<h2 id="gates">Quality gate history</h2>')
    parts.append(
        _table(tables["gates"], empty="No gate has been evaluated.", bad_column="quarantined")
    )
    if gate_docs:
        links = "".join(
            f'<li><a href="{html.escape(href)}">{html.escape(label)}</a></li>'
            for label, href in gate_docs
        )
        parts.append(
            f'<p>Great Expectations Data Docs of each gate run:</p><ul class="docs">{links}</ul>'
        )
    parts.append('<h2 id="failures">Failure taxonomy</h2>')
    for run in sorted({r["run_id"] for r in tables["failure_taxonomy"]}):
        rows = [r for r in tables["failure_taxonomy"] if r["run_id"] == run]
        parts.append(_figure(_failure_bars(rows, f"episode status, run {run}"), "failures"))
    parts.append(_table(tables["failure_taxonomy"], empty="No episodes."))
    parts.append('<h2 id="flags">Reward-hack flags</h2>')
    parts.append(_table(tables["hack_flag_rates"], empty="No episode was flagged."))
    parts.append('<h2 id="throughput">Throughput and sandbox time</h2>')
    parts.append(_table(tables["throughput"], empty="No episodes."))
    parts.append("<h3>Per training iteration: rollout against update</h3>")
    parts.append(_table(tables["training_throughput"], empty="No training iteration yet."))
    parts.append('<h2 id="library">Task library</h2>')
    parts.append(_table(tables["pass_rate_by_difficulty"], empty="No episodes."))
    parts.append(_table(tables["library"], empty="No curation recorded (rollyard curate)."))
    parts.append(_table(tables["rejections"], empty="No task was rejected."))
    parts.append('<h2 id="checkpoints">Checkpoints</h2>')
    parts.append(_table(tables["checkpoints"], empty="No checkpoints."))
    parts.append("</body></html>")
    return "\n".join(parts)


def _gate_docs_links(store_root: str, gates: Rows, report_dir: Path) -> list[tuple[str, str]]:
    """(label, relative href) of each gate run's Data Docs pages, so the links keep working
    when the store and its report move together."""
    links = []
    for row in gates:
        if row.get("suite") != ITERATION_SUITE or row.get("evaluation") is None:
            continue
        for page in gate_docs_pages(
            store_root, row["run_id"], int(row["iteration"]), int(row["evaluation"])
        ):
            suite = page.parents[2].name
            label = f"{row['run_id']} iteration {row['iteration']}: {suite}"
            links.append((label, Path(os.path.relpath(page, report_dir)).as_posix()))
    return links


def write_report(
    store: TrajectoryStore,
    out: str | Path,
    *,
    run_id: str | None = None,
    title: str = "rollyard report",
) -> Path:
    """Write the report of `store` (or of one run) to `out`, whole or not at all; returns the
    path. `out` is a new file in an existing directory or a regular file to replace (the rules
    of `rollyard.out_paths`: never a link, a directory or a device); checked before reading."""
    path = Path(out)
    check_file_target(path)
    tables = collect(store, run_id=run_id)
    html_text = render_html(
        tables,
        title=title,
        source=store.root,
        gate_docs=_gate_docs_links(store.root, tables["gates"], path.absolute().parent),
    )
    with replacing_file(path) as partial:
        partial.write_text(html_text, encoding="utf-8")
    return path
