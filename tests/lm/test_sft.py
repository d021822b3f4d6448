"""The supervised warm start: reference solutions as tool calls, replayed and verified in a
sandbox, and the `sft` flow end to end on a few tasks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tasks_lib import load_task
from tasks_lib.sources.families.settings import generate_settings_tasks, plan_settings_task
from tasks_lib.sources.families.settings.generate import plan_flags_task, write_settings_task
from training.actions import EditFile, ReadFile, RunCommand, Submit
from training.errors import TrainingSettingsError
from training.lm.sft import (
    SFTSettings,
    check_change_styles,
    edit_actions,
    reference_actions,
    reference_transcripts,
)
from training.lm.tiny import TinyModelSize, build_tiny_model

REPO_ROOT = Path(__file__).resolve().parents[2]


def apply(text: str, actions: list[EditFile]) -> str:
    for action in actions:
        assert text.count(action.old_text) == 1, action
        text = text.replace(action.old_text, action.new_text)
    return text


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.sampled_from([f"line {i}\n" for i in range(12)]), min_size=1, max_size=10, unique=True
    ),
    st.lists(
        st.sampled_from([f"line {i}\n" for i in range(20)]), min_size=0, max_size=10, unique=True
    ),
)
def test_edit_actions_turn_the_old_text_into_the_new(old: list[str], new: list[str]) -> None:
    edits = edit_actions("f.py", "".join(old), "".join(new))
    assert all(isinstance(e, EditFile) and e.path == "f.py" for e in edits)
    assert apply("".join(old), edits) == "".join(new)  # type: ignore[arg-type]


def test_an_edit_grows_until_its_text_is_unique() -> None:
    old = "x = 1\ny = 2\nx = 1\nz = 3\n"
    (edit,) = edit_actions("f.py", old, "x = 1\ny = 2\nx = 1\nz = 4\n")
    assert isinstance(edit, EditFile) and edit.old_text == "z = 3\n"
    (edit,) = edit_actions("f.py", old, "x = 1\ny = 2\nx = 5\nz = 3\n")
    assert isinstance(edit, EditFile) and old.count(edit.old_text) == 1
    assert apply(old, [edit]) == "x = 1\ny = 2\nx = 5\nz = 3\n"


def test_a_rewrite_writes_the_whole_new_file_through_the_shell(tmp_path: Path) -> None:
    plan = plan_flags_task(0, 7)
    task = load_task(write_settings_task(plan, tmp_path / "task"))
    path = "app/settings.py"
    old = (task.snapshot_dir / path).read_text()
    new = old.replace(f"{plan.target} = {plan.wrong_value}", f"{plan.target} = {plan.right_value}")
    read, rewrite, submit = reference_actions(
        task, {path: new.encode()}, (), run_tests=False, style="rewrite"
    )
    assert read == ReadFile(path) and submit == Submit() and isinstance(rewrite, RunCommand)
    workspace = tmp_path / "workspace"
    (workspace / "app").mkdir(parents=True)
    (workspace / path).write_text(old)
    subprocess.run(["/bin/sh", "-c", rewrite.command], cwd=workspace, check=True)
    assert (workspace / path).read_text() == new
    edit_style = reference_actions(task, {path: new.encode()}, (), run_tests=False)
    assert [type(a) for a in edit_style] == [ReadFile, EditFile, Submit]


@pytest.mark.parametrize("bad", [(), ("edit", "edit"), ("patch",), ("edit", "sed")])
def test_change_styles_must_be_known_and_distinct(bad: tuple[str, ...]) -> None:
    with pytest.raises(TrainingSettingsError, match="change styles must be one or more of"):
        check_change_styles(bad)


def test_both_styles_give_a_verified_transcript_of_each_per_task(tmp_path: Path) -> None:
    task_dir = write_settings_task(plan_flags_task(0, 3), tmp_path / "tasks" / "flags-3")
    transcripts, skipped = reference_transcripts(
        [task_dir], run_tests=False, styles=("edit", "rewrite")
    )
    assert skipped == [] and len(transcripts) == 2
    calls = [
        [m["tool_calls"][0]["function"]["name"] for m in t.messages if m["role"] == "assistant"]
        for t in transcripts
    ]
    assert calls == [["read_file", "edit_file", "submit"], ["read_file", "run_command", "submit"]]


@pytest.mark.parametrize(
    "bad",
    [
        {"context_first_steps": 4},
        {"context_first_learning_rate": 0.0},
        {"context_first_learning_rate": -1e-3},
        {"learning_rate": 0.0},
        {"threads": 0},
    ],
)
def test_sft_settings_refuse_a_phase_that_cannot_run(bad: dict[str, float]) -> None:
    with pytest.raises(TrainingSettingsError):
        SFTSettings(steps=4, batch_size=2, **bad)  # type: ignore[arg-type]


@pytest.mark.slow  # two replays and their verifications in bwrap: ~1 min on 2 busy cores
def test_reference_replays_are_verified_transcripts_with_real_observations(tmp_path: Path) -> None:
    task_dirs = generate_settings_tasks(tmp_path / "tasks", 2, seed=3)
    transcripts, skipped = reference_transcripts(task_dirs, run_tests=True)
    assert skipped == [] and len(transcripts) == 2
    plan = plan_settings_task(3, 0)
    messages = transcripts[0].messages
    assert (
        messages[0]["role"] == "system"
        and messages[1]["content"] == load_task(task_dirs[0]).instruction
    )
    calls = [m["tool_calls"][0]["function"] for m in messages if m["role"] == "assistant"]
    assert [c["name"] for c in calls] == ["read_file", "edit_file", "run_command", "submit"]
    edit = json.loads(calls[1]["arguments"])
    assert edit["new_text"] == f"{plan.target} = {plan.right_value}\n"
    observations = [m["content"] for m in messages if m["role"] == "tool"]
    # Real observations: the file as the sandbox held it, the edit's answer, pytest's run.
    assert f"{plan.target} = {plan.wrong_value}" in observations[0]
    assert observations[1].startswith("edited ")
    assert "passed" in observations[2] and "[exit code 0]" in observations[2]


@pytest.mark.slow  # a Prefect server, a Dask cluster, replays and a fine-tune: minutes
def test_the_sft_command_writes_a_model_the_hf_policy_loads(tmp_path: Path) -> None:
    task_dirs = generate_settings_tasks(tmp_path / "tasks", 3, seed=4)
    size = TinyModelSize(
        hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
        num_key_value_heads=1,
    )  # fmt: skip
    base = build_tiny_model(tmp_path / "base", seed=0, size=size)
    out = tmp_path / "sft"
    finished = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "sft",
            "--tasks",
            str(task_dirs[0].parent),
            "--policy",
            f"hf:{base}",
            "--out",
            str(out),
            "--steps",
            "4",
            "--context-first-steps",
            "2",
            "--context-first-learning-rate",
            "3e-3",
            "--no-test-run",
            "--file-changes",
            "both",
            "--store",
            str(tmp_path / "store"),
            "--workers",
            "1",
        ],
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert finished.returncode == 0, finished.stderr[-2000:]
    result = json.loads(finished.stdout.strip().splitlines()[-1])
    # --file-changes both: an edit_file and a rewrite transcript of each task.
    assert result["transcripts"] == 6 and result["steps"] == 4 and result["skipped"] == []
    from training.lm.hf_policy import HFPolicy

    assert HFPolicy(out).version != HFPolicy(base).version  # fine-tuned weights, loadable

    refused = subprocess.run(
        [
            sys.executable,
            "-m",
            "flows.cli",
            "sft",
            "--tasks",
            str(task_dirs[0].parent),
            "--policy",
            "builtin",
            "--out",
            str(tmp_path / "x"),
        ],
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        check=False,
    )
    assert refused.returncode == 2 and "hf:DIR" in refused.stderr
    assert not (tmp_path / "x").exists()

    all_context_first = subprocess.run(
        [
            sys.executable, "-m", "flows.cli", "sft", "--tasks", str(task_dirs[0].parent),
            "--policy", f"hf:{base}", "--out", str(tmp_path / "y"), "--steps", "4",
            "--context-first-steps", "4",
        ],
        env=dict(os.environ, PYTHONPATH=str(REPO_ROOT)),
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip
    assert all_context_first.returncode == 2
    assert "context_first_steps must be at least 0 and fewer than its steps (4)" in (
        all_context_first.stderr
    )
    assert not (tmp_path / "y").exists()
