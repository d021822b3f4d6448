"""The live view of a training run on stderr (`rollyard train`, `rollyard demo`): where the Prefect UI
and the Dask dashboard are, the iteration, episodes done of the total and the reward so far,
redrawn in place at a terminal (rich Live) and as plain lines otherwise (pipes, CI, logs)."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live
from rich.table import Table
from rich.text import Text


@dataclass(slots=True)
class RunState:
    """What the view shows, updated from the flow's progress events (`flows.progress.report_progress`)."""

    iterations: int
    episodes_total: int
    started_s: float = field(default_factory=time.monotonic)
    phase: str = "starting"
    iteration: int | None = None
    episodes_done: int = 0
    rewards: list[float] = field(default_factory=list)
    iteration_rewards: list[float] = field(default_factory=list)
    """Rewards of the episodes of the iteration being rolled out."""
    means: list[tuple[int, float, bool]] = field(default_factory=list)
    """(iteration, mean reward, quarantined) of each finished iteration."""
    prefect_ui: str | None = None
    flow_run: str | None = None
    dask_dashboard: str | None = None

    @property
    def elapsed_s(self) -> float:
        return time.monotonic() - self.started_s


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class TrainingView:
    """Feed it the flow's progress events (`hook`); at a terminal it redraws a panel in place,
    elsewhere it prints one line per event worth a line."""

    def __init__(self, *, iterations: int, episodes_total: int, title: str) -> None:
        self.state = RunState(iterations=iterations, episodes_total=episodes_total)
        self.title = title
        self._console = Console(file=sys.stderr)
        self.live = self._console.is_terminal
        self._display = (
            Live(self._render(), console=self._console, refresh_per_second=2, transient=False)
            if self.live
            else None
        )

    def __enter__(self) -> TrainingView:
        if self._display is not None:
            self._display.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._display is not None:
            self._display.update(self._render())
            self._display.stop()

    def hook(self, event: str, values: dict[str, Any]) -> None:
        """The progress hook of `flows.progress.set_progress_hook`."""
        state = self.state
        line: str | None = None
        if event == "prefect_ui":
            state.prefect_ui = values["url"]
            state.phase = "starting the flow run"
            line = f"Prefect UI: {state.prefect_ui}"
        elif event == "dask_dashboard":
            state.dask_dashboard = values["url"]
            line = f"Dask dashboard: {state.dask_dashboard}"
        elif event == "flow_run" and state.prefect_ui is not None:
            # the page Prefect's own "View at" log line links
            state.flow_run = f"{state.prefect_ui}/runs/flow-run/{values['id']}"
            line = f"this run in the Prefect UI: {state.flow_run}"
        elif event == "iteration_start":
            if state.iteration is None or values["iteration"] > state.iteration:
                state.iteration = values["iteration"]
                state.iteration_rewards = []
            state.phase = f"rolling out iteration {values['iteration']}"
            line = f"iteration {values['iteration']}: rolling out {values['episodes']} episodes"
        elif event == "shard_done":
            rewards = [r for r in values["rewards"] if r is not None]
            state.episodes_done += values["episodes"]
            state.rewards += rewards
            if values["iteration"] == state.iteration:
                state.iteration_rewards += rewards
            line = (
                f"iteration {values['iteration']}: {state.episodes_done}/{state.episodes_total} "
                f"episodes done, mean reward so far {_mean(state.rewards) or 0.0:.3f}"
            )
            if values.get("queued_shards") == 0:
                state.phase = f"gate and policy update of iteration {values['iteration']}"
        elif event == "iteration_done":
            summary = values["summary"]
            state.means.append((summary.iteration, summary.reward_mean, summary.quarantined))
            gate = "quarantined by its gate" if summary.quarantined else "passed its gate"
            state.phase = f"iteration {summary.iteration} done"
            line = (
                f"iteration {summary.iteration} done: mean reward {summary.reward_mean:.3f}, "
                f"pass rate {summary.pass_rate:.2f}, {gate}, {summary.wall_s:.0f} s"
            )
        if self._display is not None:
            self._display.update(self._render())
        elif line is not None:
            print(f"rollyard: [{state.elapsed_s:5.0f} s] {line}", file=sys.stderr, flush=True)

    def _render(self) -> RenderableType:
        state = self.state
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        minutes, seconds = divmod(int(state.elapsed_s), 60)
        grid.add_row(self.title, Text(f"{state.phase} · {minutes}:{seconds:02d}", style="dim"))
        grid.add_row("Prefect UI", state.flow_run or state.prefect_ui or "starting ...")
        grid.add_row("Dask dashboard", state.dask_dashboard or "starting ...")
        current = "-" if state.iteration is None else str(state.iteration)
        grid.add_row("iteration", f"{current} of 0..{state.iterations - 1}")
        grid.add_row("episodes", _bar(state.episodes_done, state.episodes_total))
        overall, this = _mean(state.rewards), _mean(state.iteration_rewards)
        grid.add_row(
            "reward so far",
            "no episode finished yet"
            if overall is None
            else f"mean {overall:.3f} over {len(state.rewards)} episodes"
            + ("" if this is None else f"; this iteration {this:.3f}"),
        )
        if state.means:
            grid.add_row(
                "per iteration",
                "  ".join(f"{i}: {m:.2f}{'q' if q else ''}" for i, m, q in state.means[-8:]),
            )
        return grid


def _bar(done: int, total: int, width: int = 30) -> str:
    filled = min(width, round(width * done / total)) if total else 0
    return f"{'█' * filled}{'░' * (width - filled)} {done}/{total}"
