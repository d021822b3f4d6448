"""The live view of a training run, away from a terminal: one plain line per event worth one, on
stderr, with where the UI and dashboard are and the reward so far."""

from __future__ import annotations

import pytest

from flows.live import TrainingView
from training.iteration import IterationSummary


def test_away_from_a_terminal_the_view_prints_plain_lines(
    capsys: pytest.CaptureFixture[str],
) -> None:
    view = TrainingView(iterations=2, episodes_total=8, title="rollyard demo run-0")
    assert not view.live  # pytest captures stderr: not a terminal
    with view:
        view.hook("prefect_ui", {"url": "http://127.0.0.1:4200"})
        view.hook("dask_dashboard", {"url": "http://127.0.0.1:8787/status"})
        view.hook("iteration_start", {"iteration": 0, "episodes": 4})
        view.hook(
            "shard_done",
            {"iteration": 0, "episodes": 2, "rewards": [1.0, None], "queued_shards": 1},
        )
        view.hook(
            "shard_done",
            {"iteration": 0, "episodes": 2, "rewards": [0.0, 0.5], "queued_shards": 0},
        )
        summary = IterationSummary(
            iteration=0,
            episodes=4,
            reward_mean=0.5,
            pass_rate=0.33,
            infra_errors=1,
            policy_version="v1",
            quarantined=False,
            wall_s=12.0,
        )
        view.hook("iteration_done", {"summary": summary})
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = [line.split("] ", 1)[1] for line in captured.err.splitlines()]
    assert lines == [
        "Prefect UI: http://127.0.0.1:4200",
        "Dask dashboard: http://127.0.0.1:8787/status",
        "iteration 0: rolling out 4 episodes",
        "iteration 0: 2/8 episodes done, mean reward so far 1.000",
        "iteration 0: 4/8 episodes done, mean reward so far 0.500",
        "iteration 0 done: mean reward 0.500, pass rate 0.33, passed its gate, 12 s",
    ]
    assert view.state.phase == "iteration 0 done" and view.state.means == [(0, 0.5, False)]
