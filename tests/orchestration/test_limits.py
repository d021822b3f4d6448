"""Prefect global concurrency limits on a real Prefect server: a store's training runs beyond
its slots wait, a limit a user changed is kept, a shard never asks for more sandbox slots than
its host has."""

from __future__ import annotations

import threading
import time
from pathlib import Path

from flows.limits import (
    ensure_limit,
    sandbox_slots,
    sandboxes_limit_name,
    training_run_slot,
    training_runs_limit_name,
)


def test_a_second_training_run_waits_for_the_stores_only_slot(
    prefect_server: str, tmp_path: Path
) -> None:
    store = str(tmp_path / "store")
    events: list[str] = []
    first_holds = threading.Event()
    release_first = threading.Event()

    def first() -> None:
        with training_run_slot(store, 1):
            events.append("first in")
            first_holds.set()
            release_first.wait(60)
            events.append("first out")

    def second() -> None:
        with training_run_slot(store, 1, on_wait=lambda name: events.append(f"waits on {name}")):
            events.append("second in")

    one = threading.Thread(target=first)
    one.start()
    assert first_holds.wait(60)
    two = threading.Thread(target=second)
    two.start()
    deadline = time.monotonic() + 60
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)  # the second run must still be waiting: nothing else happens
    assert events == ["first in", f"waits on {training_runs_limit_name(store)}"]
    release_first.set()
    one.join(60)
    two.join(60)
    assert events[2:] == ["first out", "second in"]


def test_a_limit_changed_by_the_user_is_kept(prefect_server: str, tmp_path: Path) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitUpdate

    name = training_runs_limit_name(str(tmp_path / "store"))
    assert ensure_limit(name, 2) == 2
    with get_client(sync_client=True) as client:
        client.update_global_concurrency_limit(name, GlobalConcurrencyLimitUpdate(limit=5))
    assert ensure_limit(name, 2) == 5


def test_a_wide_shard_holds_at_most_the_hosts_sandbox_slots(prefect_server: str) -> None:
    limit = ensure_limit(sandboxes_limit_name(), 8)
    with sandbox_slots(10_000) as held:
        assert held == limit


def test_limit_names_tell_stores_apart_and_are_valid_prefect_names(tmp_path: Path) -> None:
    one = training_runs_limit_name(str(tmp_path / "a" / "store"))
    two = training_runs_limit_name(str(tmp_path / "b" / "store"))
    assert one != two and one.startswith("rollyard-training-runs-store-")
    for name in (one, two, sandboxes_limit_name("Host_1.example.org")):
        assert not set(name) & set("/%&><"), name
