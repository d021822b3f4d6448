"""The Python API without Prefect or Dask: train in-process (and resume), evaluate a checkpoint
on held-out tasks exactly once, query the result."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from storage import TrajectoryStore
from training.evaluation import checkpoints_to_evaluate, evaluate_checkpoint
from training.iteration import ITERATION_DONE_SOURCE
from training.local import train_locally


def test_train_locally_runs_resumes_and_evaluates(demo_tasks: Path, tmp_path: Path) -> None:
    store = TrajectoryStore(tmp_path / "store")
    # one episode per iteration: this test is about the API's bookkeeping, not learning
    tiny = dict(run_id="nb", tasks_per_iteration=1, group_size=1, max_steps=2)
    seen: list[int] = []
    first = train_locally(
        demo_tasks, store, iterations=1, on_iteration=lambda it: seen.append(it.iteration), **tiny
    )
    assert [it.iteration for it in first] == seen == [0]
    assert first[0].episodes == 1
    with pytest.raises(ValueError, match="resume it"):
        train_locally(demo_tasks, store, iterations=2, **tiny)
    second = train_locally(demo_tasks, store, iterations=2, resume=True, **tiny)
    assert [it.iteration for it in second] == [1]

    curve = store.named("reward_curve").to_pylist()
    assert [(r["run_id"], r["iteration"], r["episodes"]) for r in curve] == [
        ("nb", 0, 1),
        ("nb", 1, 1),
    ]
    done = store.query(
        "SELECT DISTINCT iteration FROM metrics WHERE source = ? ORDER BY 1",
        [ITERATION_DONE_SOURCE],
    ).to_pylist()
    assert [r["iteration"] for r in done] == [0, 1]

    held_out = tmp_path / "held-out"
    task = sorted(p for p in demo_tasks.iterdir() if (p / "task.toml").is_file())[0]
    shutil.copytree(task, held_out / task.name)
    [checkpoint] = checkpoints_to_evaluate(store, run_id="nb")
    result = evaluate_checkpoint(
        store, checkpoint, [held_out / task.name], samples_per_task=1, max_steps=2
    )
    assert result.recorded and result.episodes == 1 and result.infra_errors == 0
    assert checkpoints_to_evaluate(store, run_id="nb") == []  # evaluated once
    rows = store.query(
        "SELECT count(*) AS n FROM metrics WHERE source = 'evaluation' AND name = 'eval_episodes'"
    ).to_pylist()
    assert rows == [{"n": 1}]
