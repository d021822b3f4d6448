"""What a training iteration is, shared by the Prefect flow (`flows.train`) and in-process
training (`training.local`): where a run stands, which trainer the policy spec chooses (new or
restored from a checkpoint), and how an iteration's committed batch is turned into an update, a
checkpoint and a completion marker.

An iteration is done when its marker — a metrics row with source `train_flow`, written last,
after the checkpoint — is in the store. Resume starts after the last done iteration, from the
newest checkpoint at or before it; either entry point can continue a run the other started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from storage import CommitError, StoreError, TrajectoryStore
from tasks_lib.errors import TaskError, TaskRefusedError
from tasks_lib.format.finder import tasks_in
from tasks_lib.format.loader import load_task
from training.errors import TrainingSettingsError
from training.lm.spec import PolicySpec, check_model_dir, check_policy_spec, parse_policy_spec
from training.policy import ChatRecord
from training.trainer import Trainer, TrainerMetrics
from training.trajectory import Trajectory

if TYPE_CHECKING:
    from training.lm.conversation import ChatSampling
    from training.lm.grpo_config import LMTrainerConfig

LOGGER = logging.getLogger(__name__)
ITERATION_DONE_SOURCE = "train_flow"
"""The `metrics.source` whose row marks an iteration as done."""


@dataclasses.dataclass(frozen=True, slots=True)
class IterationSummary:
    """What one iteration did."""

    iteration: int
    episodes: int
    """Committed episodes of the iteration (quarantined ones included)."""
    reward_mean: float
    pass_rate: float
    infra_errors: int
    policy_version: str
    """The policy after this iteration's update."""
    quarantined: bool
    wall_s: float
    gate_reason: str | None = None
    max_policy_lag: int = 0
    stale_dropped: int = 0


@dataclasses.dataclass(frozen=True, slots=True)
class RefusedTask:
    """A task directory left out of a run: no backend here runs it faithfully."""

    path: Path
    reason: str
    """The first reason, with its fix (`TaskRefusedError`'s issues)."""


def split_refused(task_dirs: Sequence[Path]) -> tuple[list[Path], list[RefusedTask]]:
    """The task directories a run may use, and the refused ones with their reason. Other load
    problems are not decided here: they surface where the task is used, as before."""
    runnable: list[Path] = []
    refused: list[RefusedTask] = []
    for path in task_dirs:
        try:
            load_task(path)
        except TaskRefusedError as error:
            first = error.issues[0] if error.issues else None
            reason = f"{first.field}: {first.message}; {first.fix}" if first else str(error)
            refused.append(RefusedTask(path, reason))
            continue
        except TaskError:
            pass
        runnable.append(path)
    return runnable, refused


def task_dirs_in(tasks_dir: str | Path) -> list[Path]:
    """The task directories (those holding a task.toml) directly under `tasks_dir`, refused ones
    left out (each logged with its reason)."""
    root = Path(tasks_dir)
    dirs = tasks_in(root)
    if not dirs:
        raise TrainingSettingsError(
            f"no task directories (with a task.toml) in {root}; generate some first "
            "(rollyard tasks demo --out DIR)"
        )
    runnable, refused = split_refused(dirs)
    for task in refused:
        LOGGER.warning("refused task %s: %s", task.path.name, task.reason)
    if not runnable:
        raise TrainingSettingsError(
            f"every task in {root} is refused ({refused[0].path.name}: {refused[0].reason}); "
            "run tasks a backend here can run faithfully (rollyard tasks check DIR says why)"
        )
    return runnable


def completed_iterations(store: TrajectoryStore, run_id: str) -> list[int]:
    try:
        rows = store.query(
            "SELECT DISTINCT iteration FROM metrics WHERE run_id = ? AND source = ? ORDER BY 1",
            [run_id, ITERATION_DONE_SOURCE],
        ).to_pylist()
    except StoreError:
        return []  # a new store: nothing done yet
    return [int(row["iteration"]) for row in rows]


def check_training_policy(
    policy: str | PolicySpec, *, trainer_model: str | Path | None = None
) -> PolicySpec:
    """Before a run starts, and before anything is written: the spec parses (exit 2), the
    trainer it chooses (`new_trainer`) has what it needs — an `openai:` policy trains a LoRA
    adapter on a local copy of the served weights, `trainer_model` (exit 2) — and the policy can
    act (`check_policy_spec`: a server that does not answer exits 3, one that does not serve the
    model or call tools exits 2)."""
    spec = parse_policy_spec(policy) if isinstance(policy, str) else policy
    if spec.kind == "openai" and trainer_model is None:
        raise TrainingSettingsError(
            f"training {spec} needs the served model's weights on this machine: give "
            "--trainer-model DIR (the directory the server loaded; the trainer trains a LoRA "
            f"adapter on it), or roll the model out without training: rollyard evaluate "
            f"--policy {spec}"
        )
    if trainer_model is not None:
        check_model_dir(trainer_model)
    check_policy_spec(spec)
    return spec


def new_trainer(
    policy_spec: str | PolicySpec,
    *,
    seed: int,
    weights_dir: str | Path | None = None,
    lm_config: LMTrainerConfig | None = None,
    sampling: ChatSampling | None = None,
    trainer_model: str | Path | None = None,
) -> Trainer:
    """A fresh trainer for the policy a spec names. `weights_dir` is where an LM trainer writes
    each update's weights (an HF directory per version); `trainer_model` is the local copy of
    the weights an `openai:` server serves (trained as LoRA, adapters loaded into the server)."""
    spec = parse_policy_spec(policy_spec) if isinstance(policy_spec, str) else policy_spec
    if spec.kind == "builtin":
        from training.builtin.grpo import GRPOConfig, GRPOTrainer
        from training.builtin.scorer_policy import CandidateScorerPolicy

        return GRPOTrainer(CandidateScorerPolicy(seed=seed), GRPOConfig(seed=seed))
    from training.lm.grpo_config import LMTrainerConfig, LoraSettings
    from training.lm.spec import check_model_dir
    from training.lm.trainer import LMTrainer
    from training.lm.weights import ServedAdapters

    if weights_dir is None:
        raise TrainingSettingsError(f"training {policy_spec} needs a directory for new weights")
    config = lm_config or LMTrainerConfig(seed=seed)
    if spec.kind == "hf":
        assert spec.model_dir is not None
        check_model_dir(spec.model_dir)
        return LMTrainer.from_model_dir(
            spec.model_dir, weights_dir=weights_dir, config=config, sampling=sampling
        )
    assert spec.base_url is not None and spec.model is not None
    if trainer_model is None:
        raise TrainingSettingsError(
            f"training {policy_spec} needs the served model's weights on this machine: give "
            "--trainer-model DIR (the directory the server loaded)"
        )
    check_model_dir(trainer_model)
    if config.lora is None:
        config = dataclasses.replace(config, lora=LoraSettings())
    return LMTrainer.from_model_dir(
        trainer_model,
        weights_dir=weights_dir,
        config=config,
        sampling=sampling,
        served=ServedAdapters(spec.base_url, spec.model),
    )


def load_trainer(
    store: TrajectoryStore,
    run_id: str,
    policy_version: str,
    *,
    seed: int = 0,
    sampling: ChatSampling | None = None,
) -> Trainer:
    """The trainer (and its policy) a checkpoint of either trainer holds."""
    info = next(
        (c for c in store.checkpoints.recorded(run_id) if c.policy_version == policy_version),
        None,
    )
    kind = info.metadata.get("trainer", "builtin") if info is not None else "builtin"
    if kind == "lm":
        from training.lm.trainer import LMTrainer

        return LMTrainer.load_checkpoint(store, run_id, policy_version, sampling=sampling)
    from training.builtin.grpo import load_checkpoint

    return load_checkpoint(store, run_id, policy_version, seed=seed)


_TRAINER_OF_POLICY_KIND = {"builtin": "builtin", "hf": "lm", "openai": "lm"}


def model_weights_dir(store: TrajectoryStore, run_id: str) -> Path:
    """Where a language-model run writes each update's weights (one HF directory per version,
    recorded in the checkpoints table): beside the tables, so workers read them where they
    read the store."""
    if store.commits.remote:
        raise TrainingSettingsError(
            f"store {store.root} is object storage; language-model checkpoints are directories "
            "workers load from a shared filesystem: give a local (or mounted) store root"
        )
    return Path(store.root) / "checkpoint_models" / run_id


def restore_trainer(
    store: TrajectoryStore,
    run_id: str,
    *,
    seed: int,
    resume: bool,
    policy: str | PolicySpec = "builtin",
    lm_config: LMTrainerConfig | None = None,
    sampling: ChatSampling | None = None,
    trainer_model: str | Path | None = None,
) -> tuple[Trainer, int]:
    """The trainer to continue with and the first iteration still to run. The policy spec
    chooses the trainer (`training.trainer.new_trainer`); a resumed run continues with the
    trainer its checkpoints were written by, and must name the same kind of policy."""
    spec = parse_policy_spec(policy) if isinstance(policy, str) else policy
    done = completed_iterations(store, run_id)
    if done and not resume:
        raise TrainingSettingsError(
            f"run {run_id!r} already has {len(done)} completed iteration(s) in {store.root}; "
            "resume it (`--resume`, or `resume=True` from Python) or choose another run id"
        )
    checkpoints = [
        c for c in store.checkpoints.recorded(run_id) if done and c.iteration <= done[-1]
    ]
    if not checkpoints:
        weights_dir = model_weights_dir(store, run_id) if spec.kind != "builtin" else None
        trainer = new_trainer(
            policy,
            seed=seed,
            weights_dir=weights_dir,
            lm_config=lm_config,
            sampling=sampling,
            trainer_model=trainer_model,
        )
        return trainer, 0
    # The newest checkpoint holds the policy after the last done iteration (an iteration that
    # changed nothing stores no new version).
    latest = max(checkpoints, key=lambda c: (c.iteration, c.created_at))
    recorded_kind = latest.metadata.get("trainer", "builtin")
    if _TRAINER_OF_POLICY_KIND.get(spec.kind) != recorded_kind:
        raise TrainingSettingsError(
            f"run {run_id!r} was trained by the {recorded_kind} trainer but --policy {policy} "
            "names another kind of policy; resume with the policy the run started with"
        )
    trainer = load_trainer(store, run_id, latest.policy_version, seed=seed, sampling=sampling)
    return trainer, done[-1] + 1


def sampled_token_count(batch: Sequence[Trajectory]) -> int:
    """Completion tokens the policy sampled over a batch (0 for policies without tokens)."""
    return sum(
        len(step.record.completion_token_ids)
        for trajectory in batch
        for step in trajectory.steps
        if isinstance(step.record, ChatRecord)
    )


def _update(trainer: Trainer, trajectories: list[Trajectory]) -> TrainerMetrics:
    return trainer.update(trajectories)


def finish_iteration(
    store: TrajectoryStore,
    trainer: Trainer,
    *,
    run_id: str,
    iteration: int,
    batch: Sequence[Trajectory],
    trainable: Sequence[Trajectory],
    quarantined: bool,
    wall_s: float,
    gate_reason: str | None = None,
    extra_metrics: Mapping[str, float] | None = None,
    update: Callable[[Trainer, list[Trajectory]], TrainerMetrics] | None = None,
    policy_lag: int = 0,
    stale_dropped: int = 0,
) -> IterationSummary:
    """Update on `trainable` (the committed, non-quarantined part of `batch`), checkpoint, and
    write the completion marker with the metrics. `update` lets a caller wrap the update (the
    flow runs it as a Prefect task). Throughput goes with the metrics: tokens sampled per second
    of rollout (`wall_s`), tokens trained per second of update, and the seconds of each."""
    version_before = trainer.policy.version
    values: dict[str, float | None] = {}
    update_s = 0.0
    if trainable:
        started = time.monotonic()
        metrics = (update or _update)(trainer, list(trainable))
        update_s = time.monotonic() - started
        values.update(metrics.as_dict())
    values.update(extra_metrics or {})
    sampled = sampled_token_count(batch)
    trained = float(values.get("tokens_trained") or 0.0)
    values.update(
        policy_lag=float(policy_lag),
        stale_dropped=float(stale_dropped),
        rollout_wall_s=wall_s,
        update_s=update_s,
        sampled_tokens=float(sampled),
        sampled_tokens_per_s=sampled / wall_s if wall_s > 0 else 0.0,
        trained_tokens_per_s=trained / update_s if update_s > 0 else 0.0,
    )
    trainer.save_checkpoint(
        store,
        run_id=run_id,
        iteration=iteration,
        trained_on_iterations=[iteration] if trainable else [],
        n_episodes=len(trainable),
        parent_policy_version=version_before,
    )
    store.metrics.record(run_id, iteration, values, source=ITERATION_DONE_SOURCE)
    # Every shard of the iteration is in by now: one steps file for it instead of one per shard
    # keeps later commits and reads from paying for each. A concurrent compaction or vacuum of
    # the same files wins the race harmlessly (the rows are unchanged either way).
    with contextlib.suppress(CommitError):
        store.compact(run_id=run_id, iteration=iteration)
    rewards = [t.reward for t in batch if t.trainable and t.reward is not None]
    return IterationSummary(
        iteration=iteration,
        episodes=len(batch),
        reward_mean=sum(rewards) / len(rewards) if rewards else 0.0,
        pass_rate=sum(1 for r in rewards if r >= 1.0) / len(rewards) if rewards else 0.0,
        infra_errors=sum(1 for t in batch if not t.trainable),
        policy_version=trainer.policy.version,
        quarantined=quarantined,
        wall_s=wall_s,
        gate_reason=gate_reason,
        max_policy_lag=policy_lag,
        stale_dropped=stale_dropped,
    )
