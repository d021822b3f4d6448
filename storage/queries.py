"""DuckDB views over the store's tables and the named queries users run daily.

Views derived here (on top of one view per table, see `TrajectoryStore.connect`):

- `gate_verdicts`: the latest verdict per (run_id, iteration, suite);
- `iteration_status`: per (run_id, iteration) with episodes, whether it is quarantined and why;
- `training_episodes`: committed episodes of iterations that are not quarantined;
- `tasks_latest`: the latest catalog row per (task_id, task_version);
- `reviews_latest`: each reviewer's latest verdict per episode.
"""

from __future__ import annotations

from dataclasses import dataclass

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
