"""Export a batch of trajectories for external trainers: a Hugging Face `datasets`-ready Parquet.

One row per trajectory: the conversation as OpenAI chat `messages` (system, user instruction,
assistant tool calls, tool answers — the same rendering the chat policy prompts with), the
reward, the group-relative advantage (`training.advantages.group_advantages`), the advantage each
action trains with in the built-in trainer (`step_advantages`: the group advantage plus the
action's trial credit; null for an action that carries no signal), and the token ids and
log-probabilities a served model returned, one list per action. `datasets.load_dataset("parquet",
data_files=...)` reads it as is; TRL/OpenRLHF-style trainers take `messages` + `reward`/
`advantage`, or `step_advantages` for per-action credit.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from training.actions import history_messages
from training.advantages import group_advantages
from training.builtin.grpo import GRPOConfig, step_advantages
from training.lm.conversation import SYSTEM_PROMPT
from training.policy import ChatRecord
from training.trajectory import Trajectory

_FUNCTION = pa.struct([("name", pa.string()), ("arguments", pa.string())])
_TOOL_CALL = pa.struct([("id", pa.string()), ("type", pa.string()), ("function", _FUNCTION)])
MESSAGE_TYPE = pa.struct(
    [
        ("role", pa.string()),
        ("content", pa.string()),
        ("tool_calls", pa.list_(_TOOL_CALL)),
        ("tool_call_id", pa.string()),
    ]
)
EXPORT_SCHEMA = pa.schema(
    [
        ("episode_id", pa.string()),
        ("group_id", pa.string()),
        ("run_id", pa.string()),
        ("iteration", pa.int64()),
        ("task_id", pa.string()),
        ("task_version", pa.string()),
        ("policy_version", pa.string()),
        ("status", pa.string()),
        ("messages", pa.list_(MESSAGE_TYPE)),
        ("reward", pa.float64()),
        ("advantage", pa.float64()),
        ("step_advantages", pa.list_(pa.float64())),
        ("passed", pa.bool_()),
        ("completion_token_ids", pa.list_(pa.list_(pa.int64()))),
        ("completion_logprobs", pa.list_(pa.list_(pa.float64()))),
    ],
    metadata={"rollyard.export": "1"},
)


def export_rows(
    trajectories: Sequence[Trajectory],
    *,
    config: GRPOConfig | None = None,
    include_masked: bool = False,
) -> list[dict[str, Any]]:
    """Rows of the export, one per trajectory. Trajectories none of whose actions carries a
    signal (error statuses, groups with infra failures, zero-variance groups without a credited
    trial) are left out unless `include_masked`, then with null advantages."""
    config = config or GRPOConfig()
    advantages, _ = group_advantages(trajectories, config)
    per_step = step_advantages(trajectories, config, advantages=advantages)
    rows = []
    for trajectory in trajectories:
        advantage = advantages.get(trajectory.episode_id)
        action_advantages = [
            per_step.get((trajectory.episode_id, s.index)) for s in trajectory.steps
        ]
        if all(a is None for a in action_advantages) and not include_masked:
            continue
        messages = []
        for message in history_messages(trajectory.history(), system_prompt=SYSTEM_PROMPT):
            messages.append(
                {
                    "role": message["role"],
                    "content": message.get("content"),
                    "tool_calls": message.get("tool_calls"),
                    "tool_call_id": message.get("tool_call_id"),
                }
            )
        token_ids: list[list[int]] = []
        logprobs: list[list[float]] = []
        for step in trajectory.steps:
            if isinstance(step.record, ChatRecord):
                token_ids.append(list(step.record.completion_token_ids))
                logprobs.append(list(step.record.completion_logprobs))
            else:
                token_ids.append([])
                logprobs.append([] if step.logprob is None else [step.logprob])
        rows.append(
            {
                "episode_id": trajectory.episode_id,
                "group_id": trajectory.group_id,
                "run_id": trajectory.key.run_id,
                "iteration": trajectory.key.iteration,
                "task_id": trajectory.task_id,
                "task_version": trajectory.task_version,
                "policy_version": trajectory.policy_version,
                "status": str(trajectory.status),
                "messages": messages,
                "reward": trajectory.reward,
                "advantage": advantage,
                "step_advantages": action_advantages,
                "passed": trajectory.passed,
                "completion_token_ids": token_ids,
                "completion_logprobs": logprobs,
            }
        )
    return rows


def export_batch(
    trajectories: Sequence[Trajectory],
    path: str | os.PathLike[str],
    *,
    config: GRPOConfig | None = None,
    include_masked: bool = False,
) -> Path:
    """Write the batch as one Parquet file (atomically: a temporary file renamed into place, so
    a reader never sees half a file). Returns the path."""
    target = Path(path)
    table = pa.Table.from_pylist(
        export_rows(trajectories, config=config, include_masked=include_masked),
        schema=EXPORT_SCHEMA,
    )
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f".{target.name}.partial")
    pq.write_table(table, partial)
    partial.replace(target)
    return target


def tool_call_arguments(message: dict[str, Any]) -> list[dict[str, Any]]:
    """Decoded arguments of an exported assistant message's tool calls (for readers)."""
    return [json.loads(call["function"]["arguments"]) for call in message.get("tool_calls") or []]
