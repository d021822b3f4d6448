"""Supervised warm start: chat transcripts from tasks' reference solutions, and a fine-tune on them.

A task's reference solution (`solution/solve.sh`, run by `tasks_lib.verify.oracle`) becomes the
tool calls an agent would make: read each changed file and change it, write new files and remove
deleted ones with `run_command`, run the task's tests, submit. A file that exists is changed in
one of two styles: `edit` replaces each changed block with `edit_file` (the smallest block of
whole lines that occurs once), `rewrite` writes the whole new file with `run_command`. A corpus
may hold each task in both, as demonstrations gathered from several agents do.

Those calls are replayed through a sandbox by the ordinary episode runner, so every observation
is the real one, and the verifier scores the replay: only transcripts whose replay scores 1 are
kept. The model is then fine-tuned on the assistant turns of the kept transcripts
(`training.lm.tiny.fine_tune_on_transcripts`) and written as a Hugging Face directory — the usual
pipeline is this, then RL (`hf:OUT`).
"""

from __future__ import annotations

import dataclasses
import difflib
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, get_args

from sandboxes import Limits, SandboxPool
from tasks_lib.format.loader import load_task
from tasks_lib.format.model import Task
from training.actions import (
    Action,
    EditFile,
    ReadFile,
    RunCommand,
    Submit,
    history_messages,
)
from training.episode import EpisodeConfig
from training.errors import TrainingSettingsError
from training.lm.conversation import SYSTEM_PROMPT, TOOL_SCHEMAS
from training.lm.tiny import Transcript, fine_tune_on_transcripts
from training.lm.weights import write_atomically
from training.policy import ScriptedPolicy
from training.recovery import RecoveryPolicy, run_episode_with_recovery
from training.trajectory import EpisodeKey, Trajectory

ChangeStyle = Literal["edit", "rewrite"]
"""How a reference transcript changes a file that exists: `edit_file` calls on the changed
blocks, or the whole new file written through `run_command`."""
CHANGE_STYLES: tuple[ChangeStyle, ...] = get_args(ChangeStyle)


def check_change_styles(styles: Sequence[str]) -> tuple[ChangeStyle, ...]:
    """`styles` as a tuple of known styles, each once; a clear error otherwise."""
    unknown = [s for s in styles if s not in CHANGE_STYLES]
    if unknown or not styles or len(set(styles)) != len(styles):
        raise TrainingSettingsError(
            f"change styles must be one or more of {', '.join(CHANGE_STYLES)}, each once; "
            f"got {list(styles)}"
        )
    return tuple(styles)  # type: ignore[arg-type]


@dataclasses.dataclass(frozen=True, slots=True)
class SFTSettings:
    """How long and how fast the supervised fine-tune runs."""

    steps: int = 200
    """Optimizer steps (each on `batch_size` transcripts drawn from the kept ones)."""
    batch_size: int = 4
    learning_rate: float = 1e-3
    seed: int = 0
    context_first_steps: int = 0
    """Of `steps`, how many first train only the reply tokens read from the prompt or the tool
    results (`training.lm.tiny.context_dependent_tokens`): for a model with no pretraining."""
    context_first_learning_rate: float | None = None
    """The peak learning rate of those first steps; None: `learning_rate`."""
    threads: int | None = None
    """torch's threads for the fine-tune; None: torch's own count. A fixed count makes a run
    repeat bit for bit on any machine (thread counts change the order of floating-point sums,
    and a tiny model's context-first phase leaves its plateau or not on details as small as the
    order of its transcripts)."""

    def __post_init__(self) -> None:
        first_rate = self.context_first_learning_rate
        if (
            self.steps < 1
            or self.batch_size < 1
            or not self.learning_rate > 0
            or not (first_rate is None or first_rate > 0)
            or not (self.threads is None or self.threads >= 1)
        ):
            raise TrainingSettingsError(
                f"sft needs steps >= 1, batch_size >= 1, learning rates > 0 and threads >= 1; "
                f"got {self}"
            )
        if not 0 <= self.context_first_steps < self.steps:
            raise TrainingSettingsError(
                f"sft's context_first_steps must be at least 0 and fewer than its steps "
                f"({self.steps}); got {self.context_first_steps}"
            )


@dataclasses.dataclass(frozen=True, slots=True)
class SFTResult:
    """What `run_sft` did."""

    out_dir: str
    tasks: int
    transcripts: int
    """Replays that scored 1 (the fine-tune's data)."""
    skipped: tuple[str, ...]
    """`task id: why` for every task whose replay could not be used."""
    steps: int
    first_loss: float
    last_loss: float
    assistant_tokens: int
    """Tokens trained on per pass over the transcripts."""


def _unique_block(text: str, start: int, end: int) -> tuple[int, int]:
    """Grow the line range [start, end) of `text`'s lines (by one line each side, in turn)
    until its text occurs once in `text`."""
    lines = text.splitlines(keepends=True)
    while True:
        block = "".join(lines[start:end])
        if block and text.count(block) == 1:
            return start, end
        if start == 0 and end >= len(lines):
            return 0, len(lines)
        start, end = max(0, start - 1), min(len(lines), end + 1)


def edit_actions(path: str, old: str, new: str) -> list[Action]:
    """`edit_file` calls turning `old` into `new`, one per changed block, last block first. Each
    edit's text is made unique in the file as it is when that edit applies (after the edits
    below it), since an edit below can write a copy of a line the next edit replaces."""
    current = old.splitlines(keepends=True)
    new_lines = new.splitlines(keepends=True)
    matcher = difflib.SequenceMatcher(a=current[:], b=new_lines, autojunk=False)
    edits: list[Action] = []
    # Last block first: the lines above a block are still the original's when it applies.
    for tag, a_start, a_end, b_start, b_end in reversed(matcher.get_opcodes()):
        if tag == "equal":
            continue
        start, end = _unique_block("".join(current), a_start, max(a_end, a_start + 1))
        replacement = current[start:a_start] + new_lines[b_start:b_end] + current[a_end:end]
        edits.append(EditFile(path, "".join(current[start:end]), "".join(replacement)))
        current[start:end] = replacement
    return edits


def write_command(path: str, text: str, *, make_parent: bool) -> RunCommand:
    """A shell command writing `text` as the whole of `path` (`make_parent`: its directory made
    first, for a new file)."""
    quoted = shlex.quote(path)
    write = f"cat > {quoted} <<'ROLLYARD_EOF'\n{text}ROLLYARD_EOF"
    return RunCommand(f'mkdir -p "$(dirname {quoted})" && {write}' if make_parent else write)


def reference_actions(
    task: Task,
    files: dict[str, bytes],
    deleted: Sequence[str],
    *,
    run_tests: bool = True,
    style: ChangeStyle = "edit",
) -> list[Action]:
    """The tool calls that make the solution's changes (`files`: path -> new bytes) in `style`,
    then run the tests (`run_tests`) and submit."""
    actions: list[Action] = []
    for path in sorted(files):
        new = files[path].decode("utf-8")
        original = task.snapshot_dir / path
        if not original.is_file():
            actions.append(write_command(path, new, make_parent=True))
            continue
        actions.append(ReadFile(path))
        if style == "edit":
            actions += edit_actions(path, original.read_text("utf-8"), new)
        else:
            actions.append(write_command(path, new, make_parent=False))
    actions += [RunCommand(f"rm -f {shlex.quote(path)}") for path in sorted(deleted)]
    if run_tests and task.test_command:
        actions.append(RunCommand(task.test_command))
    actions.append(Submit())
    return actions


def replay_reference(
    task: Task,
    pool: SandboxPool,
    *,
    key: EpisodeKey,
    run_tests: bool = True,
    style: ChangeStyle = "edit",
) -> Trajectory:
    """The reference solution replayed as tool calls through a sandbox and verified."""
    from tasks_lib.verify.oracle import solution_changes

    changes = solution_changes(task)
    actions = reference_actions(
        task, dict(changes.files), tuple(changes.deleted), run_tests=run_tests, style=style
    )
    policy = ScriptedPolicy(actions, version=f"reference:{task.id}")
    return run_episode_with_recovery(
        task,
        policy,
        pool,
        key=key,
        config=EpisodeConfig(max_steps=len(actions)),
        recovery=RecoveryPolicy(),
    )


def transcript_of(trajectory: Trajectory) -> Transcript:
    """The replay as the chat a language-model policy would have had (same system prompt, same
    tools, same message rendering as `training.lm.conversation`)."""
    messages = history_messages(trajectory.history(), system_prompt=SYSTEM_PROMPT)
    return Transcript(tuple(messages), tuple(TOOL_SCHEMAS))


def reference_transcripts(
    task_dirs: Sequence[str | Path],
    *,
    run_tests: bool = True,
    run_id: str = "sft",
    styles: Sequence[ChangeStyle] = ("edit",),
) -> tuple[list[Transcript], list[str]]:
    """Transcripts of the tasks' verified replays, one per task and change style, and
    `task id (style): why` for those left out. `run_tests` puts a run of the task's tests before
    the submit (the agent checks its work; off, episodes are shorter)."""
    styles = check_change_styles(styles)
    transcripts: list[Transcript] = []
    skipped: list[str] = []
    with SandboxPool(limits=Limits(), max_idle_per_snapshot=1) as pool:
        for index, task_dir in enumerate(sorted(Path(d) for d in task_dirs)):
            task = load_task(task_dir)
            for sample, style in enumerate(styles):
                name = task.id if len(styles) == 1 else f"{task.id} ({style})"
                key = EpisodeKey(run_id, 0, group_index=index, sample_index=sample)
                try:
                    trajectory = replay_reference(
                        task, pool, key=key, run_tests=run_tests, style=style
                    )
                except Exception as error:  # a solution that cannot run is left out, named
                    skipped.append(f"{name}: {type(error).__name__}: {error}"[:300])
                    continue
                if trajectory.reward != 1.0:
                    skipped.append(
                        f"{name}: the replay scored {trajectory.reward} ({trajectory.status}: "
                        f"{trajectory.error or 'tests failed'})"[:300]
                    )
                    continue
                transcripts.append(transcript_of(trajectory))
    return transcripts, skipped


def fine_tune(
    model_dir: str | Path,
    transcripts: Sequence[Transcript],
    out_dir: str | Path,
    settings: SFTSettings,
) -> tuple[list[float], int]:
    """Fine-tune the model of `model_dir` on `transcripts` and write it (with its tokenizer) to
    `out_dir`, all at once at the end; returns the step losses and the assistant tokens of one
    pass."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from training.lm.tiny import transcript_token_ids

    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise TrainingSettingsError(f"{out} exists and is not empty; give a new --out directory")
    if not transcripts:
        raise TrainingSettingsError("no reference transcripts to fine-tune on")
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model: Any = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    assistant_tokens = sum(sum(transcript_token_ids(tokenizer, t)[1]) for t in transcripts)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        losses = fine_tune_on_transcripts(
            model,
            tokenizer,
            transcripts,
            steps=settings.steps,
            batch_size=settings.batch_size,
            learning_rate=settings.learning_rate,
            seed=settings.seed,
            threads=settings.threads,
            context_first_steps=settings.context_first_steps,
            context_first_learning_rate=settings.context_first_learning_rate,
        )

    def write(directory: Path) -> None:
        model.save_pretrained(directory)
        tokenizer.save_pretrained(directory)

    write_atomically(out, write)
    return losses, assistant_tokens


def run_sft(
    task_dirs: Sequence[str | Path],
    model_dir: str | Path,
    out_dir: str | Path,
    settings: SFTSettings | None = None,
    *,
    run_tests: bool = True,
) -> SFTResult:
    """Replay the tasks' reference solutions, fine-tune on the verified transcripts, write
    `out_dir` (what `hf:OUT_DIR` acts with). In one process; `flows.sft` spreads the replays
    over Dask."""
    from training.lm.spec import check_model_dir

    settings = settings or SFTSettings()
    check_model_dir(model_dir)
    transcripts, skipped = reference_transcripts(task_dirs, run_tests=run_tests)
    return finish_sft(model_dir, out_dir, settings, transcripts, skipped, tasks=len(task_dirs))


def finish_sft(
    model_dir: str | Path,
    out_dir: str | Path,
    settings: SFTSettings,
    transcripts: Sequence[Transcript],
    skipped: Sequence[str],
    *,
    tasks: int,
) -> SFTResult:
    """Fine-tune on the replays' transcripts and say what was done."""
    if not transcripts:
        raise TrainingSettingsError(
            f"none of the {tasks} tasks' reference solutions replayed to reward 1: "
            + "; ".join(skipped[:3])
        )
    losses, tokens = fine_tune(model_dir, transcripts, out_dir, settings)
    return SFTResult(
        out_dir=str(out_dir),
        tasks=tasks,
        transcripts=len(transcripts),
        skipped=tuple(skipped),
        steps=len(losses),
        first_loss=losses[0] if losses else 0.0,
        last_loss=losses[-1] if losses else 0.0,
        assistant_tokens=tokens,
    )
