"""Prefect artifacts that show a run's progress in the Prefect UI: the reward curve so far (a
markdown artifact with the plot inlined) and the iteration's row of the curve. Call from inside
a flow run, e.g. after each iteration of the train flow:

    publish_iteration_artifacts(store, settings.run_id, iteration)
"""

from __future__ import annotations

import base64
import re
from typing import cast
from uuid import UUID

from prefect.artifacts import create_markdown_artifact

from storage import TrajectoryStore
from storage.report import reward_curve_png

_FLOAT_COLUMNS = ("mean_reward", "pass_rate", "reward_p10", "reward_p50", "reward_p90")


def artifact_key(*parts: object) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes) from `parts`."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(str(p) for p in parts).lower()).strip("-")


def publish_iteration_artifacts(store: TrajectoryStore, run_id: str, iteration: int) -> UUID:
    """Publish the reward curve of `run_id` up to `iteration` as the keyed markdown artifact
    `reward-curve-<run_id>` (each call adds a version); returns the artifact id."""
    rows = [
        r
        for r in store.named("reward_curve").to_pylist()
        if r["run_id"] == run_id and r["iteration"] <= iteration
    ]
    png = base64.b64encode(reward_curve_png(rows, title=f"run {run_id}")).decode("ascii")
    header = "| iteration | episodes | " + " | ".join(_FLOAT_COLUMNS) + " |"
    lines = [header, "|" + "---|" * (2 + len(_FLOAT_COLUMNS))]
    for r in rows:
        values = " | ".join("" if r[c] is None else f"{float(r[c]):.3f}" for c in _FLOAT_COLUMNS)
        lines.append(f"| {r['iteration']} | {r['episodes']} | {values} |")
    markdown = "\n".join(
        [
            f"### Reward curve of run `{run_id}` after iteration {iteration}",
            "",
            f"![reward curve](data:image/png;base64,{png})",
            "",
            *lines,
        ]
    )
    artifact_id = create_markdown_artifact(
        key=artifact_key("reward-curve", run_id),
        markdown=markdown,
        description=f"Reward curve of run {run_id} after iteration {iteration}",
    )
    return cast(UUID, artifact_id)  # sync call: Prefect's async-or-sync signature says both
