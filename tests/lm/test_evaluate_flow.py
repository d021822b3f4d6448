"""Language-model policies through the real flow: `rollyard evaluate` with an `openai:` policy
against the tiny model served over HTTP by `python -m training.lm.server`, and with an `hf:`
policy generating in the Dask workers — Prefect, Dask, bwrap sandboxes and the Delta store all
real (the `hf:` model is the tiny one warm-started on demo tasks' reference solutions, as a
user's model would be before RL). Each evaluation commits every episode exactly once with what acted and every turn's token
ids, runs the quality gate, records pass@k, and exports from the store."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from flows.cli import main
from storage import TrajectoryStore
from tasks_lib import generate_demo_tasks
from training.export import export_store

SAMPLES = 2
GATE_ENV = {
    # One task with two samples of an untrained model: the group's rewards are usually equal,
    # which the default gate quarantines (no GRPO signal). The evaluation reports the gate's
    # verdict either way; here the gate lets the batch through so the export has rows.
    "ROLLYARD_GATE_MAX_ZERO_VARIANCE_GROUP_SHARE": "1.0",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Evaluated:
    store: TrajectoryStore
    run_id: str
    argv: list[str]
    output: str


@pytest.fixture(scope="module")
def eval_tasks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("eval-tasks")
    generate_demo_tasks(root, 1, seed=11)
    return root


def evaluate(
    policy: str,
    run_id: str,
    tasks: Path,
    store: Path,
    dask_address: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Evaluated:
    for name, value in GATE_ENV.items():
        monkeypatch.setenv(name, value)
    argv = [
        "evaluate",
        "--tasks",
        str(tasks),
        "--store",
        str(store),
        "--policy",
        policy,
        "--samples",
        str(SAMPLES),
        "--run-id",
        run_id,
        "--max-steps",
        "4",
        "--shards",
        "1",
        "--max-concurrent-requests",
        str(SAMPLES),
        # a tiny model slips less at a lower temperature; 160 tokens hold any of its tool calls
        "--temperature",
        "0.5",
        "--max-tokens",
        "160",
        "--dask-address",
        dask_address,
    ]
    assert main(argv) == 0, capsys.readouterr().err
    return Evaluated(TrajectoryStore(store), run_id, argv, capsys.readouterr().out)


def table_versions(store: TrajectoryStore) -> dict[str, int]:
    """The Delta version of every table the evaluation writes (a write makes a new one)."""
    return {
        name: DeltaTable(store.table_uri(name)).version()
        for name in ("episodes", "steps", "gates", "metrics")
    }


def check_evaluation(evaluated: Evaluated, *, kind: str, model: str) -> list[dict[str, Any]]:
    store, run_id = evaluated.store, evaluated.run_id
    episodes = store.query(
        "SELECT episode_id, shard, commit_id, policy_kind, policy_model, policy_version, "
        "sampling, status, n_steps FROM episodes WHERE run_id = ?",
        [run_id],
    ).to_pylist()
    # exactly once: every planned episode, each once, one commit per shard
    assert len(episodes) == SAMPLES
    assert len({e["episode_id"] for e in episodes}) == SAMPLES
    assert len({(e["shard"], e["commit_id"]) for e in episodes}) == len(
        {e["shard"] for e in episodes}
    )
    assert {(e["policy_kind"], e["policy_model"]) for e in episodes} == {(kind, model)}
    assert json.loads(episodes[0]["sampling"])["temperature"] == 0.5
    assert "what acted" in evaluated.output and "pass@1" in evaluated.output

    steps = store.query(
        "SELECT episode_id, step, turn, tool_call_id, prompt_token_ids, token_ids, logprobs "
        "FROM steps WHERE run_id = ? ORDER BY episode_id, step",
        [run_id],
    ).to_pylist()
    for episode in episodes:
        rows = [s for s in steps if s["episode_id"] == episode["episode_id"]]
        calls = [s for s in rows if s["tool_call_id"] is not None]
        assert len(calls) >= 2, f"episode {episode['episode_id']} made {len(calls)} tool call(s)"
        # token in / token out: the first row of every turn carries the turn's exact ids
        first_rows = {}
        for s in rows:
            first_rows.setdefault(s["turn"], s)
        for first in first_rows.values():
            assert first["prompt_token_ids"] and first["token_ids"]
            assert len(first["logprobs"]) == len(first["token_ids"])

    verdicts = store.query(
        "SELECT quarantined FROM gate_verdicts WHERE run_id = ?", [run_id]
    ).to_pylist()
    assert len(verdicts) == 1  # the quality gate ran, once
    pass_at_k = [r for r in store.named("pass_at_k").to_pylist() if r["run_id"] == run_id]
    assert {(r["scope"], r["k"]) for r in pass_at_k} >= {("all", 1), ("all", 2), ("family", 1)}
    assert all(r["pass_at_k"] is None or 0.0 <= r["pass_at_k"] <= 1.0 for r in pass_at_k)
    assert any(r["policy_model"] == model for r in store.named("policies").to_pylist())
    return episodes


@pytest.mark.slow  # a served tiny model, bwrap episodes and a gate on two busy cores: minutes
def test_evaluate_an_openai_policy_through_the_real_flow(
    lm_server: Any,
    eval_tasks: Path,
    dask_address: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = f"openai:{lm_server.base_url}#{lm_server.model}"
    evaluated = evaluate(
        policy, "eval-openai", eval_tasks, tmp_path / "store", dask_address, capsys, monkeypatch
    )
    check_evaluation(evaluated, kind="openai", model=lm_server.model)

    # The export reads the committed episodes back from the store: the token ids it carries are
    # the ones stored.
    # Every episode, masked or not: an evaluation of a tiny model may give a group no signal.
    result = export_store(
        evaluated.store, tmp_path / "verl", export_format="verl", include_masked=True
    )
    rows = pq.read_table(result.path).to_pylist()
    assert len(rows) == SAMPLES and rows[0]["data_source"].startswith("rollyard/demo")
    info = rows[0]["extra_info"]
    stored = evaluated.store.query(
        "SELECT token_ids FROM steps WHERE episode_id = ? AND token_ids IS NOT NULL ORDER BY step",
        [info["episode_id"]],
    ).to_pylist()
    assert info["completion_token_ids"] == [r["token_ids"] for r in stored]
    assert info["policy_kind"] == "openai"


@pytest.mark.slow  # the tiny model generating inside a Dask worker, on two busy cores: minutes
def test_evaluate_an_hf_policy_through_the_real_flow_and_again_writes_nothing(
    warm_model_dir: Path,
    eval_tasks: Path,
    dask_address: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    policy = f"hf:{warm_model_dir}"
    store = tmp_path / "store"
    first = evaluate(policy, "eval-hf", eval_tasks, store, dask_address, capsys, monkeypatch)
    episodes = check_evaluation(first, kind="hf", model=warm_model_dir.name)
    assert "rolled out now" in first.output

    # The same evaluation again: the store already holds it, nothing runs, nothing is written.
    versions = table_versions(first.store)
    again = evaluate(policy, "eval-hf", eval_tasks, store, dask_address, capsys, monkeypatch)
    assert "already in the store" in again.output
    assert table_versions(first.store) == versions
    assert check_evaluation(again, kind="hf", model=warm_model_dir.name) == episodes

    # Masked episodes too, as above: two samples of an untrained model usually score alike.
    hf = export_store(
        first.store, tmp_path / "hf", export_format="hf", run_id="eval-hf", include_masked=True
    )
    datasets = pytest.importorskip("datasets")
    dataset = datasets.load_dataset("parquet", data_files=str(hf.path), split="train")
    assert len(dataset) == SAMPLES
    assert all(row["prompt_token_ids"] and row["completion_token_ids"] for row in dataset)
