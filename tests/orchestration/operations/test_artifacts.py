"""The reward-curve artifact: published from inside a flow run, readable through the API."""

from __future__ import annotations

import asyncio
from pathlib import Path

from prefect import flow

from flows.artifacts import artifact_key, publish_iteration_artifacts
from storage import TrajectoryStore


def test_reward_curve_artifact_is_published(small_store: Path, prefect_server: str) -> None:
    @flow(name="publish-artifacts")
    def publish() -> None:
        publish_iteration_artifacts(TrajectoryStore(str(small_store)), "ops", 1)

    publish()

    async def latest() -> str:
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

        async with get_client() as client:
            found = await client.read_latest_artifacts(
                artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["reward-curve-ops"]))
            )
        return str(found[0].data)

    markdown = asyncio.run(latest())
    assert "data:image/png;base64," in markdown
    assert "| 0 | 4 |" in markdown and "| 1 | 4 |" in markdown
    assert artifact_key("Reward curve", "Run_1") == "reward-curve-run-1"
