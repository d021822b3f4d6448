"""Set-up of every Dask worker rollyard starts: the worker's scratch directory leaves `sys.path`.

distributed puts each worker's scratch directory first on `sys.path` (so files a client uploads
import), and keeps its spill-to-disk data in a `storage/` folder inside it. Under a default
(import-hook) editable install that folder would be found first as a namespace package and
shadow rollyard's `storage`; wherever the scratch directory lives, it holds that folder. So the
worker drops every scratch directory from `sys.path` before it takes any task
(`Client.upload_file` still works: it puts the directory on the path for the import it does). Pass this module as the workers'
preload: `local_cluster_kwargs` does, and `dask worker --preload flows.dask_worker` for a
cluster started by hand. This module imports nothing of the project.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SCRATCH_ROOT_NAME = "dask-scratch-space"
"""The folder distributed creates under its temporary directory for every worker's scratch."""


def scratch_root(local_directory: str) -> str:
    """The directory holding every scratch directory of the cluster: the `dask-scratch-space`
    above the worker's own one (the nanny's and, in a LocalCluster, the scheduler's scratch
    directories sit there too, and the worker process inherits them on its path)."""
    parent = os.path.dirname(local_directory)
    return parent if os.path.basename(parent) == SCRATCH_ROOT_NAME else local_directory


def is_scratch_path(path: str, root: str) -> bool:
    return path == root or path.startswith(root + os.sep)


def dask_setup(worker: Any) -> None:
    """distributed's preload hook: runs in the worker process before it registers."""
    root = scratch_root(str(worker.local_directory))
    sys.path[:] = [path for path in sys.path if not is_scratch_path(path, root)]
