"""rollyard's Dask workers keep their scratch directory off `sys.path`, so the `storage/` spill
folder distributed keeps in it cannot shadow the `storage` package, whatever the install mode."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from flows.dask_worker import SCRATCH_ROOT_NAME, is_scratch_path
from flows.runtime import local_cluster_kwargs

REPO_ROOT = Path(__file__).resolve().parents[2]


def _worker_view(dask_worker: Any) -> dict[str, Any]:
    import storage

    return {
        "scratch": dask_worker.local_directory,
        "scratch_entries": sorted(os.listdir(dask_worker.local_directory)),
        "sys_path": list(sys.path),
        "storage_file": storage.__file__,
    }


def _scratch_on_path(view: dict[str, Any]) -> list[str]:
    root = os.path.dirname(view["scratch"])
    assert os.path.basename(root) == SCRATCH_ROOT_NAME
    return [p for p in view["sys_path"] if is_scratch_path(p, root)]


def _one_worker_view(tmp_path: Path, **cluster_kwargs: Any) -> dict[str, Any]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(**cluster_kwargs, local_directory=str(tmp_path)) as cluster,
        Client(cluster) as client,
    ):
        (view,) = client.run(_worker_view).values()
    return view


def test_worker_scratch_space_is_off_sys_path(tmp_path: Path) -> None:
    # What the preload guards against: a plain worker puts its scratch directory, which holds
    # the `storage/` spill folder, first on sys.path.
    plain = {**local_cluster_kwargs(1)}
    del plain["preload"]
    unguarded = _one_worker_view(tmp_path / "plain", **plain)
    assert "storage" in unguarded["scratch_entries"]
    assert unguarded["sys_path"][0] == unguarded["scratch"]
    assert unguarded["scratch"] in _scratch_on_path(unguarded)

    view = _one_worker_view(tmp_path / "rollyard", **local_cluster_kwargs(1))
    assert "storage" in view["scratch_entries"]  # the folder is there, and cannot be imported
    assert _scratch_on_path(view) == [], view["sys_path"][:4]
    assert view["storage_file"] == str(REPO_ROOT / "storage" / "__init__.py")
