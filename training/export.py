"""Export committed trajectories from the store for external trainers, as Parquet datasets in
three layouts:

- `hf`: one row per episode, everything rollyard knows of it — the conversation as OpenAI chat
  `messages` (system, the instruction, assistant tool calls, tool answers), the tools' JSON
  schemas, what acted, the reward (and the verifier's named rewards), the group-relative advantage
  (`training.advantages.group_advantages`), the advantage each action trains with (`step_advantages`:
  the group advantage plus the action's trial credit; null for an action without signal), and
  per language-model turn the exact prompt ids, sampled ids and sampler logprobs.
  `datasets.load_dataset("parquet", data_files=...)` reads it as is.
- `trl`: TRL's conversational prompt-completion type: `prompt` (system and user messages),
  `completion` (the assistant and tool messages that followed), `tools`, and `label` (the
  episode passed: TRL's unpaired-preference column), with the reward and advantages beside.
- `verl`: verl's RL dataset columns — `data_source` (`rollyard/<family>`), `prompt` (chat
  messages), `ability`, `reward_model` (`style: rule`; `ground_truth` names the task whose
  verifier scores it) and `extra_info` (split, index, and the episode: messages, tools, token
  ids, logprobs, reward, advantages).

Only committed episodes of iterations no quality gate quarantined are read (`read_trajectories`),
and episodes none of whose actions carries a training signal are left out unless
`include_masked`:

    export_store(TrajectoryStore("store"), "out", export_format="hf", run_id="run-0")
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

import pyarrow as pa
import pyarrow.parquet as pq

from storage import TrajectoryStore
from training.actions import TryEdit, history_messages
from training.advantages import group_advantages
from training.builtin.grpo import GRPOConfig, step_advantages
from training.errors import TrainingSettingsError
from training.lm.conversation import SYSTEM_PROMPT, TOOL_SCHEMAS, TRY_EDIT_SCHEMA
from training.policy import ChatRecord
from training.stored import IterationRange, read_trajectories
from training.trajectory import Trajectory

ExportFormat = Literal["hf", "trl", "verl"]
EXPORT_FORMATS: tuple[str, ...] = get_args(ExportFormat)
DATA_FILE = "train.parquet"
"""The file an export writes in its directory (`load_dataset("parquet", data_files=...)`, or
`load_dataset(DIR)`, which takes it as the train split)."""

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
"""An OpenAI chat message; tool-call arguments are JSON text, as OpenAI sends them."""
_IDS = pa.list_(pa.list_(pa.int32()))
_LOGPROBS = pa.list_(pa.list_(pa.float64()))

_EPISODE_FIELDS = [
    pa.field("episode_id", pa.string()),
    pa.field("group_id", pa.string()),
    pa.field("run_id", pa.string()),
    pa.field("iteration", pa.int64()),
    pa.field("task_id", pa.string()),
    pa.field("task_version", pa.string()),
    pa.field("task_family", pa.string()),
    pa.field("policy_kind", pa.string()),
    pa.field("policy_model", pa.string()),
    pa.field("policy_version", pa.string()),
    pa.field("sampling", pa.string()),
    pa.field("status", pa.string()),
    pa.field("reward", pa.float64()),
    # The verifier's named rewards (`reward` is the primary one among them); null if none. A list
    # of (name, value) rather than the store's map: HF datasets has no map type.
    pa.field(
        "rewards",
        pa.list_(pa.struct([pa.field("name", pa.string()), pa.field("value", pa.float64())])),
    ),
    pa.field("passed", pa.bool_()),
    pa.field("advantage", pa.float64()),
    pa.field("step_advantages", pa.list_(pa.float64())),
    pa.field("step_logprobs", pa.list_(pa.float64())),
    pa.field("step_turns", pa.list_(pa.int32())),
    pa.field("tools", pa.string()),
    pa.field("prompt_token_ids", _IDS),
    pa.field("completion_token_ids", _IDS),
    pa.field("completion_logprobs", _LOGPROBS),
]
"""Columns of every format (`extra_info` of verl): per action `step_advantages`,
`step_logprobs` (the decision's logprob on its first action) and `step_turns` (which assistant
turn the action came from); per language-model turn the token ids and logprobs; `tools` as a
JSON array of function schemas."""

HF_SCHEMA = pa.schema(
    [*_EPISODE_FIELDS, pa.field("messages", pa.list_(MESSAGE_TYPE))],
    metadata={"rollyard.export": "hf/1"},
)
TRL_SCHEMA = pa.schema(
    [
        pa.field("prompt", pa.list_(MESSAGE_TYPE)),
        pa.field("completion", pa.list_(MESSAGE_TYPE)),
        pa.field("label", pa.bool_()),
        *_EPISODE_FIELDS,
    ],
    metadata={"rollyard.export": "trl/1"},
)
_VERL_EXTRA_INFO = pa.struct(
    [
        pa.field("split", pa.string()),
        pa.field("index", pa.int64()),
        *_EPISODE_FIELDS,
        pa.field("messages", pa.list_(MESSAGE_TYPE)),
    ]
)
VERL_SCHEMA = pa.schema(
    [
        pa.field("data_source", pa.string()),
        pa.field("prompt", pa.list_(MESSAGE_TYPE)),
        pa.field("ability", pa.string()),
        pa.field(
            "reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])
        ),
        pa.field("extra_info", _VERL_EXTRA_INFO),
    ],
    metadata={"rollyard.export": "verl/1"},
)
SCHEMAS: dict[str, pa.Schema] = {"hf": HF_SCHEMA, "trl": TRL_SCHEMA, "verl": VERL_SCHEMA}


@dataclasses.dataclass(frozen=True, slots=True)
class ExportResult:
    """What an export wrote."""

    path: Path
    """The Parquet file (`DIR/train.parquet`)."""
    export_format: str
    rows: int
    episodes_read: int
    """Committed, non-quarantined episodes matched; those without signal are not rows unless
    `include_masked`."""


def episode_rows(
    trajectories: Sequence[Trajectory],
    *,
    config: GRPOConfig | None = None,
    include_masked: bool = False,
) -> list[dict[str, Any]]:
    """The `hf` rows, one per trajectory. Advantages are computed over the groups of
    `trajectories` (give whole iterations). Trajectories none of whose actions carries a signal
    (error statuses, groups with infra failures, zero-variance groups without a credited trial)
    are left out unless `include_masked`, then with null advantages."""
    config = config or GRPOConfig()
    advantages, _ = group_advantages(trajectories, config)
    per_step = step_advantages(trajectories, config, advantages=advantages)
    rows = []
    for trajectory in trajectories:
        action_advantages = [
            per_step.get((trajectory.episode_id, s.index)) for s in trajectory.steps
        ]
        if all(a is None for a in action_advantages) and not include_masked:
            continue
        chat_turns = [s.record for s in trajectory.steps if isinstance(s.record, ChatRecord)]
        tools = list(TOOL_SCHEMAS)
        if any(isinstance(s.action, TryEdit) for s in trajectory.steps):
            tools.append(TRY_EDIT_SCHEMA)
        identity = trajectory.policy
        rows.append(
            {
                "episode_id": trajectory.episode_id,
                "group_id": trajectory.group_id,
                "run_id": trajectory.key.run_id,
                "iteration": trajectory.key.iteration,
                "task_id": trajectory.task_id,
                "task_version": trajectory.task_version,
                "task_family": trajectory.task_family,
                "policy_kind": identity.kind if identity else None,
                "policy_model": identity.model if identity else None,
                "policy_version": trajectory.policy_version,
                "sampling": identity.sampling if identity else None,
                "status": str(trajectory.status),
                "reward": trajectory.reward,
                "rewards": [{"name": k, "value": v} for k, v in trajectory.rewards.items()]
                if trajectory.rewards
                else None,
                "passed": trajectory.passed,
                "advantage": advantages.get(trajectory.episode_id),
                "step_advantages": action_advantages,
                "step_logprobs": [s.logprob for s in trajectory.steps],
                "step_turns": [s.turn_index for s in trajectory.steps],
                "tools": json.dumps(tools, ensure_ascii=False),
                "prompt_token_ids": [list(r.prompt_token_ids) for r in chat_turns],
                "completion_token_ids": [list(r.completion_token_ids) for r in chat_turns],
                "completion_logprobs": [list(r.completion_logprobs) for r in chat_turns],
                "messages": _messages(trajectory),
            }
        )
    return rows


def _messages(trajectory: Trajectory) -> list[dict[str, Any]]:
    return [
        {
            "role": message["role"],
            "content": message.get("content"),
            "tool_calls": message.get("tool_calls"),
            "tool_call_id": message.get("tool_call_id"),
        }
        for message in history_messages(trajectory.history(), system_prompt=SYSTEM_PROMPT)
    ]


def _prompt_length(messages: Sequence[dict[str, Any]]) -> int:
    """The messages before the first assistant turn: the system prompt and the instruction."""
    for index, message in enumerate(messages):
        if message["role"] == "assistant":
            return index
    return len(messages)


def trl_row(row: dict[str, Any]) -> dict[str, Any]:
    messages = row["messages"]
    cut = _prompt_length(messages)
    episode = {k: v for k, v in row.items() if k != "messages"}
    return {
        "prompt": messages[:cut],
        "completion": messages[cut:],
        "label": bool(row["passed"]),
        **episode,
    }


def verl_row(row: dict[str, Any], index: int) -> dict[str, Any]:
    messages = row["messages"]
    return {
        "data_source": f"rollyard/{row['task_family'] or 'unknown'}",
        "prompt": messages[: _prompt_length(messages)],
        "ability": "agent",
        "reward_model": {
            "style": "rule",
            # The reward is the task's verifier run in a fresh sandbox, not a string match:
            # the ground truth names the task (and version) whose verifier scores an episode.
            "ground_truth": json.dumps(
                {"task_id": row["task_id"], "task_version": row["task_version"]}
            ),
        },
        "extra_info": {"split": "train", "index": index, **row},
    }


def export_trajectories(
    trajectories: Sequence[Trajectory],
    out_dir: str | os.PathLike[str],
    *,
    export_format: ExportFormat = "hf",
    config: GRPOConfig | None = None,
    include_masked: bool = False,
) -> ExportResult:
    """Write `trajectories` in `export_format` as `out_dir/train.parquet`. `out_dir` must not
    exist or be empty; the file is written in a directory beside it that is renamed into place,
    so a reader never sees half an export."""
    if export_format not in SCHEMAS:
        raise TrainingSettingsError(
            f"export format {export_format!r} is not one of {', '.join(EXPORT_FORMATS)}"
        )
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrainingSettingsError(
            f"{out} exists and is not an empty directory; give a new directory to export into"
        )
    rows = episode_rows(trajectories, config=config, include_masked=include_masked)
    if not rows:
        raise TrainingSettingsError(
            f"all {len(trajectories)} episodes are in groups the trainer masks (every sample "
            "scored alike, or an infrastructure failure): no row carries an advantage; "
            "--include-masked exports them with null advantages"
        )
    if export_format == "trl":
        rows = [trl_row(row) for row in rows]
    elif export_format == "verl":
        rows = [verl_row(row, index) for index, row in enumerate(rows)]
    table = pa.Table.from_pylist(rows, schema=SCHEMAS[export_format])
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = Path(tempfile.mkdtemp(prefix=f".{out.name}.partial-", dir=out.parent))
    try:
        pq.write_table(table, partial / DATA_FILE)
        if out.exists():
            out.rmdir()
        partial.rename(out)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return ExportResult(out / DATA_FILE, export_format, table.num_rows, len(trajectories))


def export_store(
    store: TrajectoryStore,
    out_dir: str | os.PathLike[str],
    *,
    export_format: ExportFormat = "hf",
    run_id: str | None = None,
    iterations: IterationRange | None = None,
    config: GRPOConfig | None = None,
    include_masked: bool = False,
) -> ExportResult:
    """Export the committed, non-quarantined episodes of `run_id` (every run when None) in
    `iterations` from the store (see the module doc). Raises `TrainingSettingsError` (exit 2)
    when none match."""
    trajectories = read_trajectories(store, run_id=run_id, iterations=iterations)
    if not trajectories:
        which = f"run {run_id!r}" if run_id else "any run"
        if iterations is not None:
            which += f", iterations {iterations.start or ''}:{iterations.stop or ''}"
        raise TrainingSettingsError(
            f"no committed, non-quarantined episodes of {which} in {store.root}; check the run "
            "id (`rollyard query --named reward_curve`) and the iteration range"
        )
    return export_trajectories(
        trajectories,
        out_dir,
        export_format=export_format,
        config=config,
        include_masked=include_masked,
    )
