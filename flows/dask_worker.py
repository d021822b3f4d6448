"""Set-up of every Dask worker rollyard starts: the worker's scratch directory leaves `sys.path`.

distributed puts each worker's scratch directory first on `sys.path` (so files a client uploads
import), and keeps its spill-to-disk data in a `storage/` folder inside it. Under a default
(import-hook) editable install that folder would be found first as a namespace package and
shadow rollyard's `storage`; wherever the scratch directory lives, it holds that folder. So the
worker drops it from `sys.path` before it takes any task (`Client.upload_file` still works: it
puts the directory on the path for the import it does). Pass this module as the workers'
preload: `local_cluster_kwargs` does, and `dask worker --preload flows.dask_worker` for a
cluster started by hand. This module imports nothing of the project.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SCRATCH_ROOT_NAME = "dask-scratch-space"
"""The folder distributed creates under its temporary directory for every worker's scratch."""


def scratch_paths(local_directory: str) -> list[str]:
    """The `sys.path` entries a worker's scratch space put there: its own directory and the
    shared scratch root above it (a nanny puts that one there, and its worker inherits it)."""
    paths = [local_directory]
    parent = os.path.dirname(local_directory)
    if os.path.basename(parent) == SCRATCH_ROOT_NAME:
        paths.append(parent)
    return paths


def dask_setup(worker: Any) -> None:
    """distributed's preload hook: runs in the worker process before it registers."""
    for path in scratch_paths(str(worker.local_directory)):
        while path in sys.path:
            sys.path.remove(path)
