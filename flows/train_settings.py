"""The train flow's parameters (`TrainSettings`): what the CLI, deployments and benchmarks fill
in, checked before anything runs."""

from __future__ import annotations

import dataclasses

from flows.errors import FlowSettingsError
from training.lm.conversation import ChatSampling
from training.lm.grpo_config import LMTrainerConfig
from training.lm.spec import parse_policy_spec
from training.recovery import FaultPlan
from training.rollout import Schedule


@dataclasses.dataclass(frozen=True, slots=True)
class TrainSettings:
    """Parameters of one training run (the CLI and deployments fill these)."""

    tasks_dir: str
    """Directory holding task directories (one per task)."""
    store: str
    """Store root (local directory or object-storage URI)."""
    run_id: str = "run-0"
    policy: str = "builtin"
    """The policy spec: `builtin`, `openai:BASE_URL#MODEL` or `hf:DIR` (`training.lm.spec`);
    checked before any episode, and it chooses the trainer."""
    max_concurrent_requests: int = 1
    """Episodes a shard keeps in flight at once, so a model server batches their requests."""
    lm_trainer: LMTrainerConfig | None = None
    """Hyper-parameters of the language-model trainer (`hf:` and `openai:` policies); None: the
    defaults."""
    sampling: ChatSampling | None = None
    """How a chat policy samples each turn (None: `ChatSampling()`); the LM trainer divides
    logits by the same temperature."""
    trainer_model: str | None = None
    """`openai:` policies: the served model's weights on this machine; the trainer trains a
    LoRA adapter on them and loads each new one into the server."""
    iterations: int = 6
    tasks_per_iteration: int = 8
    group_size: int = 4
    """Samples per task (the GRPO group)."""
    shards_per_iteration: int = 4
    """Prefect tasks per iteration; each runs its episodes on one Dask worker."""
    max_steps: int = 8
    seed: int = 0
    resume: bool = False
    """Continue a run from its last checkpointed iteration instead of refusing to reuse its id."""
    mode: str = "sync"
    """`sync`: roll out iteration i with the policy after update i-1, then update. `async`:
    rollouts of the next `max_policy_lag` iterations are already running while the trainer
    updates, so neither side waits; episodes carry their policy lag. `streaming`: groups roll
    out continuously and the trainer takes a batch of `tasks_per_iteration` groups as soon as
    one has finished (`train_streaming`); each such batch is an iteration of the store."""
    max_policy_lag: int = 1
    """Async and streaming: how many updates behind the trainer a consumed episode's policy
    may be; staler episodes are not trained on (counted in the metrics)."""
    schedule: Schedule = "longest_first"
    """Shard planning: `longest_first` (durations predicted from the store) or `round_robin`."""
    max_attempts: int = 3
    """Attempts per episode after infra failures (sandbox crash, hang, OOM of the host)."""
    recovery_mode: str = "replay"
    """`replay` the recorded actions into a fresh sandbox, or `restart` the episode."""
    faults: FaultPlan | None = None
    """Injected faults, for the fault-injection suite and benchmark only."""
    no_worker_timeout_s: float = 120.0
    """How long the flow waits while the Dask cluster has no worker at all before it fails with
    a `NoWorkersError` (queued shards would otherwise wait without end); the run continues from
    its last finished iteration with `resume`."""
    episode_deadline_s: float = 900.0
    """Orchestration-level deadline of one episode: a shard still running after its episodes'
    deadlines summed (plus `SHARD_START_ALLOWANCE_S`) is treated as hung (a worker that stopped
    answering, a call stuck in the kernel); its worker is restarted, its episodes run again on
    a live one and commit exactly once. Inside, each episode also has its task's own budget."""
    update_stand_in_s: float = 0.0
    """Benchmarks only: seconds each update waits before the real one, standing in for the
    update time of a trainer on an accelerator (`benchmarks/async.py`)."""
    max_concurrent_runs_per_store: int = 2
    """Slots of the store's Prefect limit on training runs (`flows.limits`) when this run
    creates it; a run beyond them waits for a slot. A limit that exists keeps its slots."""
    gate_on_failure: str = "continue"
    """What a failed quality gate does besides quarantining the iteration: `continue` training
    (the quarantined batch is not trained on) or `stop` the run. Thresholds come from
    `ROLLYARD_GATE_*` settings (see storage.gates.GateSettings)."""

    def __post_init__(self) -> None:
        parse_policy_spec(self.policy)  # a malformed spec fails here, before anything runs
        if self.max_concurrent_requests < 1:
            raise FlowSettingsError(
                f"max_concurrent_requests must be >= 1, got {self.max_concurrent_requests}"
            )
        if self.mode not in ("sync", "async", "streaming"):
            raise FlowSettingsError(
                f"mode must be 'sync', 'async' or 'streaming', got {self.mode!r}"
            )
        if self.max_policy_lag < 1:
            raise FlowSettingsError(f"max_policy_lag must be >= 1, got {self.max_policy_lag}")
        if self.iterations < 1:
            raise FlowSettingsError(f"iterations must be >= 1, got {self.iterations}")
        if self.max_concurrent_runs_per_store < 1:
            raise FlowSettingsError(
                "max_concurrent_runs_per_store must be >= 1, got "
                f"{self.max_concurrent_runs_per_store}"
            )
        if not self.no_worker_timeout_s > 0:
            raise FlowSettingsError(
                f"no_worker_timeout_s must be positive, got {self.no_worker_timeout_s}"
            )
        if not self.episode_deadline_s > 0:
            raise FlowSettingsError(
                f"episode_deadline_s must be positive, got {self.episode_deadline_s}"
            )
        if self.update_stand_in_s < 0:
            raise FlowSettingsError(f"update_stand_in_s must be >= 0, got {self.update_stand_in_s}")
        if self.schedule not in ("longest_first", "round_robin"):
            raise FlowSettingsError(
                f"schedule must be 'longest_first' or 'round_robin', got {self.schedule!r}"
            )
        if self.gate_on_failure not in ("continue", "stop"):
            raise FlowSettingsError(
                f"gate_on_failure must be 'continue' or 'stop', got {self.gate_on_failure!r}"
            )

    @property
    def pipeline_depth(self) -> int:
        """Iterations rolled out ahead of the trainer."""
        return self.max_policy_lag if self.mode == "async" else 0
