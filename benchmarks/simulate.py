"""A discrete-event model (simpy) of the training loop at scale: how busy the trainer and the
sandboxes are, and how many commits a second the store must take, for sync, async and streaming.

    python benchmarks/simulate.py calibrate --store STORE --run-id RUN   # model vs a real run
    python benchmarks/simulate.py export --store STORE --out FILE        # measured figures
    python benchmarks/simulate.py sweep [--store STORE | --figures FILE]  # 100 to 10,000 sandboxes

What is modelled, per episode and per shard (each cost a parameter of `Costs`):
- a shard is one Dask task: the scheduler spends `scheduler_s_per_task` on it (serially), the
  Prefect task around it costs `task_overhead_s` on the worker, then the shard's episodes run one
  after another on one sandbox slot (as `training.rollout.run_shard` does), each paying
  `sandbox_open_s` when the slot holds no warm sandbox of the episode's task, else
  `sandbox_reset_s`, then its measured wall (agent steps plus `verify_s`, scaled by
  `verify_scale`);
- the shard commits: `commit_write_s` of file writes on the worker, then a Delta log commit of
  `commit_log_s` that one writer does at a time; `commit_group` shards queued at once share one
  log commit (the store's group commit);
- the trainer: `gate_s` (+ per episode), the update (`update_fixed_s` + `gpu_s_per_episode`
  x batch / GPUs), then `finish_s` (checkpoint, completion marker, compaction).

Modes: `sync` (roll out an iteration, then update), `async` (the next `staleness` iterations
roll out while the trainer updates: the train flow's async mode), `streaming` (groups flow into
a buffer as their shards commit and the trainer takes a batch as soon as one is full; a group
whose policy is more than `staleness` updates behind when it is taken is dropped and counted).

Episode durations come from a store's episodes table (DuckDB over the Delta tables) with
`--store`, else from `benchmarks/simulate_figures.json` (measured on this machine and
committed; `export` writes it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from simulate_calibrate import calibrate
from simulate_model import (
    MODES,
    Costs,
    SimConfig,
    SimResult,
    Workload,
    load_figures,
    simulate,
    workload_from_store,
)

HERE = Path(__file__).resolve().parent
FIGURES_FILE = HERE / "simulate_figures.json"
PLOTS_DIR = HERE / "figures"


# -- the sweep -----------------------------------------------------------------------------------

SANDBOX_COUNTS = (100, 1_000, 10_000)
GPU_COUNTS = (1, 4, 16, 64)
EPISODES_PER_SANDBOX = 4
"""Batch size at scale: each sandbox runs about this many episodes per batch."""
GROUP_SIZE_AT_SCALE = 8
UPDATE_RATIO = 0.02
"""GPU-seconds to train on one episode per second of its rollout: a stand-in, not a
measurement (a 7B-32B model trains on an agent episode's tokens in roughly 1-7% of the time
the episode took to roll out); the sweep's 1-64 GPUs then span trainer-bound to rollout-bound."""


def scale_config(
    sandboxes: int, mode: str, gpus: int, workload: Workload, **changes: Any
) -> SimConfig:
    config = SimConfig(
        sandboxes=sandboxes,
        mode=mode,
        batch_groups=sandboxes * EPISODES_PER_SANDBOX // GROUP_SIZE_AT_SCALE,
        group_size=GROUP_SIZE_AT_SCALE,
        shard_episodes=EPISODES_PER_SANDBOX,
        batches=6 if sandboxes < 10_000 else 4,
        staleness=1 if mode == "async" else 2,
        commit_group=16,
        gpus=gpus,
        gpu_s_per_episode=UPDATE_RATIO * workload.mean_episode_s(),
        schedule="round_robin",
    )
    return dataclasses.replace(config, **changes)


def result_row(result: SimResult) -> dict[str, Any]:
    c = result.config
    return {
        "sandboxes": c.sandboxes,
        "mode": c.mode,
        "gpus": c.gpus,
        "shard_episodes": c.shard_episodes,
        "commit_group": c.commit_group,
        "staleness": c.staleness,
        "schedule": c.schedule,
        "wall_s": round(result.wall_s, 1),
        "trainer_idle": round(result.trainer_idle, 4),
        "sandbox_utilization": round(result.sandbox_utilization, 4),
        "trained_per_s": round(result.trained_per_s, 2),
        "shard_commits_per_s": round(result.shard_commits_per_s, 1),
        "log_commits_per_s": round(result.log_commits_per_s, 1),
        "groups_dropped": result.groups_dropped,
        "dropped_share": round(
            result.groups_dropped
            / max(1, result.groups_dropped + result.episodes_trained // c.group_size),
            4,
        ),
        "max_staleness": result.max_staleness,
    }


AXES: dict[str, tuple[int, str, int, Sequence[int], dict[str, Any]]] = {
    # name (the field varied): (sandboxes, mode, gpus, values, other changes)
    # Rollout-bound (256 GPUs) with one episode a shard: the most commits a second.
    "commit_group": (10_000, "streaming", 256, (1, 4, 16, 64), {"shard_episodes": 1, "batches": 2}),
    "shard_episodes": (1_000, "sync", 16, (1, 2, 4, 8, 16), {}),
    "staleness": (1_000, "streaming", 16, (0, 1, 2, 4), {}),
}


def sweep(
    workload: Workload,
    costs: Costs,
    *,
    grid: list[dict[str, Any]] | None = None,
    axes: Sequence[str] = tuple(AXES),
) -> dict[str, list[dict[str, Any]]]:
    """The main grid (or `grid`, rows of an earlier sweep's output), then one axis at a time
    around a middle point, for the defaults."""
    tables: dict[str, list[dict[str, Any]]] = {"grid": list(grid or [])}
    if grid is None:
        for sandboxes in SANDBOX_COUNTS:
            for gpus in GPU_COUNTS:
                for mode in MODES:
                    config = scale_config(sandboxes, mode, gpus, workload)
                    tables["grid"].append(result_row(simulate(config, workload, costs)))
                    print(json.dumps(tables["grid"][-1]), flush=True)
    for name in axes:
        sandboxes, mode, gpus, values, fixed = AXES[name]
        tables[name] = []
        for value in values:
            config = scale_config(sandboxes, mode, gpus, workload, **{**fixed, name: value})
            tables[name].append(result_row(simulate(config, workload, costs)))
            print(json.dumps(tables[name][-1]), flush=True)
    return tables


def plot(
    tables: dict[str, list[dict[str, Any]]], out_dir: Path, title: str, name: str
) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    grid = tables["grid"]
    written = []
    metrics = (
        ("trainer_idle", "trainer idle (share of time)"),
        ("sandbox_utilization", "sandbox utilization"),
        ("trained_per_s", "trained episodes / s"),
    )
    fig, axes = plt.subplots(len(metrics), len(SANDBOX_COUNTS), figsize=(13, 10), squeeze=False)
    for column, sandboxes in enumerate(SANDBOX_COUNTS):
        for row, (metric, label) in enumerate(metrics):
            axis = axes[row][column]
            for mode in MODES:
                points = [r for r in grid if r["sandboxes"] == sandboxes and r["mode"] == mode]
                axis.plot([r["gpus"] for r in points], [r[metric] for r in points],
                          marker="o", label=mode)  # fmt: skip
            axis.set_xscale("log", base=2)
            axis.set_xlabel("trainer GPUs")
            axis.set_ylabel(label)
            if metric == "trained_per_s":
                axis.set_yscale("log")
            axis.set_title(f"{sandboxes:,} sandboxes")
            axis.grid(alpha=0.3)
    axes[0][0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path = out_dir / f"{name}_grid.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)

    fig, axes = plt.subplots(1, 3, figsize=(14, 4), squeeze=False)
    for axis, (axis_name, field, label) in zip(
        axes[0],
        (
            ("commit_group", "commit_group", "shards per Delta log commit"),
            ("shard_episodes", "shard_episodes", "episodes per shard"),
            ("staleness", "staleness", "staleness bound (updates)"),
        ),
        strict=True,
    ):
        if axis_name not in tables:
            axis.set_visible(False)
            continue
        rows = tables[axis_name]
        xs = [r[field] for r in rows]
        axis.plot(xs, [r["sandbox_utilization"] for r in rows], marker="o", label="sandbox util.")
        axis.plot(xs, [1 - r["trainer_idle"] for r in rows], marker="s", label="trainer busy")
        if axis_name == "staleness":
            axis.plot(xs, [r["dropped_share"] for r in rows], marker="x", label="groups dropped")
        first = rows[0]
        axis.set_title(f"{axis_name}: {first['sandboxes']:,} sandboxes, {first['mode']}, "
                       f"{first['gpus']} GPUs", fontsize=9)  # fmt: skip
        axis.set_xlabel(label)
        axis.set_ylim(0, 1.05)
        axis.grid(alpha=0.3)
        axis.legend(fontsize=8)
    fig.tight_layout()
    path = out_dir / f"{name}_defaults.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    written.append(path)
    return written


def plot_calibration(reports: dict[str, dict[str, Any]], path: Path) -> Path:
    """Measured against simulated iteration wall, one pair of bars per calibration run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axis = plt.subplots(figsize=(6, 4))
    names = list(reports)
    xs = range(len(names))
    measured = [reports[n]["measured_iteration_wall_s"] for n in names]
    simulated = [reports[n]["simulated_iteration_wall_s"] for n in names]
    low = [s - reports[n]["simulated_p10_p90_s"][0] for n, s in zip(names, simulated, strict=True)]
    high = [reports[n]["simulated_p10_p90_s"][1] - s for n, s in zip(names, simulated, strict=True)]
    axis.bar([x - 0.2 for x in xs], measured, width=0.4, label="measured (mean)")
    axis.bar([x + 0.2 for x in xs], simulated, width=0.4, yerr=[low, high], capsize=4,
             label="simulated (mean, p10-p90)")  # fmt: skip
    for x, name in zip(xs, names, strict=True):
        axis.annotate(f"{100 * reports[name]['error']:+.1f}%", (x + 0.2, simulated[x]),
                      ha="center", va="bottom", fontsize=9)  # fmt: skip
    axis.set_xticks(list(xs), names)
    axis.set_ylabel("iteration wall (s)")
    axis.set_title("calibration: real train flow vs model, same configuration")
    axis.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def markdown_table(rows: list[dict[str, Any]], columns: Sequence[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---:|" * len(columns)]
    for row in rows:
        cells = []
        for column in columns:
            value = row[column]
            if column in ("trainer_idle", "sandbox_utilization", "dropped_share"):
                cells.append(f"{100 * value:.1f}%")
            elif isinstance(value, float):
                cells.append(f"{value:,.1f}")
            else:
                cells.append(f"{value:,}" if isinstance(value, int) else str(value))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# -- command line --------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    cal = commands.add_parser("calibrate", help="simulate a real run's configuration, compare")
    cal.add_argument("--store", required=True)
    cal.add_argument("--run-id", required=True)
    cal.add_argument("--seeds", type=int, default=200)
    cal.add_argument("--schedule", choices=("round_robin", "longest_first"), default="round_robin")
    cal.add_argument("--json", type=Path, help="also write the comparison here")
    export = commands.add_parser("export", help="write a run's figures for later simulations")
    export.add_argument("--store", required=True)
    export.add_argument("--run-id", required=True)
    export.add_argument("--out", type=Path, default=FIGURES_FILE)
    export.add_argument(
        "--skip-iterations", type=int, default=1, help="leave out each run's first iterations"
    )
    export.add_argument(
        "--schedule", choices=("round_robin", "longest_first"), default="round_robin"
    )
    plot_cal = commands.add_parser("plot-calibration", help="bar chart of calibration reports")
    plot_cal.add_argument("reports", nargs="+", type=Path, help="NAME=FILE.json from calibrate")
    plot_cal.add_argument("--out", type=Path, default=PLOTS_DIR / "calibration.png")
    run = commands.add_parser("sweep", help="100 to 10,000 sandboxes, 1-64 GPUs, three modes")
    source = run.add_mutually_exclusive_group()
    source.add_argument("--store", help="take episode durations from this store")
    source.add_argument("--figures", type=Path, default=FIGURES_FILE)
    run.add_argument("--run-id", help="with --store: only this run's episodes")
    run.add_argument(
        "--skip-iterations", type=int, default=1, help="with --store: leave out each run's first"
    )
    run.add_argument("--out", type=Path, default=PLOTS_DIR)
    run.add_argument("--name", default="simulate", help="prefix of the written files")
    run.add_argument(
        "--grid-from", type=Path, help="reuse the grid rows a sweep printed (its output, saved)"
    )
    run.add_argument("--axes", nargs="*", choices=tuple(AXES), default=list(AXES))
    args = parser.parse_args(argv)

    if args.command == "calibrate":
        report = calibrate(args.store, args.run_id, seeds=args.seeds, schedule=args.schedule)
        text = json.dumps(report, indent=2)
        print(text)
        if args.json:
            args.json.write_text(text + "\n")
        return 0
    if args.command == "export":
        report = calibrate(args.store, args.run_id, seeds=200, schedule=args.schedule)
        workload = workload_from_store(
            args.store, args.run_id, skip_iterations=args.skip_iterations
        )
        figures = {
            "measured": {k: v for k, v in report.items() if k != "costs"},
            "costs": report["costs"],
            "episodes": {
                task: [[round(a, 3), round(v, 3)] for a, v in pairs]
                for task, pairs in sorted(workload.episodes_by_task.items())
            },
        }
        args.out.write_text(json.dumps(figures, indent=1) + "\n")
        print(f"wrote {args.out}: {sum(map(len, workload.episodes_by_task.values()))} episodes "
              f"of {len(workload.tasks)} tasks, calibration error {100 * report['error']:+.1f}%")  # fmt: skip
        return 0
    if args.command == "plot-calibration":
        reports = {}
        for item in args.reports:
            name, _, file = str(item).partition("=")
            if not file:
                raise SystemExit(f"error: give each report as NAME=FILE.json, got {item}")
            reports[name] = json.loads(Path(file).read_text())
        print(plot_calibration(reports, args.out))
        return 0
    # Durations from a run; the fixed costs at scale are the defaults, measured on a lightly
    # loaded machine (a calibration's costs carry the load of its 2-core machine).
    if args.store:
        workload = workload_from_store(
            args.store, args.run_id, skip_iterations=args.skip_iterations
        )
    else:
        workload, _, _ = load_figures(args.figures)
    costs = Costs()
    print(f"workload: {len(workload.tasks)} tasks, mean episode {workload.mean_episode_s():.1f} s, "
          f"spread of task medians {workload.spread():.1f}x", flush=True)  # fmt: skip
    grid = None
    if args.grid_from:
        rows = [json.loads(line) for line in args.grid_from.read_text().splitlines()
                if line.startswith('{"sandboxes"')]  # fmt: skip
        grid = rows[: len(SANDBOX_COUNTS) * len(GPU_COUNTS) * len(MODES)]
    tables = sweep(workload, costs, grid=grid, axes=args.axes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(tables, indent=1) + "\n")
    plot(tables, args.out, f"{len(workload.tasks)} tasks, mean episode "
         f"{workload.mean_episode_s():.1f} s, spread {workload.spread():.1f}x", args.name)  # fmt: skip
    columns = ("sandboxes", "gpus", "mode", "trainer_idle", "sandbox_utilization",
               "trained_per_s", "shard_commits_per_s", "log_commits_per_s", "dropped_share")  # fmt: skip
    print(markdown_table(tables["grid"], columns))
    for name in args.axes:
        print(f"\n{name}\n" + markdown_table(tables[name], (name, *columns)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
