"""The RL loop and its policies: policy ─► episode ─► trajectory ─► GRPO update.

The loop: `actions` (what an agent does and sees) · `policy` (the interface) · `episode` (one
episode in a sandbox, then the verifier) · `trajectory` · `recovery` (retries of infra failures,
fault injection) · `rollout` (shards of episodes on workers) · `iteration` (commit, gate, update,
checkpoint) · `local` (the iteration in one process) · `trainer` (the one trainer interface) ·
`advantages` (groups and masks, shared by the trainers) · `evaluation` (checkpoints, pass@k) ·
`audit` · `gym_env` · `stored` (trajectories read back from the store) · `export`. Its policies
and their trainers: `builtin/` (the CPU policy: a small network scoring the candidates its
proposers offer, and its GRPO trainer) and `lm/` (language models: `openai:` servers and `hf:`
directories, chosen by one policy spec, `training.lm.spec`, and the token-level GRPO trainer).
Statuses and the error root come from `rollyard`.

from training import CandidateScorerPolicy, EpisodeKey, GRPOTrainer, run_episode
policy = CandidateScorerPolicy()
with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
    trajectory = run_episode(task, policy, sandbox, key=EpisodeKey("run-1", iteration=0))
metrics = GRPOTrainer(policy).update([trajectory, ...])
"""

from rollyard.status import EpisodeStatus
from training.actions import (
    Action,
    EditFile,
    History,
    Observation,
    ReadFile,
    RunCommand,
    Submit,
    Turn,
    action_from_json,
    action_to_json,
    history_messages,
)
from training.advantages import GroupStats, group_advantages
from training.builtin.grpo import GRPOConfig, GRPOTrainer, UpdateMetrics, load_checkpoint
from training.builtin.scorer_policy import CandidateScorerPolicy, ScorerConfig
from training.episode import (
    EpisodeConfig,
    Verifier,
    apply_action,
    run_episode,
    verify_agent_sandbox,
)
from training.errors import (
    ActionParseError,
    EnvInfrastructureError,
    EnvLifecycleError,
    PolicyError,
    PolicyServerError,
    TrainerError,
    TrainingError,
)
from training.gym_env import RollyardEnv, make_task_env
from training.policy import ChatRecord, Decision, Policy, ScorerRecord, ScriptedPolicy
from training.trainer import Trainer
from training.trajectory import EpisodeKey, Step, Trajectory

__all__ = [
    "Action",
    "ActionParseError",
    "CandidateScorerPolicy",
    "ChatRecord",
    "Decision",
    "EditFile",
    "EnvInfrastructureError",
    "EnvLifecycleError",
    "EpisodeConfig",
    "EpisodeKey",
    "EpisodeStatus",
    "GRPOConfig",
    "GRPOTrainer",
    "GroupStats",
    "History",
    "Observation",
    "Policy",
    "PolicyError",
    "PolicyServerError",
    "ReadFile",
    "RollyardEnv",
    "RunCommand",
    "ScorerConfig",
    "ScorerRecord",
    "ScriptedPolicy",
    "Step",
    "Submit",
    "Trainer",
    "TrainerError",
    "TrainingError",
    "Trajectory",
    "Turn",
    "UpdateMetrics",
    "Verifier",
    "action_from_json",
    "action_to_json",
    "apply_action",
    "group_advantages",
    "history_messages",
    "load_checkpoint",
    "make_task_env",
    "run_episode",
    "verify_agent_sandbox",
]
# The chat policy (httpx), the Gymnasium environment and export (pyarrow) are imported from
# their modules: training.lm (spec, openai_policy, hf_policy), training.gym_env, training.export.
