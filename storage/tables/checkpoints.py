"""The checkpoints table: policy weights stored as content-addressed blobs beside the tables,
with one metadata row per (run_id, policy_version)."""

from __future__ import annotations

import hashlib
import io
import json
import os
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.fs as pafs

from storage.commits import CommitEngine, first_line, now
from storage.delta_tables import transaction_id
from storage.errors import CheckpointNotFoundError, CorruptFileError
from storage.readers import SnapshotReader
from storage.records import conform
from storage.schemas import CHECKPOINTS

_CHECKPOINT_BLOBS = "checkpoint_blobs"


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """The metadata row of a stored checkpoint."""

    run_id: str
    policy_version: str
    parent_policy_version: str | None
    iteration: int
    trained_on_iterations: tuple[int, ...]
    n_episodes: int
    blob_path: str
    sha256: str
    size_bytes: int
    metadata: Mapping[str, Any]
    created_at: datetime


class CheckpointsTable:
    """Saves, lists and loads torch state dicts stored under the store root."""

    def __init__(self, engine: CommitEngine, reader: SnapshotReader) -> None:
        self._engine = engine
        self._reader = reader

    def save(
        self,
        run_id: str,
        policy_version: str,
        state_dict: Mapping[str, Any],
        *,
        iteration: int,
        trained_on_iterations: Sequence[int] = (),
        n_episodes: int = 0,
        parent_policy_version: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointInfo:
        """Store a torch state dict for (run_id, policy_version), once; returns its metadata.

        The weights go to a content-addressed blob, so a replay or a crash before the metadata
        commit leaves at most an unreferenced blob. Saving a version that exists returns the
        existing record unchanged.
        """
        import torch  # torch is heavy; only checkpoint users pay for it

        existing = self._find(run_id, policy_version)
        if existing is not None:
            return existing
        buffer = io.BytesIO()
        torch.save(dict(state_dict), buffer)
        payload = buffer.getvalue()
        digest = hashlib.sha256(payload).hexdigest()
        blob_path = f"{_CHECKPOINT_BLOBS}/{digest[:2]}/{digest}.pt"
        self._put_blob(blob_path, payload)
        row = {
            "run_id": run_id,
            "policy_version": policy_version,
            "parent_policy_version": parent_policy_version,
            "iteration": iteration,
            "trained_on_iterations": list(trained_on_iterations),
            "n_episodes": n_episodes,
            "blob_path": blob_path,
            "sha256": digest,
            "size_bytes": len(payload),
            "metadata": json.dumps(dict(metadata or {}), sort_keys=True),
            "created_at": now(),
        }
        data = conform(CHECKPOINTS, [row], key={}, source=f"checkpoint {run_id}/{policy_version}")
        self._engine.append_once(
            CHECKPOINTS, data, app_id=transaction_id("checkpoint", run_id, policy_version)
        )
        found = self._find(run_id, policy_version)
        assert found is not None
        return found

    def load(
        self, run_id: str, policy_version: str, *, map_location: str = "cpu"
    ) -> tuple[dict[str, Any], CheckpointInfo]:
        """Load the state dict stored for (run_id, policy_version), checking its digest."""
        import torch

        info = self._find(run_id, policy_version)
        if info is None:
            known = ", ".join(c.policy_version for c in self.recorded(run_id)) or "none"
            raise CheckpointNotFoundError(
                f"no checkpoint for run {run_id!r} policy version {policy_version!r} in "
                f"{self._engine.root}; versions stored for this run: {known}"
            )
        payload = self._get_blob(info.blob_path)
        if hashlib.sha256(payload).hexdigest() != info.sha256:
            raise CorruptFileError(
                f"{self._engine.root}/{info.blob_path}: checkpoint bytes do not match their "
                f"recorded sha256 {info.sha256}; restore the file or save the checkpoint again"
            )
        state = torch.load(io.BytesIO(payload), map_location=map_location, weights_only=True)
        return dict(state), info

    def recorded(self, run_id: str | None = None) -> list[CheckpointInfo]:
        """Checkpoints recorded in the store (of one run, or of all), oldest first."""
        dataset = self._reader.datasets(("checkpoints",))["checkpoints"]
        condition = None if run_id is None else pads.field("run_id") == run_id
        rows = self._reader.scan(dataset, "checkpoints", condition, None).to_pylist()
        rows.sort(key=lambda row: (row["created_at"], row["policy_version"]))
        return [_checkpoint_info(row) for row in rows]

    def _find(self, run_id: str, policy_version: str) -> CheckpointInfo | None:
        matches = [c for c in self.recorded(run_id) if c.policy_version == policy_version]
        return matches[0] if matches else None

    def _put_blob(self, relative: str, payload: bytes) -> None:
        root = self._engine.root
        if self._engine.remote:
            filesystem, base = pafs.FileSystem.from_uri(root)
            # Object stores make a put atomic: no partial blob is ever visible.
            with filesystem.open_output_stream(f"{base}/{relative}") as stream:
                stream.write(payload)
            return
        target = Path(root, relative)
        target.parent.mkdir(parents=True, exist_ok=True)
        temporary = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
        temporary.write_bytes(payload)
        os.replace(temporary, target)

    def _get_blob(self, relative: str) -> bytes:
        root = self._engine.root
        try:
            if self._engine.remote:
                filesystem, base = pafs.FileSystem.from_uri(root)
                with filesystem.open_input_stream(f"{base}/{relative}") as stream:
                    return bytes(stream.read())
            return Path(root, relative).read_bytes()
        except (OSError, pa.ArrowException) as error:
            raise CorruptFileError(
                f"{root}/{relative}: checkpoint file unreadable ({first_line(error)})"
            ) from error


def _checkpoint_info(row: Mapping[str, Any]) -> CheckpointInfo:
    return CheckpointInfo(
        run_id=row["run_id"],
        policy_version=row["policy_version"],
        parent_policy_version=row["parent_policy_version"],
        iteration=row["iteration"],
        trained_on_iterations=tuple(row["trained_on_iterations"]),
        n_episodes=row["n_episodes"],
        blob_path=row["blob_path"],
        sha256=row["sha256"],
        size_bytes=row["size_bytes"],
        metadata=json.loads(row["metadata"] or "{}"),
        created_at=row["created_at"],
    )
