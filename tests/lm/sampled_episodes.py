"""Language-model episodes sampled without a sandbox, stored as token in / token out: for the
trainer's mechanics tests, where what matters is which ids were sampled and their logprobs."""

from __future__ import annotations

from rollyard.status import EpisodeStatus
from training.actions import Observation, RunCommand, Submit
from training.lm.generate import LocalGenerator, SamplingParams
from training.policy import ChatRecord
from training.trajectory import EpisodeKey, Step, Trajectory

TOOL_OUTPUT = (
    "\n<|im_start|>user\n<tool_response>\nFAILED tests/test_x.py::test_y\n[exit code 1]\n"
    "</tool_response><|im_end|>\n<|im_start|>assistant\n"
)


def sampled_episode(
    generator: LocalGenerator,
    *,
    group: int,
    sample: int,
    reward: float | None,
    status: EpisodeStatus = EpisodeStatus.OK,
    iteration: int = 0,
) -> Trajectory:
    """Two sampled turns with a tool's output between them, as token in / token out stores
    them: turn 2's prompt is turn 1's prompt + completion + the tool-output tokens."""
    seed = 1000 * iteration + 10 * group + sample
    messages = [{"role": "user", "content": f"Fix the bug in module {group}."}]
    first = generator.generate_batch(
        [generator.prompt(messages, None, SamplingParams(max_tokens=12, seed=seed))]
    )[0]
    tool_ids = generator.tokenizer.encode(TOOL_OUTPUT, add_special_tokens=False)
    second_prompt = first.prompt_token_ids + first.token_ids + tuple(tool_ids)
    second = generator.generate_batch(
        [generator.prompt_from_token_ids(second_prompt, SamplingParams(max_tokens=10, seed=seed))]
    )[0]
    records = [
        ChatRecord("random", c.prompt_token_ids, c.token_ids, c.logprobs, c.finish_reason)
        for c in (first, second)
    ]
    steps = (
        Step(0, RunCommand("pytest"), Observation("FAILED", 1), 0.0, 0.0, record=records[0]),
        Step(1, Submit(), Observation("submitted", 0), 0.0, 0.0, record=records[1]),
    )
    key = EpisodeKey("run", iteration, group_index=group, sample_index=sample)
    task_id = f"task-{group}"
    return Trajectory(
        episode_id=key.episode_id(task_id),
        group_id=key.group_id(task_id),
        key=key,
        task_id=task_id,
        task_version="1",
        instruction="fix it",
        snapshot_digest="sha256:x",
        sandbox_backend="bwrap",
        policy_version="hf:random@0",
        status=status,
        steps=steps,
        terminated=True,
        truncated=False,
        reward=reward,
        passed=reward == 1.0 if reward is not None else None,
        error=None if status == EpisodeStatus.OK else "sandbox died",
    )


def batch_of(generator: LocalGenerator, rewards: dict[int, list[float | None]]) -> list[Trajectory]:
    return [
        sampled_episode(
            generator,
            group=group,
            sample=sample,
            reward=reward,
            status=EpisodeStatus.OK if reward is not None else EpisodeStatus.INFRA_ERROR,
        )
        for group, group_rewards in rewards.items()
        for sample, reward in enumerate(group_rewards)
    ]
