"""DuckDB views over the store's tables, the named queries users run daily, and the read-only
connection every user-facing query runs on.

Views derived here (on top of one view per table, see `TrajectoryStore.connect`):

- `gate_verdicts`: the latest verdict per (run_id, iteration, suite);
- `iteration_status`: per (run_id, iteration) with episodes, whether it is quarantined and why;
- `training_episodes`: committed episodes of iterations that are not quarantined;
- `tasks_latest`: the latest catalog row per (task_id, task_version);
- `reviews_latest`: each reviewer's latest verdict per episode.
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from storage.errors import QueryError

if TYPE_CHECKING:
    import duckdb

DERIVED_VIEWS: dict[str, str] = {
    "gate_verdicts": """
        SELECT run_id, iteration, suite, quarantined, reason, evaluation, evaluated_at
        FROM gates
        WHERE kind = 'verdict'
        QUALIFY row_number() OVER (
            PARTITION BY run_id, iteration, suite ORDER BY evaluation DESC, evaluated_at DESC
        ) = 1
    """,
    "iteration_status": """
        SELECT e.run_id, e.iteration,
               coalesce(bool_or(v.quarantined), false) AS quarantined,
               string_agg(CASE WHEN v.quarantined THEN v.suite || ': ' || coalesce(v.reason, '') END,
                          '; ') AS reason
        FROM (SELECT DISTINCT run_id, iteration FROM episodes) e
        LEFT JOIN gate_verdicts v USING (run_id, iteration)
        GROUP BY e.run_id, e.iteration
    """,
    "training_episodes": """
        SELECT e.* FROM episodes e
        WHERE NOT EXISTS (
            SELECT 1 FROM gate_verdicts v
            WHERE v.quarantined AND v.run_id = e.run_id AND v.iteration = e.iteration
        )
    """,
    "tasks_latest": """
        SELECT * FROM tasks
        QUALIFY row_number() OVER (
            PARTITION BY task_id, task_version ORDER BY recorded_at DESC
        ) = 1
    """,
    "reviews_latest": """
        SELECT * FROM reviews
        QUALIFY row_number() OVER (
            PARTITION BY episode_id, reviewer ORDER BY reviewed_at DESC, review_id
        ) = 1
    """,
}


@dataclass(frozen=True, slots=True)
class NamedQuery:
    """A query users run by name (`rollyard query --named NAME`)."""

    name: str
    description: str
    sql: str


_QUERIES: tuple[NamedQuery, ...] = (
    NamedQuery(
        "reward_curve",
        "Per run and iteration: episodes, mean reward, pass rate, reward quantiles, mean steps.",
        """
        SELECT run_id, iteration,
               count(*) AS episodes,
               avg(reward) AS mean_reward,
               avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
               quantile_cont(reward, 0.1) AS reward_p10,
               quantile_cont(reward, 0.5) AS reward_p50,
               quantile_cont(reward, 0.9) AS reward_p90,
               avg(n_steps) AS mean_steps
        FROM episodes
        GROUP BY run_id, iteration
        ORDER BY run_id, iteration
        """,
    ),
    NamedQuery(
        "pass_rate_by_task",
        "Per task and difficulty bucket: episodes, pass rate and mean reward, hardest first.",
        """
        SELECT e.task_id, coalesce(t.difficulty, 'unknown') AS difficulty,
               count(*) AS episodes,
               avg(CASE WHEN e.passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
               avg(e.reward) AS mean_reward
        FROM episodes e
        LEFT JOIN (SELECT task_id, task_version, difficulty FROM tasks_latest) t
               USING (task_id, task_version)
        WHERE e.status = 'ok'
        GROUP BY ALL
        ORDER BY pass_rate, task_id
        """,
    ),
    NamedQuery(
        "pass_rate_by_difficulty",
        "Per difficulty bucket: tasks, episodes and pass rate.",
        """
        SELECT coalesce(t.difficulty, 'unknown') AS difficulty,
               count(DISTINCT e.task_id) AS tasks,
               count(*) AS episodes,
               avg(CASE WHEN e.passed THEN 1.0 ELSE 0.0 END) AS pass_rate
        FROM episodes e
        LEFT JOIN (SELECT task_id, task_version, difficulty FROM tasks_latest) t
               USING (task_id, task_version)
        WHERE e.status = 'ok'
        GROUP BY ALL
        ORDER BY difficulty
        """,
    ),
    NamedQuery(
        "failure_taxonomy",
        "Per run, iteration and status: episodes and their share of the iteration.",
        """
        SELECT run_id, iteration, status,
               count(*) AS episodes,
               count(*) / sum(count(*)) OVER (PARTITION BY run_id, iteration) AS share
        FROM episodes
        GROUP BY run_id, iteration, status
        ORDER BY run_id, iteration, episodes DESC
        """,
    ),
    NamedQuery(
        "throughput",
        "Per run and iteration: episodes/s over the wall span, sandbox seconds, mean queue wait.",
        """
        SELECT run_id, iteration,
               count(*) AS episodes,
               date_diff('millisecond', min(started_at), max(finished_at)) / 1000.0 AS span_s,
               count(*) / nullif(
                   date_diff('millisecond', min(started_at), max(finished_at)) / 1000.0, 0
               ) AS episodes_per_s,
               sum(sandbox_s) AS sandbox_s,
               sum(policy_s) AS policy_s,
               avg(date_diff('millisecond', queued_at, started_at) / 1000.0) AS mean_queue_wait_s,
               count(DISTINCT worker) AS workers
        FROM episodes
        GROUP BY run_id, iteration
        ORDER BY run_id, iteration
        """,
    ),
    NamedQuery(
        "hack_flag_rates",
        "Per run, iteration and flag: flagged episodes and their rate in the iteration.",
        """
        WITH totals AS (
            SELECT run_id, iteration, count(*) AS episodes FROM episodes GROUP BY ALL
        ), flagged AS (
            SELECT run_id, iteration, unnest(flags) AS flag FROM episodes
        )
        SELECT f.run_id, f.iteration, f.flag, count(*) AS flagged,
               count(*) / any_value(t.episodes) AS rate
        FROM flagged f JOIN totals t USING (run_id, iteration)
        GROUP BY f.run_id, f.iteration, f.flag
        ORDER BY f.run_id, f.iteration, rate DESC
        """,
    ),
    NamedQuery(
        "audit_rates",
        "Per run and iteration (latest audit): top-reward episodes audited, and the shares "
        "confirmed, not reproduced and suspicious.",
        """
        WITH latest AS (
            SELECT run_id, iteration, max(evaluation) AS evaluation FROM gates
            WHERE suite = 'audit' GROUP BY ALL
        )
        SELECT g.run_id, g.iteration, count(*) AS audited,
               avg(CASE WHEN g.observed = 'confirmed' THEN 1.0 ELSE 0.0 END) AS confirmed_rate,
               avg(CASE WHEN g.observed = 'not_reproduced' THEN 1.0 ELSE 0.0 END)
                   AS not_reproduced_rate,
               avg(CASE WHEN g.observed = 'suspicious' THEN 1.0 ELSE 0.0 END) AS suspicious_rate
        FROM gates g JOIN latest l USING (run_id, iteration, evaluation)
        WHERE g.suite = 'audit' AND g.kind = 'expectation'
        GROUP BY g.run_id, g.iteration
        ORDER BY g.run_id, g.iteration
        """,
    ),
    NamedQuery(
        "lineage",
        "Task → checkpoint: which policy versions trained on which task version, from how many "
        "non-quarantined episodes.",
        """
        WITH trained AS (
            SELECT run_id, policy_version, iteration AS produced_at_iteration,
                   unnest(trained_on_iterations) AS iteration
            FROM checkpoints
        )
        SELECT e.task_id, e.task_version, t.run_id, t.policy_version,
               min(t.produced_at_iteration) AS produced_at_iteration,
               list(DISTINCT e.iteration ORDER BY e.iteration) AS iterations,
               count(*) AS episodes
        FROM training_episodes e
        JOIN trained t ON t.run_id = e.run_id AND t.iteration = e.iteration
        GROUP BY e.task_id, e.task_version, t.run_id, t.policy_version
        ORDER BY e.task_id, e.task_version, t.run_id, produced_at_iteration
        """,
    ),
)

REVIEW_AGREEMENT_SQL = """
    SELECT coalesce(family, 'unknown') AS family,
           coalesce(verifier, 'unknown') AS verifier,
           CAST(date_trunc('day', reviewed_at) AS DATE) AS day,
           count(*) AS reviews,
           CAST(sum(CASE WHEN verdict = 'agree' THEN 1 ELSE 0 END) AS BIGINT) AS agreed,
           avg(CASE WHEN verdict = 'agree' THEN 1.0 ELSE 0.0 END) AS agreement_rate
    FROM reviews_latest
    GROUP BY ALL
    ORDER BY family, verifier, day
"""

_QUERIES = (
    *_QUERIES,
    NamedQuery(
        "policies",
        "Per run and iteration: what acted (policy kind, model, version, sampling as JSON) and "
        "its episodes, mean reward and pass rate.",
        """
        SELECT run_id, iteration, policy_kind, policy_model, policy_version, sampling,
               count(*) AS episodes,
               avg(reward) AS mean_reward,
               avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) AS pass_rate
        FROM episodes
        GROUP BY ALL
        ORDER BY run_id, iteration, policy_version
        """,
    ),
    NamedQuery(
        "named_rewards",
        "Per run, iteration and metric: the verifier's named rewards (a Harbor task's "
        "reward.json) over the episodes that wrote them; `reward` is the one that trains.",
        """
        SELECT run_id, iteration, entry.key AS metric, count(*) AS episodes,
               avg(entry.value) AS mean, min(entry.value) AS min, max(entry.value) AS max
        FROM (SELECT run_id, iteration, unnest(map_entries(rewards)) AS entry
              FROM episodes WHERE rewards IS NOT NULL)
        GROUP BY ALL
        ORDER BY run_id, iteration, metric
        """,
    ),
    NamedQuery(
        "pass_at_k",
        "Per evaluation run: pass@k over all tasks, per family and per task (`rollyard "
        "evaluate`), with what acted.",
        """
        WITH acted AS (
            SELECT run_id, string_agg(DISTINCT policy_kind || ':' || policy_version, ', ')
                       AS policy,
                   any_value(policy_model) AS policy_model
            FROM episodes GROUP BY run_id
        ), parts AS (
            SELECT run_id, iteration, value, string_split(name, '/') AS part FROM metrics
            WHERE source = 'pass_at_k'
        )
        SELECT p.run_id, a.policy, a.policy_model,
               CAST(substr(p.part[1], 6) AS INTEGER) AS k,
               coalesce(p.part[2], 'all') AS scope,
               coalesce(array_to_string(p.part[3:], '/'), '') AS key,
               p.value AS pass_at_k
        FROM parts p LEFT JOIN acted a USING (run_id)
        ORDER BY p.run_id, CASE scope WHEN 'all' THEN 0 WHEN 'family' THEN 1 ELSE 2 END, key, k
        """,
    ),
    NamedQuery(
        "review_agreement",
        "Per family, verifier and day: human spot checks and the share agreeing with the reward.",
        REVIEW_AGREEMENT_SQL,
    ),
)

NAMED_QUERIES: dict[str, NamedQuery] = {query.name: query for query in _QUERIES}


# -- the read-only connection ---------------------------------------------------------------------
#
# What a user's SQL may do is decided twice, so that neither check alone is the boundary:
# - DuckDB's own configuration, locked before any user SQL runs: no external access except the
#   table directories its views read (and the export directory, when one is given), no extension
#   install or load, no spilling to a temp directory;
# - the statements themselves: only SELECT (and EXPLAIN of one) runs; COPY only with an export
#   directory. This is what stops writes DuckDB's file allowlist would let through (it does not
#   tell reads from writes: a COPY may overwrite a file it may read), and writes to the in-memory
#   catalog (CREATE, INSERT, SET, ATTACH, ...).

_EXPLAIN = re.compile(r"\s*EXPLAIN\s+(?:ANALYZE\s+)?(?P<explained>.*)", re.IGNORECASE | re.DOTALL)
_QUOTED_PATH = re.compile(r'"([^"]*)"')
_EXPORT_HINT = "to export results, add --allow-writes-to DIR and COPY (SELECT ...) TO 'DIR/FILE'"


def open_connection() -> duckdb.DuckDBPyConnection:
    """A new in-memory DuckDB connection that installs and loads no extension by itself and never
    spills to disk; register views on it, then `restrict` it before any user SQL runs."""
    import duckdb

    return duckdb.connect(
        config={
            "autoinstall_known_extensions": False,
            "autoload_known_extensions": False,
            "allow_community_extensions": False,
            "temp_directory": "",
        }
    )


def load_delta_extension(con: duckdb.DuckDBPyConnection, *, install: bool = False) -> bool:
    """Load DuckDB's delta extension on `con`, downloading it first with `install`; whether it
    is loaded. Without network access the download fails (after a few seconds), so queries only
    load an extension installed already (`rollyard store duckdb-file --install-delta` does)."""
    import duckdb

    global _delta_missing
    if not install and _delta_missing:
        return False
    statements = ["INSTALL delta", "LOAD delta"] if install else ["LOAD delta"]
    try:
        for statement in statements:
            con.execute(statement)
    except duckdb.Error:
        _delta_missing = True
        return False
    _delta_missing = False
    return True


# Set once loading the extension failed in this process: a failed LOAD takes ~0.4 s, and the
# store opens a connection per read; a later install clears it.
_delta_missing = False


def export_directory(directory: str | os.PathLike[str], store_root: str) -> str:
    """`directory` as the absolute path DuckDB may write under, after checking it is an existing
    directory apart from the store (a COPY into the store could overwrite its data files)."""
    path = Path(directory).absolute()
    if not path.is_dir():
        raise QueryError(
            f"--allow-writes-to {directory}: not an existing directory; create it first"
        )
    resolved = Path(os.path.realpath(path))
    if "://" not in store_root:
        store = Path(os.path.realpath(store_root))
        if resolved == store or store in resolved.parents or resolved in store.parents:
            raise QueryError(
                f"--allow-writes-to {directory}: overlaps the store {store_root}; give a "
                "directory outside it"
            )
    return str(resolved)


def restrict(
    con: duckdb.DuckDBPyConnection,
    *,
    read_directories: Sequence[str] = (),
    write_directory: str | None = None,
) -> StoreConnection:
    """Lock `con` down and wrap it: DuckDB reaches only `read_directories` (the table directories
    its views read natively) and `write_directory`, and its configuration is frozen.

    A connection that may write reads no store file itself (its views must be Arrow datasets):
    DuckDB's allowlist does not tell reads from writes, so a store directory on it would be
    writable too.
    """
    if write_directory is not None and read_directories:
        raise ValueError("a connection that may write must read the store through Arrow datasets")
    allowed = [os.path.join(d, "") for d in (*read_directories, *filter(None, [write_directory]))]
    try:
        # Order matters: the allowlist cannot change once external access is off.
        con.execute("SET allowed_directories = ?", [allowed])
        con.execute("SET enable_external_access = false")
        con.execute("SET lock_configuration = true")
    except BaseException:
        con.close()
        raise
    return StoreConnection(con, write_directory=write_directory)


def check_statements(sql: str, *, write_directory: str | None = None) -> None:
    """Raise `QueryError` unless every statement of `sql` only reads (SELECT, EXPLAIN of a
    SELECT), or is a COPY while an export directory is given."""
    import duckdb

    try:
        statements = duckdb.extract_statements(sql)
    except duckdb.Error:
        return  # not parseable: executing it reports the syntax error, and runs nothing
    for statement in statements:
        kind = statement.type.name
        if kind == "LOAD":  # DuckDB files INSTALL under LOAD; name what the user wrote
            kind = " ".join(statement.query.split()[:1]).upper() or kind
        if kind == "SELECT" or (kind == "COPY" and write_directory is not None):
            continue
        if kind == "EXPLAIN" and _explains_only_selects(statement.query):
            continue
        if write_directory is None:
            raise QueryError(
                f"refused: {kind} statement; store queries are read-only (SELECT, or EXPLAIN "
                f"of one); {_EXPORT_HINT}"
            )
        raise QueryError(
            f"refused: {kind} statement; store queries may only read, and COPY ... TO files "
            f"under {write_directory}"
        )


def _explains_only_selects(text: str) -> bool:
    import duckdb

    match = _EXPLAIN.fullmatch(text)
    if match is None:
        return False
    try:
        explained = duckdb.extract_statements(match["explained"])
    except duckdb.Error:
        return False
    return bool(explained) and all(s.type.name == "SELECT" for s in explained)


def refusal(error: duckdb.PermissionException, write_directory: str | None = None) -> QueryError:
    """One line for a file DuckDB was not allowed to touch."""
    found = _QUOTED_PATH.search(str(error))
    what = f"touches {found.group(1)!r}" if found else "reaches"
    where = (
        f"read only the store's tables and write only under {write_directory}"
        if write_directory
        else f"read only the store's tables; {_EXPORT_HINT}"
    )
    return QueryError(f"refused: the query {what} outside the store; store queries {where}")


class StoreConnection:
    """A locked-down DuckDB connection over one snapshot of the store (`TrajectoryStore.connect`).

    `sql` runs reading SQL only (see `check_statements`) and returns a DuckDB relation. This guards SQL text; it is not a Python sandbox: relation methods such as
    `to_parquet` still meet DuckDB's locked file allowlist, and nothing stops Python code from
    opening files itself.
    """

    def __init__(
        self, con: duckdb.DuckDBPyConnection, *, write_directory: str | None = None
    ) -> None:
        self._con = con
        self.write_directory = write_directory

    def sql(self, query: str, params: Sequence[Any] | None = None) -> duckdb.DuckDBPyRelation:
        """Run `query` (with `?` parameters) and return its relation (typed as DuckDB types it,
        although a COPY returns None)."""
        import duckdb

        check_statements(query, write_directory=self.write_directory)
        try:
            return self._con.sql(query, params=list(params) if params else None)
        except duckdb.PermissionException as error:
            raise refusal(error, self.write_directory) from None

    def close(self) -> None:
        self._con.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
