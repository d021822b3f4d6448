"""Iteration gates with real Great Expectations over a real Delta store: a clean batch passes,
a poisoned one is quarantined (kept, not trained on) with every failed expectation named."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from batches import commit_batch, make_batch

from rollyard.errors import EXIT_USAGE
from rollyard.status import ALL_STATUSES, INFRASTRUCTURE_STATUSES, TRAINABLE_STATUSES
from storage import TrajectoryStore
from storage.errors import GateSettingsError
from storage.gates import GateSettings, gate_iteration


@pytest.fixture()
def store(tmp_path: Path) -> TrajectoryStore:
    return TrajectoryStore(tmp_path / "store")


def _failed(report) -> set[str]:  # type: ignore[no-untyped-def]
    return {r.expectation for r in report.failed}


def test_clean_batch_passes_and_is_recorded(store: TrajectoryStore) -> None:
    rows = make_batch("run", 0)
    commit_batch(store, "run", 0, rows)
    report = gate_iteration(store, "run", 0, expected_episodes=len(rows))
    assert report.passed and not report.quarantined and not report.should_stop
    assert report.failed == () and report.reason is None and report.table_rows() == []
    assert report.n_episodes == len(rows) and report.evaluation == 0
    names = {r.expectation for r in report.results}
    assert {
        "episode_id_unique",
        "reward_in_range",
        "infra_error_rate",
        "hack_flag_rate",
        "zero_variance_group_share",
        "n_steps_p50",
        "n_steps_p99",
        "episodes_as_scheduled",
    } <= names
    assert store.read_episodes("run", 0).num_rows == len(rows)
    with store.connect() as con:
        verdicts = con.sql("SELECT suite, quarantined FROM gate_verdicts").fetchall()
        expectations = con.sql("SELECT count(*) FROM gates WHERE kind = 'expectation'").fetchall()
    assert verdicts == [("iteration", False)]
    assert expectations == [(len(report.results),)]


def test_poisoned_batch_is_quarantined_and_not_trained_on(store: TrajectoryStore) -> None:
    commit_batch(store, "run", 0, make_batch("run", 0))
    assert gate_iteration(store, "run", 0).passed
    rows = make_batch("run", 1, infra_share=0.3, zero_variance=True, hack_share=0.25)
    # Duplicate ids: a shard committed twice under another shard number.
    commit_batch(store, "run", 1, rows + rows[:5], shards=3)

    report = gate_iteration(store, "run", 1, GateSettings(on_failure="stop"))
    assert report.quarantined and report.should_stop
    assert _failed(report) == {
        "episode_id_unique",
        "infra_error_rate",
        "zero_variance_group_share",
        "hack_flag_rate",
    }
    by_name = {r.expectation: r for r in report.failed}
    assert 0.2 < float(by_name["infra_error_rate"].observed or "nan") < 0.4
    assert by_name["zero_variance_group_share"].observed == "1"
    assert "unexpected" in (by_name["episode_id_unique"].observed or "")
    table = report.table_rows()
    assert {row["expectation"] for row in table} == _failed(report)
    assert all(row["observed"] and row["expected"] for row in table)
    # Kept in the store, marked, and left out of what the trainer reads.
    status = store.gates.iteration_status("run", 1)
    assert status.quarantined and "infra_error_rate" in status.reasons[0]
    assert store.read_episodes("run", 1).num_rows == 0
    assert store.read_episodes("run", 1, include_quarantined=True).num_rows == len(rows) + 5
    with store.connect() as con:
        iterations = con.sql("SELECT DISTINCT iteration FROM training_episodes").fetchall()
    assert iterations == [(0,)]


def test_infra_errors_scored_as_zero_and_nan_rewards_fail(store: TrajectoryStore) -> None:
    rows = make_batch("run", 0)
    rows[0].update(status="infra_error", reward=0.0)  # an infra failure stored as reward 0
    rows[1].update(reward=math.nan)
    rows[2].update(reward=None)  # an ok episode without a verdict
    rows[3].update(reward=1.5)
    commit_batch(store, "run", 0, rows)
    report = gate_iteration(store, "run", 0)
    assert _failed(report) == {
        "infra_errors_unscored",
        "reward_not_nan",
        "scored_reward_present",
        "reward_in_range",
    }


def test_reward_drift_against_recent_iterations(store: TrajectoryStore) -> None:
    settings = GateSettings(max_reward_mean_shift=0.2)
    for iteration in range(2):
        commit_batch(
            store,
            "run",
            iteration,
            make_batch("run", iteration, pass_probability=0.2, seed=iteration),
        )
        assert gate_iteration(store, "run", iteration, settings).passed
    commit_batch(store, "run", 2, make_batch("run", 2, pass_probability=0.95))
    report = gate_iteration(store, "run", 2, settings)
    assert _failed(report) == {"reward_drift"}
    assert "reference" in report.thresholds["reward_drift"]


def test_regate_records_a_new_evaluation_that_decides(store: TrajectoryStore) -> None:
    commit_batch(store, "run", 0, make_batch("run", 0, hack_share=0.5))
    first = gate_iteration(store, "run", 0)
    assert first.quarantined and first.evaluation == 0
    second = gate_iteration(store, "run", 0, GateSettings(max_hack_flag_rate=1.0))
    assert second.passed and second.evaluation == 1
    assert not store.gates.iteration_status("run", 0).quarantined
    assert store.read_episodes("run", 0).num_rows > 0


def test_missing_episodes_fail_the_count_checks(store: TrajectoryStore) -> None:
    report = gate_iteration(store, "run", 7, expected_episodes=10)
    assert report.quarantined and _failed(report) == {"episode_count", "episodes_as_scheduled"}


def test_settings_from_environment_and_bad_values(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "ROLLYARD_GATE_MAX_INFRA_ERROR_RATE": "0.1",
        "ROLLYARD_GATE_ON_FAILURE": "stop",
        "ROLLYARD_GATE_BENIGN_FLAGS": "missing_tests, symlink",
        "ROLLYARD_GATE_DRIFT_WINDOW": "5",
    }.items():
        monkeypatch.setenv(name, value)
    settings = GateSettings.from_env(max_hack_flag_rate=0.2)
    assert settings.max_infra_error_rate == 0.1 and settings.on_failure == "stop"
    assert settings.benign_flags == ("missing_tests", "symlink") and settings.drift_window == 5
    assert settings.max_hack_flag_rate == 0.2
    with pytest.raises(GateSettingsError, match="ROLLYARD_GATE_DRIFT_WINDOW = 'x'"):
        GateSettings.from_env({"drift_window": "x"})
    with pytest.raises(GateSettingsError, match="on_failure = 'halt'"):
        GateSettings(on_failure="halt")  # type: ignore[arg-type]
    with pytest.raises(GateSettingsError, match="max_infra_error_rate = 2"):
        GateSettings(max_infra_error_rate=2)
    with pytest.raises(GateSettingsError, match="unknown episode status"):
        GateSettings(infra_statuses=("crashed",))
    with pytest.raises(GateSettingsError, match="unknown gate setting"):
        GateSettings.from_env({}, max_rate=1)


def test_default_status_classes_are_the_one_status_vocabulary() -> None:
    defaults = GateSettings()
    assert set(defaults.trainable_statuses) == TRAINABLE_STATUSES
    assert set(defaults.infra_statuses) == INFRASTRUCTURE_STATUSES
    # Every status is in exactly one class, so none is silently ignored by the reward checks.
    assert sorted(defaults.trainable_statuses + defaults.infra_statuses) == sorted(ALL_STATUSES)
    assert GateSettingsError.exit_code == EXIT_USAGE
