"""The `sft` flow: the supervised warm start before RL. Reference solutions are replayed as tool
calls in sandboxes on Dask (one Prefect task per shard of tasks), the verified transcripts fine-tune
the model, and the result is written as a Hugging Face directory (`hf:OUT`)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from training.errors import TrainingSettingsError
from training.iteration import task_dirs_in
from training.lm.sft import (
    ChangeStyle,
    SFTResult,
    SFTSettings,
    check_change_styles,
    finish_sft,
    reference_transcripts,
)
from training.lm.spec import check_model_dir, parse_policy_spec
from training.lm.tiny import Transcript


@dataclasses.dataclass(frozen=True, slots=True)
class SFTParams:
    """Parameters of one warm start (the CLI fills these)."""

    tasks_dir: str
    policy: str
    """`hf:DIR`: the model to start from."""
    out: str
    """The fine-tuned model's directory (must not exist, or be empty)."""
    settings: SFTSettings = dataclasses.field(default_factory=SFTSettings)
    run_tests: bool = True
    """Transcripts run the task's tests before submitting."""
    change_styles: tuple[ChangeStyle, ...] = ("edit",)
    """How transcripts change existing files; two styles: a transcript of each per task."""
    shards: int = 2
    """Prefect tasks the replays are spread over."""

    def model_dir(self) -> str:
        spec = parse_policy_spec(self.policy)
        if spec.kind != "hf" or spec.model_dir is None:
            raise TrainingSettingsError(
                f"sft fine-tunes a local model: give --policy hf:DIR, not {self.policy}"
            )
        return spec.model_dir


@task(name="replay_references", cache_policy=NO_CACHE)
def replay_references(
    task_dirs: list[Path], run_tests: bool, styles: tuple[ChangeStyle, ...]
) -> tuple[list[Transcript], list[str]]:
    return reference_transcripts(task_dirs, run_tests=run_tests, styles=styles)


@task(name="fine_tune", cache_policy=NO_CACHE)
def fine_tune(
    params: SFTParams, transcripts: list[Transcript], skipped: list[str], tasks: int
) -> SFTResult:
    return finish_sft(
        params.model_dir(), params.out, params.settings, transcripts, skipped, tasks=tasks
    )


@flow(name="sft", log_prints=False)
def sft(params: SFTParams) -> SFTResult:
    logger = get_run_logger()
    check_model_dir(params.model_dir())
    styles = check_change_styles(params.change_styles)
    out = Path(params.out)
    if out.exists() and any(out.iterdir()):
        raise TrainingSettingsError(f"{out} exists and is not empty; give a new --out directory")
    task_dirs = task_dirs_in(params.tasks_dir)
    shards = [task_dirs[i :: params.shards] for i in range(min(params.shards, len(task_dirs)))]
    futures = [replay_references.submit(shard, params.run_tests, styles) for shard in shards]
    transcripts: list[Transcript] = []
    skipped: list[str] = []
    for future in futures:
        kept, left_out = future.result()
        transcripts += kept
        skipped += left_out
    for reason in skipped:
        logger.warning("reference replay left out: %s", reason)
    result = fine_tune(params, transcripts, skipped, len(task_dirs))
    logger.info(
        "fine-tuned on %d transcripts (%d steps, loss %.3f -> %.3f) into %s",
        result.transcripts,
        result.steps,
        result.first_loss,
        result.last_loss,
        result.out_dir,
    )
    return result


def run_sft_flow(
    params: SFTParams,
    *,
    store: str = ".rollyard",
    workers: int = 2,
    dask_address: str | None = None,
) -> SFTResult:
    """Run the flow on embedded defaults (a local Prefect API under `store` unless
    `PREFECT_API_URL` is set; a Dask LocalCluster of `workers` unless `dask_address`)."""
    from flows.runtime import dask_task_runner, prefect_api, prefect_home_for

    runner = dask_task_runner(workers, dask_address)
    with prefect_api(prefect_home_for(store)):
        return sft.with_options(task_runner=runner)(params)
