"""The embedded Prefect server does not outlive the process that started it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from flows.runtime import _DIE_WITH_PARENT, _healthy

REPO_ROOT = Path(__file__).resolve().parents[2]

STARTER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from flows.runtime import LocalPrefectServer

    server = LocalPrefectServer(Path(sys.argv[1]))
    print(server.start(), flush=True)
    time.sleep(600)
    """
)


@pytest.mark.skipif(not _DIE_WITH_PARENT, reason="needs Linux and setpriv (util-linux)")
def test_a_killed_starter_takes_its_prefect_server_down(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    starter = subprocess.Popen(
        [sys.executable, "-c", STARTER, str(tmp_path / "prefect")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert starter.stdout is not None
        api_url = starter.stdout.readline().strip()
        assert api_url.startswith("http://127.0.0.1:") and _healthy(api_url)
    finally:
        starter.send_signal(signal.SIGKILL)
        starter.wait(timeout=30)
    deadline = time.monotonic() + 30
    while _healthy(api_url) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not _healthy(api_url), "the Prefect server outlived the process that started it"


@pytest.mark.slow
def test_two_servers_starting_on_one_home_take_turns(tmp_path: Path) -> None:
    # Two commands on one store start a server each on the same database: started together,
    # their migrations raced ("duplicate column name"); now both come up.
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    starters = [
        subprocess.Popen(
            [sys.executable, "-c", STARTER, str(tmp_path / "prefect")],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    try:
        urls = []
        for starter in starters:
            assert starter.stdout is not None
            urls.append(starter.stdout.readline().strip())
        assert all(url.startswith("http://127.0.0.1:") and _healthy(url) for url in urls), [
            (url, starter.poll()) for url, starter in zip(urls, starters, strict=True)
        ]
    finally:
        for starter in starters:
            starter.send_signal(signal.SIGKILL)
            starter.wait(timeout=30)
