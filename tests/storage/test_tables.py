"""The smaller tables: quarantine through gates, metrics and task catalog appends, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
from shard_data import make_shard

from storage import (
    CheckpointNotFoundError,
    CorruptFileError,
    GateResult,
    TrajectoryStore,
)


def store_with_iterations(root: Path, iterations: int = 3) -> TrajectoryStore:
    store = TrajectoryStore(root)
    for iteration in range(iterations):
        for shard in range(2):
            episodes, steps = make_shard("run", iteration, shard)
            store.commit_iteration_shard("run", iteration, shard, episodes=episodes, steps=steps)
    return store


def test_quarantined_iteration_is_kept_but_not_trained_on(tmp_path: Path) -> None:
    store = store_with_iterations(tmp_path)
    results = [
        GateResult("reward_in_bounds", True, observed="0..1"),
        GateResult("hack_flag_rate_below_5pct", False, observed="0.31"),
    ]
    assert store.gates.record("run", 1, "batch", results, quarantined=True, reason="hack flags")
    # Replaying the same evaluation writes nothing.
    assert not store.gates.record("run", 1, "batch", results, quarantined=True, reason="x")

    status = store.gates.iteration_status("run", 1)
    assert status.quarantined and status.reasons == ("batch: hack flags",)
    assert not store.gates.iteration_status("run", 0).quarantined
    assert store.read_episodes("run", 1).num_rows == 0
    assert store.read_episodes("run", 1, include_quarantined=True).num_rows == 8
    assert store.read_episodes("run").num_rows == 16
    assert store.gates.quarantined_iterations() == [("run", 1)]
    with store.connect() as con:
        assert con.sql("SELECT count(*) FROM training_episodes").fetchall() == [(16,)]
        rows = con.sql(
            "SELECT iteration, quarantined FROM iteration_status ORDER BY iteration"
        ).fetchall()
        assert rows == [(0, False), (1, True), (2, False)]
        assert con.sql("SELECT count(*) FROM gates WHERE kind = 'expectation'").fetchall() == [(2,)]

    # A later evaluation lifts it.
    assert store.gates.mark_quarantined(
        "run", 1, reason="verifier fixed", quarantined=False, suite="batch", evaluation=1
    )
    assert not store.gates.iteration_status("run", 1).quarantined
    assert store.read_episodes("run", 1).num_rows == 8


def test_metrics_and_tasks_append_once(tmp_path: Path) -> None:
    store = store_with_iterations(tmp_path, iterations=1)
    assert store.metrics.record("run", 0, {"loss": 0.5, "kl": 0.01})
    assert not store.metrics.record("run", 0, {"loss": 9.0})
    assert store.metrics.record("run", 0, {"episodes_per_s": 3.0}, source="rollout")
    tasks = [
        {"task_id": f"task-{i}", "task_version": "v1", "difficulty": d, "status": "accepted"}
        for i, d in enumerate(["easy", "hard", "hard"])
    ]
    assert store.tasks.record(tasks, batch_id="catalog-1")
    assert not store.tasks.record(tasks, batch_id="catalog-1")
    metrics = store.query("SELECT source, name, value FROM metrics ORDER BY source, name")
    assert metrics.to_pylist() == [
        {"source": "rollout", "name": "episodes_per_s", "value": 3.0},
        {"source": "trainer", "name": "kl", "value": 0.01},
        {"source": "trainer", "name": "loss", "value": 0.5},
    ]
    by_difficulty = {r["difficulty"]: r for r in store.named("pass_rate_by_difficulty").to_pylist()}
    assert set(by_difficulty) == {"easy", "hard"}
    assert by_difficulty["hard"]["tasks"] == 2


def test_checkpoint_round_trip_lineage_and_errors(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    store = store_with_iterations(tmp_path)
    weights = {"layer.weight": torch.arange(6.0).reshape(2, 3), "layer.bias": torch.zeros(2)}
    info = store.checkpoints.save(
        "run",
        "p1",
        weights,
        iteration=1,
        trained_on_iterations=[0, 1],
        n_episodes=16,
        metadata={"lr": 0.001},
    )
    assert info.sha256 and info.size_bytes > 0 and info.metadata == {"lr": 0.001}
    again = store.checkpoints.save("run", "p1", {"other": torch.ones(1)}, iteration=1)
    assert again == info
    loaded, loaded_info = store.checkpoints.load("run", "p1")
    assert loaded_info == info
    assert set(loaded) == set(weights)
    assert all(torch.equal(loaded[k], weights[k]) for k in weights)

    lineage = store.named("lineage").to_pylist()
    assert {r["task_id"] for r in lineage} == {"task-0", "task-1", "task-2"}
    assert all(r["policy_version"] == "p1" and set(r["iterations"]) <= {0, 1} for r in lineage)
    assert sum(r["episodes"] for r in lineage) == 16

    with pytest.raises(CheckpointNotFoundError, match=r"'p9'.*p1"):
        store.checkpoints.load("run", "p9")
    Path(tmp_path, info.blob_path).write_bytes(b"tampered")
    with pytest.raises(CorruptFileError, match=info.sha256[:16]):
        store.checkpoints.load("run", "p1")
