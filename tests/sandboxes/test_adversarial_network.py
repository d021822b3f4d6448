"""Network escapes from the bwrap sandbox: TCP, UDP and abstract unix sockets to the host,
DNS and routes (conftest.py: the fixtures and the host-unchanged check)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from sandboxes import Sandbox
from tests.sandboxes.adversarial_support import (
    py,
)

pytestmark = [
    pytest.mark.adversarial,
    pytest.mark.timeout(60),
    pytest.mark.usefixtures("capable_host", "host_unchanged"),
]


# -- network ----------------------------------------------------------------------------------


def test_tcp_egress_to_host_loopback_is_refused(sandbox: Sandbox) -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.2)
    port = listener.getsockname()[1]
    accepted: list[object] = []
    done = threading.Event()

    def accept() -> None:
        while not done.is_set():
            try:
                accepted.append(listener.accept())
            except TimeoutError:
                continue

    thread = threading.Thread(target=accept)
    thread.start()
    result = sandbox.execute(
        py(f"""
        import socket
        try:
            socket.create_connection(("127.0.0.1", {port}), timeout=2)
            print("CONNECTED")
        except OSError as error:
            print("BLOCKED", type(error).__name__)
    """)
    )
    done.set()
    thread.join()
    listener.close()
    assert "BLOCKED" in result.stdout, result
    assert accepted == []


def test_udp_egress_to_host_loopback_never_arrives(sandbox: Sandbox) -> None:
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(0.5)
    port = receiver.getsockname()[1]
    result = sandbox.execute(
        py(f"""
        import socket
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        for _ in range(20):
            try:
                s.sendto(b"EXFIL", ("127.0.0.1", {port}))
            except OSError as error:
                print("SEND FAILED", error)
        print("SENT")
    """)
    )
    assert result.exit_code == 0, result
    with pytest.raises(TimeoutError):
        receiver.recvfrom(100)
    receiver.close()


def test_host_abstract_unix_socket_is_unreachable(sandbox: Sandbox) -> None:
    # Abstract sockets (X11, some daemons' control sockets) belong to the network namespace.
    name = f"\0rollyard-adv-{os.urandom(6).hex()}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(name)
    listener.listen()
    result = sandbox.execute(
        py(f"""
        import socket
        s = socket.socket(socket.AF_UNIX)
        try:
            s.connect({name!r}); print("CONNECTED")
        except OSError as error:
            print("BLOCKED", error)
    """)
    )
    listener.close()
    assert "BLOCKED" in result.stdout, result


def test_dns_resolution_and_routes_are_absent(sandbox: Sandbox) -> None:
    result = sandbox.execute(
        py("""
        import socket
        try:
            print("RESOLVED", socket.getaddrinfo("example.com", 80))
        except OSError as error:
            print("NO DNS", error)
        print(open("/proc/net/route").read().count("\\n"))
        print(sorted(l.split(":")[0].strip() for l in open("/proc/net/dev").readlines()[2:]))
    """)
    )
    lines = result.stdout.splitlines()
    assert lines[0].startswith("NO DNS"), result
    assert lines[1] == "1", "a route exists besides the header line"
    assert lines[2] == "['lo']"
