"""Prefect global concurrency limits that bound what rollyard runs at once: training runs per
store and sandboxes per host. They live on the Prefect server, so a user sees and changes them
where Prefect users do (the UI's Concurrency page, `prefect gcl update NAME --limit N`).

rollyard creates a limit with its default the first time it needs it and never overwrites one
that exists: a limit changed by hand stays as the user set it.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import socket
from collections.abc import Callable, Iterator
from pathlib import Path

TRAINING_RUNS_PER_STORE = 2
"""Default of the per-store limit on training runs. A store has one writer at a time (its lease,
`storage.lease`, refuses a second); the second slot lets a run resumed after its predecessor was
killed start at once, while the dead run's slot waits out its lease (`SLOT_LEASE_S`)."""
SLOT_LEASE_S = 60.0
"""How long a slot outlives a holder that died without releasing it (Prefect renews the lease
while the holder lives; 60 s is the server's minimum)."""
SANDBOXES_PER_CORE = 4
"""Default sandboxes per core of a host: a sandbox mostly waits on its commands or a model
server, so a core carries a few; the limit bounds their memory and processes."""

QUICK_ACQUIRE_S = 2.0
"""How long a run tries for a free slot before it says that it waits."""


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9-]+", "-", text.lower()).strip("-")


def training_runs_limit_name(store: str) -> str:
    """`rollyard-training-runs-<store dir>-<hash>`: one limit per store, readable in the UI
    (the hash keeps two stores of the same folder name apart)."""
    local = "://" not in store or store.startswith("file://")
    where = str(Path(store.removeprefix("file://")).absolute()) if local else store
    digest = hashlib.sha256(where.encode()).hexdigest()[:8]
    return f"rollyard-training-runs-{_slug(Path(where).name)[:40]}-{digest}"


def sandboxes_limit_name(host: str | None = None) -> str:
    """`rollyard-sandboxes-<host>`: one limit per host, shared by every run on it."""
    return f"rollyard-sandboxes-{_slug(host or socket.gethostname())[:60]}"


def ensure_limit(name: str, default_limit: int) -> int:
    """Create the global concurrency limit `name` with `default_limit` slots unless it exists;
    returns the slots it has (what a user set wins)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            return int(client.read_global_concurrency_limit_by_name(name).limit)
        except ObjectNotFound:
            pass
        # Two runs may create it at once; the loser reads what the winner made.
        with contextlib.suppress(ObjectAlreadyExists):
            client.create_global_concurrency_limit(
                GlobalConcurrencyLimitCreate(name=name, limit=default_limit)
            )
        return int(client.read_global_concurrency_limit_by_name(name).limit)


@contextlib.contextmanager
def training_run_slot(
    store: str,
    default_limit: int = TRAINING_RUNS_PER_STORE,
    *,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[str]:
    """Hold one of the store's training-run slots for the block, waiting while all are taken
    (`on_wait(name)` is told once when it has to wait); yields the limit's name."""
    from prefect.concurrency.sync import concurrency

    name = training_runs_limit_name(store)
    ensure_limit(name, default_limit)
    with contextlib.ExitStack() as held:
        try:
            held.enter_context(
                concurrency(
                    name,
                    occupy=1,
                    strict=True,
                    timeout_seconds=QUICK_ACQUIRE_S,
                    lease_duration=SLOT_LEASE_S,
                )
            )
        except TimeoutError:
            if on_wait is not None:
                on_wait(name)
            held.enter_context(
                concurrency(name, occupy=1, strict=True, lease_duration=SLOT_LEASE_S)
            )
        yield name


@contextlib.contextmanager
def sandbox_slots(count: int) -> Iterator[int]:
    """Hold `count` of this host's sandbox slots for the block (at most the limit, so a shard
    wider than the limit still runs); yields the slots held."""
    from prefect.concurrency.sync import concurrency

    name = sandboxes_limit_name()
    limit = ensure_limit(name, SANDBOXES_PER_CORE * (os.cpu_count() or 1))
    held = max(1, min(count, limit))
    with concurrency(name, occupy=held, strict=True, lease_duration=SLOT_LEASE_S):
        yield held
