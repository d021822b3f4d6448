"""The shard writer: commits a caller's shards on one background thread, grouping those that queue.

Why groups, and why one thread, is in `storage.commits` (the design record of the commit engine).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor, wait
from contextlib import suppress

from storage.commits import CommitEngine, CommitResult, PreparedShard, first_line
from storage.errors import CommitError
from storage.records import TableInput


class ShardWriter:
    """Commits shards in the order given, on one background thread, while the caller goes on.

    Made by `TrajectoryStore.shard_writer` over the store's commit engine. `submit` converts and
    checks a shard's records in the calling thread (so a bad record raises there, and the caller
    may reuse its lists once it returns), then queues the shard for the writer's thread. That
    thread takes every shard queued by the time it is free and commits them together
    (`CommitEngine.commit_group`): one steps commit, then one episodes commit, both carrying
    each shard's transaction id: the steps commit decides which writer owns a shard, the
    episodes commit is its commit point. Shards arriving faster than one commit takes so share
    the cost of a commit instead of queueing behind one commit each. Each shard stays exactly
    once on its own: a killed process leaves every shard committed, invisible, or owned but not
    yet complete (its steps committed, which rollyard's readers leave out until its replay or
    `vacuum` completes it with this writer's files), and replaying any of them writes nothing
    twice. At most `max_in_flight` shards wait or are being committed (so at most that many
    share a commit, and their tables are what the writer holds in memory); `submit` blocks until
    some are done when that many are.

    A shard is committed once the future `submit` returns has its `CommitResult`, and every
    submitted shard once `flush` or `close` returns. A failed commit stops the writer: the shards
    of that commit and every later one are not committed (their futures fail), and the error is
    raised by the next `submit`, `flush` or `close`; replay the shards that did not commit (it is
    safe). Use it as a context manager, which closes it (waiting for every commit) on the way out.
    Submit from one thread.
    """

    def __init__(self, engine: CommitEngine, *, max_in_flight: int = 16) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
        self.engine = engine
        self.max_in_flight = max_in_flight
        self._pending: deque[Future[CommitResult]] = deque()
        # Shards submitted and not yet taken by the writer's thread, with their futures.
        self._queue: deque[tuple[PreparedShard, Future[CommitResult]]] = deque()
        self._queue_lock = threading.Lock()
        # Used by the writer's thread only, one commit at a time; handed back on close.
        self._handles = engine.take_handles()
        self._executor: ThreadPoolExecutor | None = None
        # Set by the writer's thread when a commit fails; raised once to the caller.
        self._failure: BaseException | None = None
        self._reported = False
        self._closed = False

    def __repr__(self) -> str:
        return f"ShardWriter({self.engine.root!r}, pending={len(self._pending)})"

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, kind: object, error: object, traceback: object) -> None:
        if error is None:
            self.close()
            return
        # The block failed: still wait for what was handed over, and let its error through.
        with suppress(Exception):
            self.close()

    def submit(
        self,
        run_id: str,
        iteration: int,
        shard: int,
        *,
        episodes: TableInput,
        steps: TableInput = (),
    ) -> Future[CommitResult]:
        """Convert and check a shard now, and queue its commit; arguments as for
        `TrajectoryStore.commit_iteration_shard`. Raises a record error here, and the error of
        an earlier shard's failed commit."""
        if self._closed:
            raise CommitError(f"{self!r} is closed; make another with store.shard_writer()")
        self._raise_failure()
        prepared = self.engine.prepare_shard(run_id, iteration, shard, episodes, steps)
        while len(self._pending) >= self.max_in_flight:
            wait([self._pending[0]])
            self._collect()
        self._raise_failure()
        if self._executor is None:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="rollyard-shard-writer")
        future: Future[CommitResult] = Future()
        with self._queue_lock:
            self._queue.append((prepared, future))
        # One task per shard; a task finding the queue emptied by an earlier one does nothing.
        self._executor.submit(self._commit_queued)
        self._pending.append(future)
        return future

    def flush(self) -> None:
        """Wait until every submitted shard is committed; raises a failed commit's error."""
        wait(list(self._pending))
        self._collect()
        self._raise_failure()

    def close(self) -> None:
        """Wait for every submitted shard and stop the writer's thread; raises a failed commit's
        error unless already raised. A closed writer takes no more shards."""
        try:
            wait(list(self._pending))
            self._collect()
            self._raise_failure(again=False)
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
                self._executor = None
            if not self._closed:
                self._closed = True
                self.engine.give_back_handles(self._handles)

    def _commit_queued(self) -> None:
        # Runs on the writer's thread: commits everything queued so far as one group, in order.
        with self._queue_lock:
            group = list(self._queue)
            self._queue.clear()
        if not group:
            return
        failure = self._failure
        if failure is not None:
            for prepared, future in group:
                future.set_exception(
                    CommitError(
                        f"{prepared.source}: not committed, because an earlier shard of this "
                        f"writer failed ({first_line(failure)}); replay it, it is safe to"
                    )
                )
            return
        try:
            results = self.engine.commit_group([prepared for prepared, _ in group], self._handles)
        except BaseException as error:
            self._failure = error
            for _, future in group:
                future.set_exception(error)
            return
        for (_, future), result in zip(group, results, strict=True):
            future.set_result(result)

    def _collect(self) -> None:
        while self._pending and self._pending[0].done():
            self._pending.popleft()

    def _raise_failure(self, *, again: bool = True) -> None:
        """Raise a failed commit's error the first time; then, with `again`, that the writer
        stopped (closing after the error was seen raises nothing more)."""
        failure = self._failure
        if failure is None or (self._reported and not again):
            return
        if not self._reported:
            self._reported = True
            raise failure
        raise CommitError(
            f"{self!r} stopped after a failed commit ({first_line(failure)}); replay the shards "
            "that did not commit with another writer"
        )
