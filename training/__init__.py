"""Policies, the episode runner, the GRPO trainer, a Gymnasium environment and batch export.

    from training import CandidateScorerPolicy, EpisodeKey, GRPOTrainer, run_episode
    policy = CandidateScorerPolicy()
    trajectory = run_episode(task, policy, sandbox, key=EpisodeKey("run-1", iteration=0))
    metrics = GRPOTrainer(policy).update([trajectory, ...])
"""
