"""How the flows wait on shards running on Dask: never without end on a cluster with no worker,
and with a deadline per running shard whose worker is restarted when it stops answering."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

from prefect import get_run_logger
from prefect.futures import wait as wait_for_futures

from flows.errors import NoWorkersError, ShardDeadlineError

# How often the flow looks at the cluster while it waits for shards.
WORKER_CHECK_INTERVAL_S = 5.0


def dask_worker_count() -> int | None:
    """Workers connected to the Dask scheduler of the running flow's task runner; None outside a
    flow, under another task runner, or when the scheduler does not answer."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    try:
        client = getattr(context.task_runner, "client", None) if context else None
        if client is None:
            return None
        return len(client.scheduler_info(n_workers=-1)["workers"])
    except Exception:  # a runner not started, or a scheduler that went away: nothing to tell
        return None


def completed_while_workers_remain(
    futures: list[Any],
    *,
    no_worker_timeout_s: float,
    check_interval_s: float = WORKER_CHECK_INTERVAL_S,
    worker_count: Callable[[], int | None] = dask_worker_count,
    watch: Callable[[list[Any]], None] | None = None,
) -> Iterator[Any]:
    """Yield `futures` as they finish (within `check_interval_s`), and raise `NoWorkersError`
    once the cluster has had no worker for `no_worker_timeout_s` with some still unfinished.

    A scheduler keeps tasks queued while it has no worker (every worker lost, a cluster scaled
    to zero), so waiting for them alone could last forever. Workers that come back (a nanny's
    restart, an autoscaler) reset the clock; a slow shard on a live worker never trips it.
    `watch` sees the unfinished futures after every wait (the hung-shard deadlines).
    """
    pending = list(futures)
    idle_since: float | None = None
    while pending:
        # Prefect's bounded wait, not `as_completed(timeout=...)`: the latter's timeout also
        # covers the caller's code between two yields.
        done, _ = wait_for_futures(pending, timeout=check_interval_s)
        finished = [future for future in pending if future in done]
        pending = [future for future in pending if future not in done]
        if pending and watch is not None:
            watch(pending)
        if finished:
            idle_since = None
        elif worker_count() == 0:
            now = time.monotonic()
            idle_since = idle_since if idle_since is not None else now
            if now - idle_since >= no_worker_timeout_s:
                raise NoWorkersError(
                    f"the Dask cluster has had no worker for {now - idle_since:.0f} s with "
                    f"{len(pending)} shard(s) still queued; start workers (or check why they "
                    "died: memory, the machine) and rerun with --resume"
                )
        else:
            idle_since = None
        yield from finished


SHARD_START_ALLOWANCE_S = 60.0
"""Added to a shard's deadline for what is not an episode: start, sandbox opens, the commit."""
HUNG_SHARD_RESTARTS = 2
"""Worker restarts one shard may cause before the run fails (the same shard hanging on fresh
workers is the task's or the host's fault, not a worker's)."""


def shard_deadline_s(episodes: int, episode_deadline_s: float) -> float:
    """How long a shard of `episodes` may run on a worker before it counts as hung."""
    return episodes * episode_deadline_s + SHARD_START_ALLOWANCE_S


def _processing_workers(dask_scheduler: Any, keys: list[str]) -> dict[str, str]:
    """Run on the scheduler: the worker each of `keys` is being processed on."""
    found = {}
    for key in keys:
        state = dask_scheduler.tasks.get(key)
        if state is not None and state.processing_on is not None:
            found[key] = state.processing_on.address
    return found


async def _remove_worker(dask_scheduler: Any, address: str) -> str:
    """Run on the scheduler: forget a worker that does not answer; its tasks are rescheduled."""
    return str(await dask_scheduler.remove_worker(address, stimulus_id="rollyard-shard-deadline"))


class HungShardWatch:
    """Deadlines for running shards. A shard's clock starts when the Dask scheduler is first
    seen to have it processing on a worker (looked up at each wait, so a worker that stopped
    answering cannot hide it); past `deadline_s`, that worker is restarted by its nanny (or,
    without one, removed from the scheduler), which puts the shard back in the queue for a live
    worker. The store commits a shard once, so a replay after a restart, or a hung worker that
    wakes up and commits late, writes nothing twice."""

    def __init__(
        self, deadline_s: Callable[[Any], float], *, max_restarts: int = HUNG_SHARD_RESTARTS
    ) -> None:
        self._deadline_s = deadline_s
        self._max_restarts = max_restarts
        self._restarts: dict[Any, int] = {}
        self._on_worker_since: dict[Any, tuple[str, float]] = {}
        self.restarted_workers: list[str] = []
        """Addresses of the workers restarted or removed, in order."""

    def __call__(self, pending: list[Any]) -> None:
        from prefect.context import FlowRunContext

        context = FlowRunContext.get()
        client = getattr(context.task_runner, "client", None) if context else None
        if client is None:
            return  # not under the Dask runner: nothing to restart
        workers = client.run_on_scheduler(
            _processing_workers, keys=[future.wrapped_future.key for future in pending]
        )
        now = time.monotonic()
        overdue: dict[str, list[Any]] = {}
        for future in pending:
            address = workers.get(future.wrapped_future.key)
            if address is None:
                self._on_worker_since.pop(future, None)  # queued: no clock
                continue
            seen = self._on_worker_since.get(future)
            if seen is None or seen[0] != address:
                self._on_worker_since[future] = seen = (address, now)
            if now - seen[1] > self._deadline_s(future):
                overdue.setdefault(address, []).append(future)
        for address, futures in overdue.items():
            for future in futures:
                if self._restarts.get(future, 0) >= self._max_restarts:
                    raise ShardDeadlineError(
                        f"a shard (task run {future.task_run_id}) ran past its deadline of "
                        f"{self._deadline_s(future):.0f} s after {self._max_restarts} worker "
                        "restarts; look at the worker's host and the task, then rerun with "
                        "--resume"
                    )
            self._restart(client, address)
            for future in futures:
                self._restarts[future] = self._restarts.get(future, 0) + 1
                self._on_worker_since.pop(future, None)

    def _restart(self, client: Any, address: str) -> None:
        get_run_logger().warning(
            "a shard ran past its deadline on Dask worker %s: restarting that worker, its "
            "shards go back to the queue",
            address,
        )
        self.restarted_workers.append(address)
        try:
            client.restart_workers([address], timeout=20)
            return
        except Exception:  # no nanny, or it did not answer in time: remove the worker instead
            pass
        try:
            client.run_on_scheduler(_remove_worker, address=address)
        except Exception as error:
            raise ShardDeadlineError(
                f"a shard ran past its deadline on Dask worker {address}, which could be "
                f"neither restarted nor removed ({error}); stop that worker and rerun with "
                "--resume"
            ) from error


def no_worker_clock(
    idle_since: float | None, no_worker_timeout_s: float, pending: int
) -> float | None:
    """The no-worker clock of `completed_while_workers_remain`, for a pending set that grows
    while the flow waits: when the cluster was first seen without a worker (None: it has
    some), given the last answer; raises `NoWorkersError` past `no_worker_timeout_s`."""
    if dask_worker_count() != 0:
        return None
    now = time.monotonic()
    idle_since = idle_since if idle_since is not None else now
    if now - idle_since >= no_worker_timeout_s:
        raise NoWorkersError(
            f"the Dask cluster has had no worker for {now - idle_since:.0f} s with {pending} "
            "group(s) still queued; start workers (or check why they died: memory, the "
            "machine) and rerun with --resume"
        )
    return idle_since
