"""The local Prefect server: the embedded one does not outlive the process that started it;
the long-lived one of `rollyard server` is shared by every later command on its store."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time
import urllib.request
from pathlib import Path

import pytest

from flows.runtime import _DIE_WITH_PARENT, _healthy

REPO_ROOT = Path(__file__).resolve().parents[2]

STARTER = textwrap.dedent(
    """
    import os, sys, time
    from pathlib import Path
    from flows.runtime import LocalPrefectServer

    # Root may lower it (a niced test's server at nice 0, as the benchmarks run it); anyone
    # may raise it by one.
    niceness = 0 if os.geteuid() == 0 else os.getpriority(os.PRIO_PROCESS, 0) + 1
    server = LocalPrefectServer(Path(sys.argv[1]), niceness=niceness)
    print(server.start(), flush=True)
    print(server.state.pid, niceness, flush=True)
    time.sleep(600)
    """
)


@pytest.mark.slow  # starts and kills a server of its own
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
        server_pid, niceness = map(int, starter.stdout.readline().split())
        # field 19 of /proc/PID/stat: the nice value the server was started at
        stat = Path(f"/proc/{server_pid}/stat").read_text().rsplit(")", 1)[1].split()
        assert int(stat[16]) == niceness
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


def test_server_start_status_and_stop_share_one_server_per_store(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`rollyard server start` leaves a server that a later command on the same store finds
    (here through `prefect_api` and `connect`, as a second shell or a notebook would), and
    `stop` takes it down."""
    from flows.cli import main
    from flows.runtime import PREFECT_DEFAULT_PORT, connect, prefect_api, prefect_home_for

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    store = tmp_path / "store"
    assert main(["server", "status", "--store", str(store)]) == 3
    assert main(["server", "start", "--store", str(store)]) == 0
    try:
        started = capsys.readouterr().out
        ui_url = re.search(r"UI:\s+(http://127\.0\.0\.1:(\d+))", started)
        assert ui_url is not None, started
        assert int(ui_url.group(2)) >= PREFECT_DEFAULT_PORT
        api_url = f"{ui_url.group(1)}/api"
        assert _healthy(api_url)
        # the UI itself is served, not only the API
        with urllib.request.urlopen(ui_url.group(1), timeout=10) as page:
            assert b"<title>" in page.read()

        assert main(["server", "start", "--store", str(store)]) == 0  # idempotent
        assert f"UI:  {ui_url.group(1)}" in capsys.readouterr().out
        assert main(["server", "status", "--store", str(store)]) == 0
        assert api_url in capsys.readouterr().out

        with prefect_api(prefect_home_for(str(store))) as used:
            assert used == api_url
        assert "the server of `rollyard server start`" in capsys.readouterr().err
        assert _healthy(api_url), "a command that found the server must leave it running"
        assert connect(store) == api_url
    finally:
        monkeypatch.delenv("PREFECT_API_URL", raising=False)
        assert main(["server", "stop", "--store", str(store)]) == 0
    assert "stopped the server" in capsys.readouterr().out
    assert not _healthy(api_url)
    assert main(["server", "status", "--store", str(store)]) == 3


def test_connect_without_a_server_names_the_command_that_starts_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.errors import PrefectServerError
    from flows.runtime import connect

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with pytest.raises(PrefectServerError, match="rollyard server start --store"):
        connect(tmp_path / "store")


def test_the_embedded_server_takes_the_next_port_when_4200_is_held() -> None:
    from flows.runtime import PREFECT_DEFAULT_PORT, stable_port

    first = stable_port()
    assert first >= PREFECT_DEFAULT_PORT
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", first))
        assert stable_port() > first


def test_a_new_home_starts_from_the_migrated_template_and_an_old_one_keeps_its_database(
    tmp_path: Path,
) -> None:
    import sqlite3

    from flows.runtime import PREFECT_DATABASE_FILE, prefect_database_template, seed_database

    # Built at install (or by the first server start of this machine): Prefect's schema at its
    # head revision, holding no runs.
    template = prefect_database_template()
    with sqlite3.connect(template) as con:
        [(head,)] = con.execute("SELECT version_num FROM alembic_version").fetchall()
        assert con.execute("SELECT count(*) FROM flow_run").fetchone() == (0,)
    new_home = tmp_path / "new"
    new_home.mkdir()
    seed_database(new_home)
    with sqlite3.connect(new_home / PREFECT_DATABASE_FILE) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchall() == [(head,)]
    old_home = tmp_path / "old"
    old_home.mkdir()
    (old_home / PREFECT_DATABASE_FILE).write_bytes(b"a database of its own")
    seed_database(old_home)
    assert (old_home / PREFECT_DATABASE_FILE).read_bytes() == b"a database of its own"
