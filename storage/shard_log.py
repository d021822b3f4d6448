"""What the steps and episodes logs say about shard commits, read from the log without scanning
data: steps files no reader sees, and shards pending between their two commits (`storage.commits`).
"""

from __future__ import annotations

import json
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from deltalake import DeltaTable

from storage.delta_tables import transaction_id


def orphan_step_files(steps: DeltaTable, episodes: DeltaTable | None) -> set[str]:
    """Paths of steps files whose shard commit never reached the episodes table: no reader sees
    them."""
    step_actions = pa.table(steps.get_add_actions(flatten=True))
    if step_actions.num_rows == 0 or "min.commit_id" not in step_actions.column_names:
        return set()
    committed: set[tuple[Any, ...]] = set()
    if episodes is not None:
        episode_actions = pa.table(episodes.get_add_actions(flatten=True))
        if episode_actions.num_rows and "min.commit_id" in episode_actions.column_names:
            committed = set(
                zip(
                    episode_actions["partition.run_id"].to_pylist(),
                    episode_actions["partition.iteration"].to_pylist(),
                    episode_actions["min.commit_id"].to_pylist(),
                    strict=True,
                )
            )
    hidden: set[str] = set()
    for path, run_id, iteration, low, high in zip(
        step_actions["path"].to_pylist(),
        step_actions["partition.run_id"].to_pylist(),
        step_actions["partition.iteration"].to_pylist(),
        step_actions["min.commit_id"].to_pylist(),
        step_actions["max.commit_id"].to_pylist(),
        strict=True,
    ):
        # A file mixing commits (rewritten by compaction) only ever holds committed rows.
        if low == high and (run_id, iteration, low) not in committed:
            hidden.add(path)
    return hidden


@dataclass(frozen=True, slots=True)
class PendingShard:
    """A shard whose steps are committed and whose episodes are not (its writer was killed
    between the two commits, or is between them now)."""

    run_id: str
    iteration: int
    shard: int
    commit_id: str

    @property
    def app_id(self) -> str:
        """The shard's application transaction id."""
        return transaction_id("shard", self.run_id, self.iteration, self.shard)


def pending_shards(
    steps: DeltaTable, episodes: DeltaTable | None, *, app_ids: Collection[str] | None = None
) -> list[PendingShard]:
    """The shards whose steps the steps table holds under the shard's transaction id (its owner's
    commit) with no committed episodes, from the log without scanning data; with `app_ids`, only
    those shards, also finding ones whose owner committed no steps file (from the log's commit
    information, a slower read only a replay of such a shard needs)."""
    found: dict[str, PendingShard] = {}
    hidden = orphan_step_files(steps, episodes)
    if hidden:
        actions = pa.table(steps.get_add_actions(flatten=True))
        for path, run_id, iteration, shard, high_shard, commit_id in zip(
            actions["path"].to_pylist(),
            actions["partition.run_id"].to_pylist(),
            actions["partition.iteration"].to_pylist(),
            actions["min.shard"].to_pylist(),
            actions["max.shard"].to_pylist(),
            actions["min.commit_id"].to_pylist(),
            strict=True,
        ):
            if path not in hidden or shard != high_shard:
                continue
            pending = PendingShard(str(run_id), int(iteration), int(shard), str(commit_id))
            if app_ids is not None and pending.app_id not in app_ids:
                continue
            # Steps committed without the transaction id are a lost commit of an older store
            # layout, never completed (`vacuum` removes them).
            if steps.transaction_version(pending.app_id) is not None:
                found.setdefault(pending.app_id, pending)
    # Shards whose episodes are in are not pending (a winner that finished): only the rest are
    # looked for in the commit information.
    missing = {
        app_id
        for app_id in app_ids or ()
        if app_id not in found
        and (episodes is None or episodes.transaction_version(app_id) is None)
    }
    if missing:
        found.update(_pending_without_steps(steps, episodes, missing))
    return list(found.values())


def _pending_without_steps(
    steps: DeltaTable, episodes: DeltaTable | None, app_ids: set[str]
) -> dict[str, PendingShard]:
    """Pending shards among `app_ids` found from the steps log's commit information (the shard's
    commit id is recorded there even when the shard has no steps file)."""
    found: dict[str, PendingShard] = {}
    for commit in steps.history():
        shards = json.loads(commit.get("rollyard.shards", "[]"))
        commit_ids = json.loads(commit.get("rollyard.commit_ids", "[]"))
        for app_id, commit_id in zip(shards, commit_ids, strict=False):
            if app_id not in app_ids or app_id in found:
                continue
            _, run_id, iteration, shard = json.loads(app_id.removeprefix("rollyard:"))
            found[app_id] = PendingShard(run_id, int(iteration), int(shard), commit_id)
        if len(found) == len(app_ids):
            break
    return found
