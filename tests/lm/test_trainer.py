"""Mechanics of the token-level GRPO trainer on a tiny random model: which tokens train, the
recomputed logprobs against the sampler's, masked groups, gradient accumulation, LoRA, and
checkpoint → resume reproducing the next update bit for bit."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import pytest
import torch

from storage import TrajectoryStore
from tests.lm.sampled_episodes import batch_of, sampled_episode
from training.actions import History, InvalidCall
from training.errors import TrainerError, TrainingSettingsError
from training.iteration import load_trainer
from training.lm.conversation import ChatSampling
from training.lm.generate import LocalGenerator, SamplingParams
from training.lm.grpo_config import LMTrainerConfig, LoraSettings
from training.lm.hf_policy import HFPolicy
from training.lm.tiny import TinyModelSize, build_tiny_model
from training.lm.token_loss import UpdateTotals, token_logprobs, token_weights, trained_samples
from training.lm.trainer import LMTrainer
from training.policy import ChatRecord


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A ~0.3 M-parameter random Qwen2 model with the project's tokenizer and template."""
    size = TinyModelSize(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    return build_tiny_model(tmp_path_factory.mktemp("trainer") / "random", seed=0, size=size)


@pytest.fixture(scope="module")
def generator(model_dir: Path) -> LocalGenerator:
    # The `hf:` policy's own generator: the sampler under test is the in-process policy's.
    return HFPolicy(model_dir).generator()


def new_trainer(model_dir: Path, tmp_path: Path, **config: Any) -> LMTrainer:
    return LMTrainer.from_model_dir(
        model_dir,
        weights_dir=tmp_path / "weights",
        config=LMTrainerConfig(learning_rate=1e-3, **config),
    )


def parameters(trainer: LMTrainer) -> list[torch.Tensor]:
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_only_the_models_own_tokens_train(generator: LocalGenerator) -> None:
    (episode,) = batch_of(generator, {0: [1.0]})
    (sample,) = trained_samples([episode], {episode.episode_id: 1.0}, budget=4096)
    trained_ids = [sample.sequence.input_ids[p] for p in sample.trained_positions]
    first, second = (step.record for step in episode.steps)
    assert isinstance(first, ChatRecord) and isinstance(second, ChatRecord)
    # Exactly the sampled ids, in order: no prompt, template or tool-output token among them.
    assert trained_ids == list(first.completion_token_ids + second.completion_token_ids)
    assert len(sample.sequence.input_ids) == len(second.prompt_token_ids) + len(
        second.completion_token_ids
    )
    tool_start = len(first.prompt_token_ids) + len(first.completion_token_ids)
    tool_span = range(tool_start, len(second.prompt_token_ids))
    assert len(tool_span) > 5 and not set(tool_span) & set(sample.trained_positions)

    # The loss reads the output layer only where it predicts a sampled token.
    rows: list[int] = []
    head = generator.model.get_output_embeddings()
    hook = head.register_forward_hook(lambda _m, args, _o: rows.append(args[0].shape[0]))
    try:
        token_logprobs(generator.model, [sample], temperature=1.0, pad_token_id=0)
    finally:
        hook.remove()
    assert rows == [len(trained_ids)]


def test_recomputed_logprobs_match_the_in_process_samplers_at_temperature_1(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    policy = HFPolicy(model_dir, sampling=ChatSampling(temperature=1.0, max_tokens=24))
    policy.seed(7)
    decision = policy.act(History("Fix the failing test in calc.py."))
    record = decision.record
    assert isinstance(record, ChatRecord) and record.completion_token_ids
    (episode,) = batch_of(generator, {0: [1.0]})
    from_policy = dataclasses.replace(
        episode, steps=(dataclasses.replace(episode.steps[0], record=record),)
    )
    (sample,) = trained_samples([from_policy], {from_policy.episode_id: 1.0}, budget=4096)
    with torch.no_grad():
        (recomputed,) = token_logprobs(generator.model, [sample], temperature=1.0, pad_token_id=0)
    sampler = torch.tensor(record.completion_logprobs)
    assert torch.allclose(recomputed.double(), sampler.double(), atol=1e-4, rtol=0)

    # The trainer measures the same on every batch and stores it as a metric.
    batch = batch_of(generator, {0: [1.0, 0.0], 1: [0.0, 1.0]})
    metrics = new_trainer(model_dir, tmp_path).update(batch)
    assert metrics.tokens_trained > 0
    assert metrics.logprob_mismatch_max_abs < 1e-4
    assert metrics.as_dict()["logprob_mismatch_mean_abs"] < 1e-4


def test_a_zero_variance_group_gives_no_gradient(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    alone = new_trainer(model_dir, tmp_path / "a")
    metrics = alone.update(batch_of(generator, {0: [1.0, 1.0, 1.0]}))
    assert metrics.groups.groups_zero_variance == 1 and metrics.optimizer_steps == 0
    assert metrics.policy_version_after == metrics.policy_version_before
    assert all(p.grad is None for p in alone.model.parameters())

    varied = batch_of(generator, {1: [1.0, 0.0]})
    with_flat = new_trainer(model_dir, tmp_path / "b")
    with_flat.update(varied + batch_of(generator, {0: [0.0, 0.0]}))
    without = new_trainer(model_dir, tmp_path / "c")
    without.update(varied)
    for mixed, single in zip(parameters(with_flat), parameters(without), strict=True):
        assert torch.equal(mixed, single)


def test_an_infra_failure_masks_its_group(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    varied = batch_of(generator, {1: [1.0, 0.0]})
    failed_group = batch_of(generator, {0: [1.0, None, 0.0]})
    trainer = new_trainer(model_dir, tmp_path / "a")
    metrics = trainer.update(varied + failed_group)
    assert metrics.groups.groups_with_infra_failures == 1
    assert metrics.groups.samples_infra_failed == 1
    assert metrics.episodes_used == 2  # only group 1 trained
    reference = new_trainer(model_dir, tmp_path / "b")
    reference.update(varied)
    for masked, alone in zip(parameters(trainer), parameters(reference), strict=True):
        assert torch.equal(masked, alone)


def test_the_update_raises_the_better_samples_tokens(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    better, worse = batch_of(generator, {0: [1.0, 0.0]})
    trainer = new_trainer(model_dir, tmp_path)
    samples = trained_samples(
        [better, worse], {better.episode_id: 1.0, worse.episode_id: -1.0}, 4096
    )

    def mean_logprobs() -> list[float]:
        with torch.no_grad():
            return [
                float(lp.mean())
                for lp in token_logprobs(trainer.model, samples, temperature=1.0, pad_token_id=0)
            ]

    before = mean_logprobs()
    trainer.update([better, worse])
    after = mean_logprobs()
    assert after[0] > before[0] and after[1] < before[1]
    # The policy acts from the new weights: a new directory, a new version.
    assert trainer.policy_dir.parent == (tmp_path / "weights").resolve()
    assert trainer.policy.version != HFPolicy(model_dir).version


def test_gradient_accumulation_gives_the_full_batch_gradient(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    batch = batch_of(generator, {0: [1.0, 0.0], 1: [0.0, 1.0]})
    longest = max(
        len(s.sequence.input_ids)
        for s in trained_samples(batch, {t.episode_id: 1.0 for t in batch}, budget=4096)
    )
    whole = new_trainer(model_dir, tmp_path / "a", max_tokens_per_microbatch=4096)
    split = new_trainer(model_dir, tmp_path / "b", max_tokens_per_microbatch=longest)
    assert whole.update(batch).microbatches == 1
    assert split.update(batch).microbatches == 4
    # The gradient the optimizer stepped with (left in .grad) is the same, up to summation order.
    for one, many in zip(whole.model.parameters(), split.model.parameters(), strict=True):
        assert one.grad is not None and many.grad is not None
        assert torch.allclose(one.grad, many.grad, rtol=1e-4, atol=1e-7)

    too_small = new_trainer(model_dir, tmp_path / "c", max_tokens_per_microbatch=longest - 1)
    with pytest.raises(TrainerError, match="over max_tokens_per_microbatch"):
        too_small.update(batch)


def test_sequence_aggregation_weighs_every_episode_the_same(generator: LocalGenerator) -> None:
    batch = batch_of(generator, {0: [1.0, 0.0]})
    samples = trained_samples(batch, {t.episode_id: 1.0 for t in batch}, budget=4096)
    sequence = token_weights(samples, "sequence")
    token = token_weights(samples, "token")
    per_episode = [sequence[id(s)] * len(s.trained_positions) for s in samples]
    assert per_episode == pytest.approx([0.5, 0.5])
    total_tokens = sum(len(s.trained_positions) for s in samples)
    assert all(weight == pytest.approx(1 / total_tokens) for weight in token.values())


def test_checkpoint_then_resume_reproduces_the_next_update_bit_for_bit(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    store = TrajectoryStore(tmp_path / "store")
    first = LMTrainer.from_model_dir(
        model_dir,
        weights_dir=Path(store.root) / "checkpoint_models" / "run",
        config=LMTrainerConfig(learning_rate=1e-3, epochs=2, minibatches=2, kl_coef=0.05),
    )
    first.update(batch_of(generator, {0: [1.0, 0.0], 1: [0.0, 0.5]}))
    info = first.save_checkpoint(store, run_id="run", iteration=0, n_episodes=4)
    assert info.metadata["trainer"] == "lm"
    assert info.metadata["model_dir"] == "checkpoint_models/run/update-0001"

    next_batch = [
        sampled_episode(generator, group=g, sample=s, reward=r, iteration=1)
        for g, rewards in {0: [0.0, 1.0], 1: [1.0, 0.0]}.items()
        for s, r in enumerate(rewards)
    ]
    continued = first.update(next_batch)
    resumed_trainer = load_trainer(store, "run", info.policy_version)
    assert isinstance(resumed_trainer, LMTrainer) and resumed_trainer.updates == 1
    resumed = resumed_trainer.update(next_batch)
    assert resumed.as_dict() == continued.as_dict()
    for kept, restored in zip(parameters(first), parameters(resumed_trainer), strict=True):
        assert torch.equal(kept, restored)
    # The checkpoint's directory is what `hf:DIR` loads for evaluation.
    assert HFPolicy(Path(store.root) / info.metadata["model_dir"]).version == info.policy_version


def test_lora_trains_an_adapter_the_hf_policy_loads(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    trainer = new_trainer(model_dir, tmp_path, lora=LoraSettings(rank=4, alpha=8), kl_coef=0.1)
    metrics = trainer.update(batch_of(generator, {0: [1.0, 0.0]}))
    assert metrics.optimizer_steps == 1 and metrics.kl_to_reference >= 0
    assert (trainer.policy_dir / "adapter_config.json").is_file()
    assert not (trainer.policy_dir / "model.safetensors").exists()
    merged = trainer.policy.generator()
    # The merged adapter changed what the model computes, and it generates.
    prompt = merged.prompt([{"role": "user", "content": "hi"}], None, SamplingParams(max_tokens=4))
    assert merged.generate_batch([prompt])[0].token_ids
    base_logits = generator.model(input_ids=torch.tensor([prompt.token_ids])).logits
    merged_logits = merged.model(input_ids=torch.tensor([prompt.token_ids])).logits
    assert not torch.allclose(base_logits, merged_logits)


def test_episodes_without_token_ids_are_refused(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    batch = [
        dataclasses.replace(t, steps=tuple(dataclasses.replace(s, record=None) for s in t.steps))
        for t in batch_of(generator, {0: [1.0, 0.0]})
    ]
    with pytest.raises(TrainerError, match="stores no sampled token ids"):
        new_trainer(model_dir, tmp_path).update(batch)


def test_an_iteration_records_throughput_and_resumes_with_the_trainer_its_spec_names(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    from training.errors import TrainingSettingsError
    from training.iteration import finish_iteration, restore_trainer

    store = TrajectoryStore(tmp_path / "store")
    spec = f"hf:{model_dir}"
    trainer, first = restore_trainer(store, "lm", seed=0, resume=False, policy=spec)
    assert isinstance(trainer, LMTrainer) and first == 0
    batch = batch_of(generator, {0: [1.0, 0.0], 1: [0.0, 1.0]})
    summary = finish_iteration(
        store, trainer, run_id="lm", iteration=0, batch=batch, trainable=batch,
        quarantined=False, wall_s=2.0,
    )  # fmt: skip
    values = {
        row["name"]: row["value"]
        for row in store.query(
            "SELECT name, value FROM metrics WHERE run_id = 'lm' AND iteration = 0"
        ).to_pylist()
    }
    sampled = sum(
        len(s.record.completion_token_ids) for t in batch for s in t.steps if s.record is not None
    )
    assert values["sampled_tokens"] == sampled
    assert values["sampled_tokens_per_s"] == pytest.approx(sampled / 2.0)
    assert values["update_s"] > 0 and values["rollout_wall_s"] == 2.0
    assert values["trained_tokens_per_s"] == pytest.approx(
        values["tokens_trained"] / values["update_s"]
    )
    assert summary.policy_version == trainer.policy.version != HFPolicy(model_dir).version

    resumed, next_iteration = restore_trainer(store, "lm", seed=0, resume=True, policy=spec)
    assert isinstance(resumed, LMTrainer) and next_iteration == 1
    assert resumed.policy.version == trainer.policy.version and resumed.updates == 1
    with pytest.raises(TrainingSettingsError, match="trained by the lm trainer"):
        restore_trainer(store, "lm", seed=0, resume=True, policy="builtin")


def test_a_reply_without_a_usable_call_is_never_reinforced(generator: LocalGenerator) -> None:
    (episode,) = batch_of(generator, {0: [1.0]})
    malformed = dataclasses.replace(
        episode,
        steps=(
            dataclasses.replace(
                episode.steps[0], action=InvalidCall("", "</tool_call>", "no tool call")
            ),
            episode.steps[1],
        ),
    )
    first, second = (step.record for step in malformed.steps)
    assert isinstance(first, ChatRecord) and isinstance(second, ChatRecord)

    # In a passing episode only the turn that acted trains; the malformed one stays context.
    (passing,) = trained_samples([malformed], {malformed.episode_id: 1.0}, budget=4096)
    trained = [passing.sequence.input_ids[p] for p in passing.trained_positions]
    assert trained == list(second.completion_token_ids)
    assert passing.sequence.input_ids[: len(first.prompt_token_ids)] == first.prompt_token_ids

    # In a failing one it takes its share of the penalty.
    (failing,) = trained_samples([malformed], {malformed.episode_id: -1.0}, budget=4096)
    trained = [failing.sequence.input_ids[p] for p in failing.trained_positions]
    assert trained == list(first.completion_token_ids + second.completion_token_ids)


def gradient_of(trainer: LMTrainer, episode: Any, advantage: float) -> float:
    """The gradient norm of one sample's loss under the trainer's config."""
    samples = trained_samples([episode], {episode.episode_id: advantage}, 4096)
    trainer.optimizer.zero_grad(set_to_none=True)
    trainer._accumulate(
        samples, token_weights(samples, "token"), {}, UpdateTotals(), first_pass=True
    )
    grads = [p.grad for p in trainer.model.parameters() if p.grad is not None]
    return float(torch.sqrt(sum((g * g).sum() for g in grads))) if grads else 0.0


def test_negative_advantages_scale_to_nothing_when_asked(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    (episode,) = batch_of(generator, {0: [0.0]})
    grpo = new_trainer(model_dir, tmp_path / "a")
    better_only = new_trainer(model_dir, tmp_path / "b", negative_advantage_scale=0.0)
    assert gradient_of(grpo, episode, -1.0) > 0
    assert gradient_of(better_only, episode, -1.0) == 0.0
    assert gradient_of(better_only, episode, 1.0) == gradient_of(grpo, episode, 1.0)


def test_rare_tokens_take_no_positive_advantage_below_the_floor(
    model_dir: Path, generator: LocalGenerator, tmp_path: Path
) -> None:
    (episode,) = batch_of(generator, {0: [1.0]})
    (record, _) = (step.record for step in episode.steps)
    assert isinstance(record, ChatRecord)
    # A random model: every sampled token is far below probability 0.99.
    assert max(record.completion_logprobs) < math.log(0.99)
    floored = new_trainer(model_dir, tmp_path / "a", min_reinforced_prob=0.99)
    assert gradient_of(floored, episode, 1.0) == 0.0
    assert gradient_of(floored, episode, -1.0) > 0  # a penalty still lands on them
    assert gradient_of(new_trainer(model_dir, tmp_path / "b"), episode, 1.0) > 0


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("negative_advantage_scale", -0.1),
        ("negative_advantage_scale", 1.5),
        ("min_reinforced_prob", 1.0),
    ],
)
def test_advantage_shaping_values_out_of_range_are_refused(field: str, value: float) -> None:
    with pytest.raises(TrainingSettingsError, match=field):
        LMTrainerConfig(**{field: value})
