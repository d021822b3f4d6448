"""Token in, token out, end to end: multi-turn episodes of the tiny model — served over real HTTP
(`openai:`) and in-process (`hf:`) — in a bwrap sandbox on a demo task, committed to the store.
The stored ids decode to the conversation each turn carried, and the trainer's input built from
the store alone is the sampled ids: the model's own forward pass over it gives back the sampler's
logprobs at every sampled position, which it could not if a single id were re-tokenized."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from sandboxes import open_sandbox
from storage import TrajectoryStore
from tasks_lib import Task, generate_demo_tasks, load_task
from training.actions import History, InvalidCall, action_arguments, history_messages
from training.episode import EpisodeConfig, run_episode
from training.lm.conversation import SYSTEM_PROMPT, TOOL_SCHEMAS, ChatSampling
from training.lm.generate import parse_tool_calls
from training.lm.hf_policy import HFPolicy
from training.lm.spec import policy_from_spec
from training.lm.tokens import stored_turns, training_sequences, trajectory_turns
from training.policy import ChatRecord, Policy
from training.trajectory import EpisodeKey, Trajectory

SAMPLING = ChatSampling(temperature=1.0, top_p=1.0, max_tokens=160)
"""Temperature 1 and the whole distribution: the sampler's logprobs are the model's own, which a
forward pass recomputes. 160 tokens hold any of the tiny model's tool calls."""


@pytest.fixture(scope="module")
def demo_task(tmp_path_factory: pytest.TempPathFactory) -> Task:
    (task_dir,) = generate_demo_tasks(tmp_path_factory.mktemp("tasks"), 1, seed=11)
    return load_task(task_dir)


def turn_requests(trajectory: Trajectory) -> list[list[dict[str, Any]]]:
    """The messages each turn's request carried: the history before the turn's first step."""
    requests, history = [], History(trajectory.instruction)
    for step in trajectory.steps:
        if isinstance(step.record, ChatRecord):
            requests.append(history_messages(history, system_prompt=SYSTEM_PROMPT))
        history = history.append(
            step.action, step.observation, call_id=step.call_id, reply_message=step.reply_message
        )
    return requests


def roll_out_and_store(
    policy: Policy, task: Task, store_root: Path
) -> tuple[Trajectory, list[Any]]:
    with open_sandbox(task.snapshot_dir, limits=task.limits) as sandbox:
        trajectory = run_episode(
            task,
            policy,
            sandbox,
            key=EpisodeKey("tito", 0),
            config=EpisodeConfig(max_steps=4, max_format_errors=3),
        )
    store = TrajectoryStore(store_root)
    store.commit_iteration_shard(
        "tito",
        0,
        0,
        episodes=[trajectory.to_episode_record()],
        steps=trajectory.to_step_records(),
    )
    rows = store.query(
        "SELECT step, turn, prompt_token_ids, token_ids, logprobs FROM steps WHERE episode_id = ?",
        [trajectory.episode_id],
    ).to_pylist()
    return trajectory, rows


def check_token_in_token_out(trajectory: Trajectory, rows: list[Any], model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    turns = stored_turns(rows)
    assert len(turns) >= 2, f"{trajectory.status}: {trajectory.error}"
    assert turns == trajectory_turns(trajectory)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)

    # Each turn's prompt ids decode to its request's conversation, rendered by the template.
    for messages, turn in zip(turn_requests(trajectory), turns, strict=True):
        rendered = tokenizer.apply_chat_template(
            messages, tools=list(TOOL_SCHEMAS), add_generation_prompt=True, tokenize=False
        )
        decoded = tokenizer.decode(turn.prompt_token_ids, clean_up_tokenization_spaces=False)
        assert decoded == rendered

    # Each turn's completion ids decode to the reply whose tool calls became its actions.
    for step in trajectory.steps:
        if not isinstance(step.record, ChatRecord):
            continue
        text = tokenizer.decode(step.record.completion_token_ids, skip_special_tokens=True)
        _, calls, malformed = parse_tool_calls(text)
        actions = [s.action for s in trajectory.steps if s.turn == step.turn]
        if not calls or malformed:  # read as a reply without a tool call
            assert len(actions) == 1 and isinstance(actions[0], InvalidCall)
            continue
        assert len(actions) <= len(calls)  # calls past the step budget are not carried out
        for call, action in zip(calls, actions, strict=False):
            if isinstance(action, InvalidCall):
                assert (action.name, action.arguments) == (call.name, call.arguments)
            else:
                assert call.name == action.tool
                # The tool's own arguments, as sent; an argument the tool does not take is
                # left out (`action_from_tool_call` reads only the fields it needs).
                sent = json.loads(call.arguments)
                assert action_arguments(action) == {k: sent[k] for k in action_arguments(action)}

    # The trainer's input, from the store alone, is the sampled ids: the model's forward pass
    # over it gives back the sampler's logprob at every sampled position (temperature 1).
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    sampled = 0
    for sequence in training_sequences(turns):
        ids = torch.tensor([sequence.input_ids])
        with torch.no_grad():
            log_probs = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
        for position, trained in enumerate(sequence.loss_mask):
            if trained:
                recomputed = log_probs[position - 1, sequence.input_ids[position]].item()
                assert recomputed == pytest.approx(sequence.sampler_logprobs[position], abs=1e-4)
                sampled += 1
    assert sampled == sum(len(t.completion_token_ids) for t in turns)


@pytest.mark.slow  # a multi-turn episode of the tiny model plus its verification: minutes on 2 cores
def test_a_served_models_episode_stores_the_sampled_ids(
    lm_server: Any, demo_task: Task, tmp_path: Path
) -> None:
    policy = policy_from_spec(f"openai:{lm_server.base_url}#{lm_server.model}", sampling=SAMPLING)
    trajectory, rows = roll_out_and_store(policy, demo_task, tmp_path / "store")
    assert trajectory.policy is not None and trajectory.policy.model == lm_server.model
    check_token_in_token_out(trajectory, rows, lm_server.model_dir)


@pytest.mark.slow  # as above, generated in this process
def test_an_in_process_models_episode_stores_the_sampled_ids(
    tiny_model_dir: Path, demo_task: Task, tmp_path: Path
) -> None:
    policy = policy_from_spec(f"hf:{tiny_model_dir}", sampling=SAMPLING)
    assert isinstance(policy, HFPolicy)
    trajectory, rows = roll_out_and_store(policy, demo_task, tmp_path / "store")
    assert trajectory.policy is not None and trajectory.policy.kind == "hf"
    assert trajectory.policy_version.startswith(f"hf:{tiny_model_dir.name}@")
    check_token_in_token_out(trajectory, rows, tiny_model_dir)
