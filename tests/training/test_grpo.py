"""GRPO mechanics: group advantages, masking, the clipped objective, learning on a toy problem,
checkpoints."""

from __future__ import annotations

import dataclasses
import math
import pickle
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from rollyard.status import EpisodeStatus
from training.actions import TRIAL_KEPT, TRIAL_REVERTED, Observation, RunCommand, Submit, TryEdit
from training.advantages import group_advantages
from training.builtin.features import FEATURE_COUNT, FEATURE_NAMES, Candidate
from training.builtin.grpo import (
    GRPOConfig,
    GRPOTrainer,
    adapted_entropy_coef,
    clipped_objective,
    kl_to_reference,
    load_checkpoint,
    step_advantages,
    trial_credits,
)
from training.builtin.scorer_policy import CandidateScorerPolicy
from training.policy import ScorerRecord
from training.trajectory import EpisodeKey, Step, Trajectory

_GOOD = FEATURE_NAMES.index("edit_in_failing_function")


def make_trajectory(
    group: int,
    sample: int,
    reward: float | None,
    *,
    status: EpisodeStatus = EpisodeStatus.OK,
    steps: tuple[Step, ...] = (),
    iteration: int = 0,
) -> Trajectory:
    key = EpisodeKey("run", iteration, group_index=group, sample_index=sample)
    return Trajectory(
        episode_id=key.episode_id(f"task-{group}"),
        group_id=key.group_id(f"task-{group}"),
        key=key,
        task_id=f"task-{group}",
        task_version="1",
        instruction="fix it",
        snapshot_digest="sha256:x",
        sandbox_backend="bwrap",
        policy_version="p@0",
        status=status,
        steps=steps,
        terminated=True,
        truncated=False,
        reward=reward,
        passed=reward == 1.0 if reward is not None else None,
    )


def test_advantages_are_reward_minus_group_mean_over_std() -> None:
    batch = [make_trajectory(0, i, r) for i, r in enumerate([1.0, 0.0, 0.0, 1.0])]
    batch += [make_trajectory(1, i, r) for i, r in enumerate([0.5, 0.0])]
    advantages, stats = group_advantages(batch, GRPOConfig())
    assert [round(advantages[t.episode_id], 4) for t in batch[:4]] == [1.0, -1.0, -1.0, 1.0]
    assert [round(advantages[t.episode_id], 4) for t in batch[4:]] == [1.0, -1.0]
    assert stats.groups_used == 2 and stats.samples_used == 6

    unnormalized, _ = group_advantages(batch, GRPOConfig(normalize_by_std=False))
    assert [unnormalized[t.episode_id] for t in batch[4:]] == [0.25, -0.25]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=2, max_size=8))
def test_advantages_of_a_group_sum_to_zero(rewards: list[float]) -> None:
    batch = [make_trajectory(0, i, r) for i, r in enumerate(rewards)]
    advantages, stats = group_advantages(batch, GRPOConfig())
    if stats.groups_zero_variance:
        assert advantages == {}
    else:
        assert abs(sum(advantages.values())) < 1e-6


def test_zero_variance_groups_are_masked_and_counted() -> None:
    batch = [make_trajectory(0, i, 1.0) for i in range(4)]
    batch += [make_trajectory(1, i, 0.0) for i in range(4)]
    batch += [make_trajectory(2, i, float(i % 2)) for i in range(4)]
    advantages, stats = group_advantages(batch, GRPOConfig())
    assert stats.groups_zero_variance == 2
    assert stats.groups_used == 1
    assert set(advantages) == {t.episode_id for t in batch[8:]}


def test_infra_failures_mask_their_group_or_drop_their_samples() -> None:
    batch = [
        make_trajectory(0, 0, 1.0),
        make_trajectory(0, 1, 0.0),
        make_trajectory(0, 2, None, status=EpisodeStatus.INFRA_ERROR),
        make_trajectory(1, 0, 1.0),
        make_trajectory(1, 1, 0.0),
    ]
    advantages, stats = group_advantages(batch, GRPOConfig())
    assert stats.groups_with_infra_failures == 1
    assert stats.samples_infra_failed == 1
    assert set(advantages) == {batch[3].episode_id, batch[4].episode_id}

    dropped, stats = group_advantages(batch, GRPOConfig(infra_failures="drop_samples"))
    assert stats.groups_with_infra_failures == 1 and stats.groups_used == 2
    assert batch[2].episode_id not in dropped and batch[0].episode_id in dropped

    # a group left with one trainable sample has no baseline
    small = [
        make_trajectory(0, 0, 1.0),
        make_trajectory(0, 1, None, status=EpisodeStatus.VERIFIER_ERROR),
    ]
    advantages, stats = group_advantages(small, GRPOConfig(infra_failures="drop_samples"))
    assert advantages == {} and stats.groups_too_small == 1


def _trial(index: int, kept: bool) -> Step:
    verdict = f"{TRIAL_KEPT}: 1 -> 0 failing tests]" if kept else f"{TRIAL_REVERTED}: 1 failing]"
    action = TryEdit("pkg/a.py", "x < 1", "x <= 1", "python -m pytest -q", 1)
    return Step(index, action, Observation(f"1 passed\n{verdict}", 0), 0.0, 0.0)


def test_trial_credits_tell_kept_trials_from_reverted_ones_within_a_group() -> None:
    reverted, kept = _trial(0, kept=False), _trial(1, kept=True)
    batch = [
        make_trajectory(0, 0, 1.0, steps=(reverted, kept)),
        make_trajectory(0, 1, 0.0, steps=(reverted, _trial(1, kept=False))),
        # a zero-variance group still credits its trials: one was kept, three were not
        make_trajectory(1, 0, 0.0, steps=(reverted, kept)),
        make_trajectory(1, 1, 0.0, steps=(reverted, reverted)),
        # a group with an infra failure is masked (mask_group), as for advantages
        make_trajectory(2, 0, 1.0, steps=(kept,)),
        make_trajectory(2, 1, None, status=EpisodeStatus.INFRA_ERROR, steps=(reverted,)),
    ]
    assert trial_credits(batch, GRPOConfig(trial_credit_weight=0.0)) == {}  # plain GRPO
    credits = trial_credits(batch)
    first, second, third, _, fifth, _ = (t.episode_id for t in batch)
    assert credits[(first, 1)] == pytest.approx(0.75) and credits[(first, 0)] == -0.25
    assert credits[(second, 1)] == -0.25
    assert credits[(third, 1)] == pytest.approx(0.75)
    assert not any(key[0] == fifth for key in credits)
    assert abs(sum(v for k, v in credits.items() if k[0] in (first, second))) < 1e-9


def test_step_advantages_add_trial_credit_to_the_episode_advantage() -> None:
    reverted, kept = _trial(0, kept=False), _trial(1, kept=True)
    run = RunCommand("python -m pytest -q")
    plain = Step(2, run, Observation("1 failed", 1), 0.0, 0.0)
    batch = [
        make_trajectory(0, 0, 1.0, steps=(reverted, kept, plain)),
        make_trajectory(0, 1, 0.0, steps=(reverted, _trial(1, kept=False), plain)),
        make_trajectory(1, 0, 0.0, steps=(_trial(0, kept=True), plain)),  # zero variance
        make_trajectory(1, 1, 0.0, steps=(reverted, plain)),
    ]
    config = GRPOConfig(trial_credit_weight=0.5)
    advantages, _ = group_advantages(batch, config)
    credits = trial_credits(batch, config)
    per_step = step_advantages(batch, config)
    first, second, third, fourth = (t.episode_id for t in batch)
    for episode_id in (first, second):
        for index in range(3):
            expected = advantages[episode_id] + 0.5 * credits.get((episode_id, index), 0.0)
            assert per_step[(episode_id, index)] == pytest.approx(expected)
    # A zero-variance group trains on its trials only.
    assert per_step[(third, 0)] == pytest.approx(0.5 * 0.5) and (third, 2) not in per_step
    assert per_step[(fourth, 0)] == pytest.approx(-0.5 * 0.5) and (fourth, 2) not in per_step
    # Without trial credit it is the episode advantage on every action of a trained group.
    plain_grpo = step_advantages(batch, GRPOConfig(trial_credit_weight=0.0))
    assert set(plain_grpo) == {(e, i) for e in (first, second) for i in range(3)}
    assert plain_grpo[(first, 2)] == advantages[first]


def test_trial_credit_trains_groups_whose_rewards_are_all_equal() -> None:
    policy = CandidateScorerPolicy(seed=0)
    candidates = _toy_candidates(random.Random(5))
    good = next(i for i, c in enumerate(candidates) if c.features[_GOOD])
    bad = (good + 1) % len(candidates)
    features = tuple(c.features for c in candidates)

    def trial(index: int, chosen: int) -> Step:
        step = _trial(index, kept=chosen == good)
        logprob = float(torch.log(torch.tensor(1.0 / len(candidates))))
        return dataclasses.replace(step, logprob=logprob, record=ScorerRecord(features, chosen))

    # every sample fails in the end, but the trial at the good candidate was kept
    batch = [
        make_trajectory(0, 0, 0.0, steps=(trial(0, good),)),
        make_trajectory(0, 1, 0.0, steps=(trial(0, bad),)),
    ]
    without = GRPOTrainer(
        CandidateScorerPolicy(seed=0), GRPOConfig(trial_credit_weight=0.0)
    ).update(batch)
    assert without.optimizer_steps == 0
    trainer = GRPOTrainer(policy)
    for _ in range(5):
        trainer.update(batch)
    with torch.no_grad():
        logits = policy.network(torch.tensor(features, dtype=torch.float32))
    assert int(torch.argmax(logits)) == good


def test_clipped_objective_stops_gradient_outside_the_clip_range() -> None:
    old = torch.zeros(4)
    # ratios e^0.5 (above 1+ε) and e^-0.5 (below 1-ε), each with positive and negative advantage
    new = torch.tensor([0.5, 0.5, -0.5, -0.5], requires_grad=True)
    advantages = torch.tensor([1.0, -1.0, 1.0, -1.0])
    loss, _, clip_fraction = clipped_objective(new, old, advantages, clip_epsilon=0.2)
    loss.backward()
    assert new.grad is not None
    gradient = new.grad.tolist()
    # above the range with A>0 and below it with A<0: clipped, no push further
    assert gradient[0] == 0.0 and gradient[3] == 0.0
    # the pessimistic side still pulls back
    assert gradient[1] > 0.0 and gradient[2] < 0.0
    assert clip_fraction.item() == 1.0

    inside = torch.tensor([0.05], requires_grad=True)
    loss, kl, clip_fraction = clipped_objective(inside, torch.zeros(1), torch.ones(1), 0.2)
    loss.backward()
    assert inside.grad is not None and inside.grad.item() < 0 and clip_fraction.item() == 0.0
    assert kl.item() >= 0


def _toy_candidates(rng: random.Random) -> list[Candidate]:
    """Eight candidate edits with random features; exactly one is in the failing function."""
    candidates = []
    good = rng.randrange(8)
    for index in range(8):
        features = [0.0] * FEATURE_COUNT
        features[FEATURE_NAMES.index("is_try_edit")] = 1.0
        for name in ("edit_line_tried_before", "edit_kind_comparison", "edit_kind_wrong_variable"):
            features[FEATURE_NAMES.index(name)] = float(rng.random() < 0.5)
        features[_GOOD] = float(index == good)
        candidates.append(Candidate(Submit(), tuple(features), f"c{index}"))
    return candidates


def _toy_batch(
    policy: CandidateScorerPolicy, iteration: int, rng: random.Random
) -> list[Trajectory]:
    batch = []
    for group in range(6):
        candidates = _toy_candidates(rng)
        for sample in range(4):
            decision = policy.choose(candidates)
            assert isinstance(decision.record, ScorerRecord)
            chosen = candidates[decision.record.chosen_index]
            reward = chosen.features[_GOOD]
            step = Step(
                0,
                decision.action,
                Observation("ok", 0),
                0.0,
                0.0,
                logprob=decision.logprob,
                record=decision.record,
            )
            batch.append(make_trajectory(group, sample, reward, steps=(step,), iteration=iteration))
    return batch


def test_scorer_policy_learns_a_toy_candidate_problem() -> None:
    policy = CandidateScorerPolicy(seed=1)
    trainer = GRPOTrainer(policy, GRPOConfig(learning_rate=0.05))
    rng = random.Random(0)
    rewards = []
    for iteration in range(12):
        metrics = trainer.update(_toy_batch(policy, iteration, rng))
        rewards.append(metrics.reward_mean)
    assert rewards[0] < 0.35  # about 1/8 at random
    assert sum(rewards[-3:]) / 3 > 0.7
    assert policy.feature_weights()["edit_in_failing_function"] > 0
    # once every sample of a group succeeds the group is zero-variance and no update happens
    assert 1 <= policy.updates <= 12
    assert policy.version.startswith(f"candidate-scorer@{policy.updates}:")


def test_update_reports_metrics_and_skips_batches_with_nothing_to_learn() -> None:
    policy = CandidateScorerPolicy()
    trainer = GRPOTrainer(policy)
    version = policy.version
    metrics = trainer.update([make_trajectory(0, i, 1.0) for i in range(3)])
    assert metrics.optimizer_steps == 0 and metrics.groups.groups_zero_variance == 1
    assert policy.version == version and metrics.reward_mean == 1.0
    row = metrics.as_dict()
    assert row["groups_zero_variance"] == 1.0 and "clip_fraction" in row


def test_policy_and_trainer_round_trip_through_pickle_bytes_and_the_store(tmp_path) -> None:
    from storage import TrajectoryStore

    policy = CandidateScorerPolicy(seed=3)
    trainer = GRPOTrainer(policy)
    trainer.update(_toy_batch(policy, 0, random.Random(1)))
    candidates = _toy_candidates(random.Random(2))

    copy = pickle.loads(pickle.dumps(policy))
    assert copy.version == policy.version
    assert copy.choose(candidates) == policy.choose(candidates)  # same weights, same RNG state
    restored = CandidateScorerPolicy.from_bytes(policy.to_bytes())
    assert restored.version == policy.version

    store = TrajectoryStore(tmp_path / "store")
    info = trainer.save_checkpoint(store, run_id="run", iteration=0, n_episodes=24)
    assert info.policy_version == policy.version
    resumed = load_checkpoint(store, "run", policy.version)
    assert resumed.policy.version == policy.version and resumed.updates == 1
    before = [p.clone() for p in resumed.policy.network.parameters()]
    resumed.update(_toy_batch(resumed.policy, 1, random.Random(4)))
    assert any(
        not torch.equal(a, b)
        for a, b in zip(before, resumed.policy.network.parameters(), strict=True)
    )


def test_trainer_refuses_trajectories_without_scorer_records() -> None:
    from training.errors import TrainerError

    step = Step(0, Submit(), Observation("submitted", 0), 0.0, 0.0)
    batch = [make_trajectory(0, 0, 1.0, steps=(step,)), make_trajectory(0, 1, 0.0, steps=(step,))]
    with pytest.raises(TrainerError, match="export others"):
        GRPOTrainer(CandidateScorerPolicy()).update(batch)


def _entropy_of_toy_batch(policy: CandidateScorerPolicy, batch: list[Trajectory]) -> float:
    records = [s.record for t in batch for s in t.steps if isinstance(s.record, ScorerRecord)]
    with torch.no_grad():
        _, entropies = policy.log_probs_of(records)
    return float(entropies.mean())


def test_without_a_target_entropy_the_update_is_unchanged() -> None:
    """`target_entropy=None` (the default) trains exactly as the fixed bonus always did."""
    batch = _toy_batch(CandidateScorerPolicy(seed=5), 0, random.Random(3))
    results = []
    for config in (GRPOConfig(), GRPOConfig(target_entropy=None, entropy_coef_rate=7.0)):
        trainer = GRPOTrainer(CandidateScorerPolicy(seed=5), config)
        metrics = trainer.update(batch)
        assert trainer.entropy_coef == config.entropy_coef == 0.01
        assert "entropy_coef" not in metrics.as_dict()  # the metrics table is as it was
        results.append((metrics, [p.detach().clone() for p in trainer.policy.network.parameters()]))
    (first, first_params), (second, second_params) = results
    assert first == second
    assert all(torch.equal(a, b) for a, b in zip(first_params, second_params, strict=True))

    # and the same as the bonus written out by hand: loss = policy loss - 0.01 * entropy
    trainer = GRPOTrainer(CandidateScorerPolicy(seed=5), GRPOConfig(epochs=1, minibatches=1))
    metrics = trainer.update(batch)
    assert metrics.loss == pytest.approx(metrics.policy_loss - 0.01 * metrics.entropy, abs=1e-6)


def test_adapted_entropy_coef_grows_below_the_target_and_shrinks_above_it() -> None:
    config = GRPOConfig(target_entropy=1.5, entropy_coef_rate=1.0, entropy_coef_bounds=(1e-3, 0.5))
    assert adapted_entropy_coef(0.01, 0.5, config) == pytest.approx(0.01 * 2.718281828)
    assert adapted_entropy_coef(0.01, 2.5, config) == pytest.approx(0.01 / 2.718281828)
    assert adapted_entropy_coef(0.01, 1.5, config) == pytest.approx(0.01)
    assert adapted_entropy_coef(0.4, 0.0, config) == 0.5  # bounded above
    assert adapted_entropy_coef(0.002, 5.0, config) == 1e-3  # and below


def test_target_entropy_raises_the_weight_when_entropy_is_below_it() -> None:
    batch = _toy_batch(CandidateScorerPolicy(seed=5), 0, random.Random(3))
    entropy = _entropy_of_toy_batch(CandidateScorerPolicy(seed=5), batch)
    assert 0.5 < entropy < 2.5  # about log 8 for an untrained scorer

    below = GRPOTrainer(CandidateScorerPolicy(seed=5), GRPOConfig(target_entropy=entropy + 1.0))
    below.update(batch)
    assert below.entropy_coef > 0.01
    above = GRPOTrainer(CandidateScorerPolicy(seed=5), GRPOConfig(target_entropy=entropy - 1.0))
    above.update(batch)
    assert above.entropy_coef < 0.01

    # a stronger weight keeps more entropy than the fixed one after the same update
    fixed = GRPOTrainer(CandidateScorerPolicy(seed=5), GRPOConfig())
    fixed.update(batch)
    assert _entropy_of_toy_batch(below.policy, batch) > _entropy_of_toy_batch(fixed.policy, batch)


def test_adapted_entropy_coef_round_trips_through_state_dict_and_the_store(tmp_path) -> None:
    from storage import TrajectoryStore

    config = GRPOConfig(target_entropy=3.0)
    trainer = GRPOTrainer(CandidateScorerPolicy(seed=3), config)
    trainer.update(_toy_batch(trainer.policy, 0, random.Random(1)))
    assert trainer.entropy_coef != config.entropy_coef

    resumed = GRPOTrainer(CandidateScorerPolicy(seed=3), config)
    resumed.load_state_dict(pickle.loads(pickle.dumps(trainer.state_dict())))
    assert resumed.entropy_coef == trainer.entropy_coef

    store = TrajectoryStore(tmp_path / "store")
    trainer.save_checkpoint(store, run_id="run", iteration=0, n_episodes=24)
    loaded = load_checkpoint(store, "run", trainer.policy.version)
    assert loaded.config == config and loaded.entropy_coef == trainer.entropy_coef

    # resuming is exact: the next update matches the uninterrupted trainer's
    batch = _toy_batch(trainer.policy, 1, random.Random(4))
    expected = trainer.update(batch)
    for other in (resumed, loaded):
        assert other.update(batch).loss == expected.loss
        assert other.entropy_coef == trainer.entropy_coef

    # a checkpoint written before the weight adapted resumes with the configured weight
    old_state = trainer.state_dict()
    del old_state["entropy_coef"]
    old = GRPOTrainer(CandidateScorerPolicy(seed=3), GRPOConfig())
    old.load_state_dict(old_state)
    assert old.entropy_coef == 0.01


def test_kl_to_reference_is_the_exact_divergence_over_all_candidates() -> None:
    before = torch.tensor([0.5, 0.25, 0.25]).log()
    after = torch.tensor([0.25, 0.5, 0.25]).log()
    # KL(before ‖ after) = 0.5 log(0.5/0.25) + 0.25 log(0.25/0.5) + 0 = 0.25 log 2
    assert float(kl_to_reference([after], [before])) == pytest.approx(0.25 * math.log(2))
    assert float(kl_to_reference([after, before], [before, before])) == pytest.approx(
        0.125 * math.log(2)  # the mean over states
    )
    assert float(kl_to_reference([before], [before])) == 0.0


def test_kl_anchor_holds_the_policy_near_the_one_that_sampled_the_batch() -> None:
    batch = _toy_batch(CandidateScorerPolicy(seed=5), 0, random.Random(3))
    records = [s.record for t in batch for s in t.steps if isinstance(s.record, ScorerRecord)]
    with torch.no_grad():
        reference = CandidateScorerPolicy(seed=5).distributions_of(records)

    def moved(config: GRPOConfig) -> tuple[float, list[torch.Tensor]]:
        """How far one update moves the batch's distributions, and where it moves them."""
        trainer = GRPOTrainer(CandidateScorerPolicy(seed=5), config)
        trainer.update(batch)
        with torch.no_grad():
            after = trainer.policy.distributions_of(records)
        return float(kl_to_reference(after, reference)), after

    free, _ = moved(GRPOConfig())
    anchored, _ = moved(GRPOConfig(kl_coef=5.0))
    assert free > 0.0 and anchored < 0.5 * free

    # The penalty and its gradient are zero at the pre-update policy, so the first optimizer step
    # is the unanchored one (up to rounding); only later steps are pulled back. (Distributions,
    # not parameters: the output bias gets no gradient, and Adam scales its rounding noise up.)
    one_step = GRPOConfig(epochs=1, minibatches=1)
    _, plain = moved(one_step)
    _, anchored_one_step = moved(dataclasses.replace(one_step, kl_coef=5.0))
    assert all(
        torch.allclose(a, b, atol=1e-6) for a, b in zip(plain, anchored_one_step, strict=True)
    )
