"""The schemas of the store's tables, defined once and versioned.

Each `TableSpec` is the single source of truth for a table: its Arrow schema (field nullability is
enforced on write), its partition columns and the schema version written into the table's
description. Bump `SCHEMA_VERSION` whenever a field changes, and say in the changelog how to migrate.
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa

# v2: episodes record what acted (policy_kind, policy_model, sampling); steps record a language
# model's turns token in / token out (turn, tool_call_id, prompt_token_ids, finish_reason,
# reply_message). v3: episodes keep the task's instruction, its family and the share of its
# failing tests fixed, so an export or a trainer rebuilds a whole conversation and its training
# signal from the store alone. v4: episodes keep the verifier's named rewards (a Harbor task's
# `reward.json` metrics). Tables older than v3 lack columns and are refused on open (see
# `_check_schema`): write a new store. From v3 on, a column is only ever added, nullable, and
# listed in its table's `added`: a table that lacks it is read with nulls in it and gains it
# (a metadata-only Delta commit) when a writer first opens it.
SCHEMA_VERSION = 4

# Observations can be megabytes (a `cat` of a log); the store keeps the head and the original length
# so queries stay fast and the cut is visible.
OBSERVATION_CAP_CHARS = 8192

_TS = pa.timestamp("us", tz="UTC")


@dataclass(frozen=True, slots=True)
class TableSpec:
    """One table of the store: name, Arrow schema, partition columns and schema version."""

    name: str
    schema: pa.Schema
    partition_by: tuple[str, ...] = ()
    version: int = SCHEMA_VERSION
    added: tuple[tuple[str, int], ...] = ()
    """(column, schema version that added it) for the nullable columns added since v3; a table
    written before lacks them."""

    @property
    def description(self) -> str:
        """The Delta table description, which records the schema version for later migrations."""
        return f"rollyard {self.name} schema v{self.version}"

    @property
    def required(self) -> tuple[str, ...]:
        """Names of the fields a record must provide (non-nullable ones)."""
        return tuple(f.name for f in self.schema if not f.nullable)

    @property
    def added_columns(self) -> frozenset[str]:
        """Columns an older table of this name may lack (see `added`)."""
        return frozenset(name for name, _ in self.added)


def _f(name: str, type_: pa.DataType, nullable: bool = True) -> pa.Field:
    return pa.field(name, type_, nullable=nullable)


EPISODES = TableSpec(
    name="episodes",
    partition_by=("run_id", "iteration"),
    added=(("rewards", 4),),
    schema=pa.schema(
        [
            _f("episode_id", pa.string(), False),
            _f("run_id", pa.string(), False),
            _f("iteration", pa.int64(), False),
            _f("shard", pa.int32(), False),
            # One id per commit attempt; it ties a shard's steps to its episodes (see commits.py).
            _f("commit_id", pa.string(), False),
            _f("task_id", pa.string(), False),
            _f("task_version", pa.string(), False),
            # The task's family (demo, data_analysis, ...) and its instruction as the policy read
            # it (the conversation's first user message).
            _f("task_family", pa.string()),
            _f("instruction", pa.string()),
            # GRPO groups several samples of one task; group_index says which group, sample_index
            # which member, attempt how many times the sample was re-run after an infra error.
            _f("group_index", pa.int32(), False),
            _f("sample_index", pa.int32(), False),
            _f("attempt", pa.int32(), False),
            _f("policy_version", pa.string(), False),
            # What acted: "builtin", "openai", "hf", ...; the model's name (a served model id, a
            # model directory's name); the sampling parameters as JSON.
            _f("policy_kind", pa.string()),
            _f("policy_model", pa.string()),
            _f("sampling", pa.string()),
            # Async mode: updates the trainer is ahead of policy_version when it consumes this
            # episode (0 in sync mode; bounded by the run's max_policy_lag).
            _f("policy_lag", pa.int32()),
            _f("snapshot_digest", pa.string(), False),
            _f("sandbox_backend", pa.string(), False),
            # Null reward means "no verdict" (infra failure), never a silent 0.
            _f("reward", pa.float64()),
            _f("partial_credit", pa.float64()),
            # Share of the task's fail-to-pass tests passing after the episode (the trainer's
            # signal adds it to the reward).
            _f("fixed_fraction", pa.float64()),
            _f("passed", pa.bool_()),
            # A `rollyard.status.EpisodeStatus`: a trainable one (ok, timeout: the policy's
            # doing) carries a reward, an infrastructure one carries none.
            _f("status", pa.string(), False),
            _f("flags", pa.list_(pa.string()), False),
            _f("terminated", pa.bool_(), False),
            _f("truncated", pa.bool_(), False),
            _f("n_steps", pa.int32(), False),
            _f("queued_at", _TS),
            _f("started_at", _TS),
            _f("finished_at", _TS),
            _f("wall_s", pa.float64()),
            _f("sandbox_s", pa.float64()),
            _f("policy_s", pa.float64()),
            _f("verify_s", pa.float64()),
            _f("worker", pa.string()),
            _f("error", pa.string()),
            # The verifier's named rewards (metric name -> value): a Harbor task's `reward.json`,
            # or {"reward": r} from its `reward.txt`; null for verifiers that name none and for
            # episodes without a verdict. `reward` is the primary one among them (see
            # docs/harbor.md, "Rewards"). Last, as added in v4 (see `added`).
            _f("rewards", pa.map_(pa.string(), pa.float64())),
        ]
    ),
)

STEPS = TableSpec(
    name="steps",
    partition_by=("run_id", "iteration"),
    schema=pa.schema(
        [
            _f("episode_id", pa.string(), False),
            _f("run_id", pa.string(), False),
            _f("iteration", pa.int64(), False),
            _f("shard", pa.int32(), False),
            # One id per commit attempt; it ties a shard's steps to its episodes (see commits.py).
            _f("commit_id", pa.string(), False),
            _f("step", pa.int32(), False),
            _f("action_kind", pa.string(), False),
            _f("action_text", pa.string(), False),
            _f("observation", pa.string()),
            # Length of the observation before the cap; larger than len(observation) when cut.
            _f("observation_chars", pa.int64()),
            _f("exit_code", pa.int32()),
            _f("duration_s", pa.float64()),
            # Which policy decision the action came from: a language model's reply with several
            # tool calls makes several rows of one turn. The turn's tokens go on its first row.
            _f("turn", pa.int32()),
            _f("tool_call_id", pa.string()),
            # A language model's turn, token in / token out: the exact prompt ids it read, the ids
            # it sampled (token_ids) and the sampler's logprob of each; the built-in policy's
            # choice logprob is one value in logprobs. A trainer reads these, never re-tokenizes.
            _f("prompt_token_ids", pa.list_(pa.int32())),
            _f("token_ids", pa.list_(pa.int32())),
            _f("logprobs", pa.list_(pa.float32())),
            _f("finish_reason", pa.string()),
            # The model's reply as it sent it (OpenAI assistant message JSON).
            _f("reply_message", pa.string()),
        ]
    ),
)

TASKS = TableSpec(
    name="tasks",
    schema=pa.schema(
        [
            _f("task_id", pa.string(), False),
            _f("task_version", pa.string(), False),
            _f("family", pa.string()),
            _f("source", pa.string()),
            _f("difficulty", pa.string()),
            # Curation verdict: "accepted", "rejected", "quarantined", ...
            _f("status", pa.string(), False),
            _f("reason", pa.string()),
            _f("verifier_digest", pa.string()),
            _f("n_fail_to_pass", pa.int32()),
            _f("n_pass_to_pass", pa.int32()),
            _f("solution_passes", pa.bool_()),
            _f("batch_id", pa.string(), False),
            _f("recorded_at", _TS, False),
        ]
    ),
)

GATES = TableSpec(
    name="gates",
    schema=pa.schema(
        [
            _f("run_id", pa.string(), False),
            _f("iteration", pa.int64(), False),
            _f("suite", pa.string(), False),
            # "expectation" rows hold one expectation's result; the one "verdict" row per evaluation
            # holds the decision (quarantined or not) that the trainer obeys.
            _f("kind", pa.string(), False),
            _f("expectation", pa.string(), False),
            _f("success", pa.bool_(), False),
            _f("observed", pa.string()),
            _f("details", pa.string()),
            _f("quarantined", pa.bool_(), False),
            _f("reason", pa.string()),
            _f("evaluation", pa.int64(), False),
            _f("evaluated_at", _TS, False),
        ]
    ),
)

METRICS = TableSpec(
    name="metrics",
    schema=pa.schema(
        [
            _f("run_id", pa.string(), False),
            _f("iteration", pa.int64(), False),
            _f("source", pa.string(), False),
            _f("name", pa.string(), False),
            _f("value", pa.float64()),
            _f("recorded_at", _TS, False),
        ]
    ),
)

CHECKPOINTS = TableSpec(
    name="checkpoints",
    schema=pa.schema(
        [
            _f("run_id", pa.string(), False),
            _f("policy_version", pa.string(), False),
            _f("parent_policy_version", pa.string()),
            _f("iteration", pa.int64(), False),
            _f("trained_on_iterations", pa.list_(pa.int64()), False),
            _f("n_episodes", pa.int64(), False),
            _f("blob_path", pa.string(), False),
            _f("sha256", pa.string(), False),
            _f("size_bytes", pa.int64(), False),
            _f("metadata", pa.string()),
            _f("created_at", _TS, False),
        ]
    ),
)

REVIEW_VERDICTS = ("agree", "disagree")

REVIEWS = TableSpec(
    name="reviews",
    schema=pa.schema(
        [
            # Deterministic per (episode, reviewer, verdict, note): recording the same verdict
            # twice writes nothing; a changed verdict is a new row and the latest one counts.
            _f("review_id", pa.string(), False),
            _f("episode_id", pa.string(), False),
            _f("run_id", pa.string()),
            _f("iteration", pa.int64()),
            _f("task_id", pa.string()),
            _f("task_version", pa.string()),
            _f("family", pa.string()),
            # The verifier kind whose reward is under review: tests, artifact, rules, ...
            _f("verifier", pa.string()),
            _f("reward", pa.float64()),
            _f("episode_status", pa.string()),
            # "agree": the reward is right for what the episode did; "disagree": it is not.
            _f("verdict", pa.string(), False),
            _f("note", pa.string()),
            _f("reviewer", pa.string(), False),
            _f("reviewed_at", _TS, False),
        ]
    ),
)

TABLES: dict[str, TableSpec] = {
    spec.name: spec for spec in (EPISODES, STEPS, TASKS, GATES, METRICS, CHECKPOINTS, REVIEWS)
}
