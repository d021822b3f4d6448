"""How a command opens the store it reads or writes: every command goes through `open_store`, so a
damaged store gives the same one line and exit 4 everywhere (`storage.fsck.check_before_use`)
and a missing one exit 3, before anything is read, written or started; a command that writes
holds the store's writer lease meanwhile (`writing_store`), like `train` and `evaluate`."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage import TrajectoryStore


def check_store_before_use(root: str | os.PathLike[str]) -> None:
    """Refuse a store the cheap check finds damaged: `CorruptFileError` (exit 4) naming the first
    damage and `rollyard store check`. A store not made yet passes."""
    from storage.fsck import check_before_use

    check_before_use(root)


def open_store(root: str | os.PathLike[str], *, create: bool = False) -> TrajectoryStore:
    """The store at `root`, checked (`check_store_before_use`); `StoreNotFoundError` (exit 3)
    when there is none and not `create`."""
    from storage import TrajectoryStore

    check_store_before_use(root)
    return TrajectoryStore(root, create=create)


@contextmanager
def writing_store(
    root: str | os.PathLike[str], *, purpose: str, run_id: str = "-", create: bool = False
) -> Iterator[TrajectoryStore]:
    """`open_store`, then the store's writer lease for the block: `LeaseHeldError` (exit 3, one
    line naming the holder) while another writer runs (`storage.lease`)."""
    from storage.lease import writer_lease

    store = open_store(root, create=create)
    with writer_lease(store.root, run_id=run_id, purpose=purpose):
        yield store
