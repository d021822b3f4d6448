"""Trajectories read back from the store: what an export or a trainer reading committed data
gets, rebuilt from the `episodes` and `steps` rows alone (never from a rollout's memory).

    trajectories = read_trajectories(store, run_id="run-0", iterations=IterationRange(2, 5))

Observations come back as the store keeps them (capped at `storage.schemas.OBSERVATION_CAP_CHARS`);
a language model's turns carry the exact prompt ids, sampled ids and sampler logprobs the rollout
stored, so a trainer never re-tokenizes. The built-in policy's per-candidate features are not
stored: its steps come back without a `ScorerRecord`.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa

from rollyard.status import EpisodeStatus
from storage import TrajectoryStore
from training.actions import Observation, action_from_json
from training.errors import TrainingSettingsError
from training.policy import ChatRecord, PolicyIdentity
from training.trajectory import EpisodeKey, Step, Trajectory


@dataclasses.dataclass(frozen=True, slots=True)
class IterationRange:
    """Iterations `start` <= i < `stop` (an open end is None), as `A:B` reads on the command line."""

    start: int | None = None
    stop: int | None = None

    def __post_init__(self) -> None:
        if self.start is not None and self.stop is not None and self.stop <= self.start:
            raise TrainingSettingsError(
                f"iterations {self.start}:{self.stop} select nothing; write A:B with A < B "
                "(B excluded), A: or :B"
            )

    @classmethod
    def parse(cls, text: str) -> IterationRange:
        """`A:B`, `A:`, `:B` or a single iteration `A`."""
        start_text, colon, stop_text = text.partition(":")
        try:
            start = int(start_text) if start_text.strip() else None
            stop = int(stop_text) if stop_text.strip() else None
        except ValueError:
            raise TrainingSettingsError(
                f"iterations {text!r} are not A:B (integers, B excluded; A: and :B leave an end "
                "open)"
            ) from None
        if not colon:
            if start is None:
                raise TrainingSettingsError("iterations: give A:B, A:, :B or one iteration A")
            return cls(start, start + 1)
        return cls(start, stop)

    def __contains__(self, iteration: object) -> bool:
        if not isinstance(iteration, int):
            return False
        return (self.start is None or iteration >= self.start) and (
            self.stop is None or iteration < self.stop
        )


def read_trajectories(
    store: TrajectoryStore,
    *,
    run_id: str | None = None,
    iterations: IterationRange | None = None,
    include_quarantined: bool = False,
) -> list[Trajectory]:
    """The committed episodes of `run_id` (every run when None) in `iterations`, leaving out
    iterations a quality gate quarantined unless `include_quarantined`, as trajectories ordered
    by (run, iteration, group, sample, attempt)."""
    episodes = store.read_episodes(run_id, include_quarantined=include_quarantined)
    rows = [
        row
        for row in episodes.to_pylist()
        if iterations is None or int(row["iteration"]) in iterations
    ]
    if not rows:
        return []
    steps = store.read_steps(run_id, episode_ids=[row["episode_id"] for row in rows])
    steps_by_episode: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for step in _rows(steps):
        steps_by_episode[step["episode_id"]].append(step)
    rows.sort(
        key=lambda r: (
            r["run_id"],
            r["iteration"],
            r["group_index"],
            r["sample_index"],
            r["attempt"],
        )
    )
    return [_trajectory(row, steps_by_episode.get(row["episode_id"], [])) for row in rows]


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return table.to_pylist()  # type: ignore[no-any-return]


def _trajectory(row: Mapping[str, Any], step_rows: Sequence[Mapping[str, Any]]) -> Trajectory:
    key = EpisodeKey(
        row["run_id"],
        int(row["iteration"]),
        group_index=int(row["group_index"]),
        sample_index=int(row["sample_index"]),
        attempt=int(row["attempt"]),
    )
    identity = PolicyIdentity(
        kind=row["policy_kind"] or "unknown",
        version=row["policy_version"],
        model=row["policy_model"],
        sampling=row["sampling"],
    )
    started_at = row["started_at"]
    return Trajectory(
        episode_id=row["episode_id"],
        group_id=key.group_id(row["task_id"]),
        key=key,
        task_id=row["task_id"],
        task_version=row["task_version"],
        instruction=row["instruction"] or "",
        snapshot_digest=row["snapshot_digest"],
        sandbox_backend=row["sandbox_backend"],
        policy_version=row["policy_version"],
        status=EpisodeStatus(row["status"]),
        steps=tuple(_step(step, identity) for step in sorted(step_rows, key=lambda s: s["step"])),
        terminated=bool(row["terminated"]),
        truncated=bool(row["truncated"]),
        reward=row["reward"],
        partial_credit=row["partial_credit"],
        passed=row["passed"],
        fixed_fraction=row["fixed_fraction"],
        flags=tuple(row["flags"] or ()),
        rewards=dict(row["rewards"]) if row.get("rewards") else None,
        error=row["error"],
        wall_s=row["wall_s"] or 0.0,
        sandbox_s=row["sandbox_s"] or 0.0,
        policy_s=row["policy_s"] or 0.0,
        verify_s=row["verify_s"] or 0.0,
        started_at_s=started_at.timestamp() if started_at is not None else 0.0,
        policy=identity,
        task_family=row["task_family"],
    )


def _step(row: Mapping[str, Any], identity: PolicyIdentity) -> Step:
    text = row["observation"] or ""
    observation = Observation(
        text,
        row["exit_code"],
        truncated=(row["observation_chars"] or 0) > len(text),
    )
    logprobs = tuple(row["logprobs"] or ())
    record: ChatRecord | None = None
    logprob: float | None = None
    if row["prompt_token_ids"] or row["token_ids"]:
        # The first row of a language model's turn carries the turn's tokens.
        record = ChatRecord(
            model=identity.model or "",
            prompt_token_ids=tuple(row["prompt_token_ids"] or ()),
            completion_token_ids=tuple(row["token_ids"] or ()),
            completion_logprobs=logprobs,
            finish_reason=row["finish_reason"],
            raw_message=row["reply_message"] or "",
        )
        logprob = sum(logprobs) if logprobs else None
    elif len(logprobs) == 1 and row["reply_message"] is None:
        logprob = logprobs[0]  # the built-in policy's choice
    return Step(
        index=int(row["step"]),
        action=action_from_json(row["action_text"]),
        observation=observation,
        duration_s=row["duration_s"] or 0.0,
        policy_s=0.0,
        logprob=logprob,
        record=record,
        turn=row["turn"],
        call_id=row["tool_call_id"],
        reply_message=row["reply_message"],
    )
