"""The egress proxy: the only way out of a sandbox whose task allows network to listed hosts.

A sandbox with `Limits.allowed_hosts` keeps its own empty network namespace (loopback only: a
bwrap sandbox's own, a container's `--network none`). Its
commands see `HTTP_PROXY`/`HTTPS_PROXY` = http://127.0.0.1:3128, where a relay started with each
command inside the sandbox (`relay_argv`) hands every connection to a unix socket bind-mounted
from the host. On the host, `EgressProxy` serves that socket: it reads one proxy request
(`CONNECT host:port`, or an absolute-form `GET http://host/...`), admits it only when the host is
on the allowlist, and answers anything else with 403 *before* resolving the name, so a name built
from data (DNS exfiltration) never reaches a resolver. Nothing else leaves: the sandbox has no
route, no reachable DNS server and no other socket into the host.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

PROXY_PORT = 3128
"""The loopback port of the relay inside the sandbox (the proxy's address there)."""
SOCKET_IN_SANDBOX = "/run/rollyard/egress.sock"
"""Where the host's proxy socket appears inside the sandbox."""
MAX_HEAD_BYTES = 16 << 10
"""A proxy request's line and headers; beyond it the request is refused."""

# Runs inside the sandbox as `python -I -S -c RELAY PORT SOCKET COMMAND...`: binds the loopback
# port, then the parent becomes the command (exec) while a forked child relays each connection to
# the host's socket. The child ends with the sandbox's PID namespace when the command ends.
RELAY = """
import os, socket, sys, threading
port, path, command = int(sys.argv[1]), sys.argv[2], sys.argv[3:]
listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", port))
listener.listen(64)
if os.fork():
    listener.close()
    os.execvp(command[0], command)
null = os.open(os.devnull, os.O_RDWR)
for fd in (0, 1, 2):
    os.dup2(null, fd)
def pump(source, target):
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            target.sendall(data)
    except OSError:
        pass
    try:
        target.shutdown(socket.SHUT_WR)
    except OSError:
        pass
def serve(client):
    upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        upstream.connect(path)
    except OSError:
        client.close()
        return
    threading.Thread(target=pump, args=(upstream, client), daemon=True).start()
    pump(client, upstream)
while True:
    client, _ = listener.accept()
    threading.Thread(target=serve, args=(client,), daemon=True).start()
"""


def relay_argv(command: Sequence[str], *, python: str = sys.executable) -> list[str]:
    """`command` run behind the relay to the egress proxy (see the module docstring), by the
    sandbox's `python`."""
    return [python, "-I", "-S", "-c", RELAY, str(PROXY_PORT), SOCKET_IN_SANDBOX, *command]


def proxy_environment() -> dict[str, str]:
    """The variables that point a sandbox's HTTP clients (pip, curl, urllib, requests, git) at
    the relay."""
    url = f"http://127.0.0.1:{PROXY_PORT}"
    return {name: url for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                                   "ALL_PROXY", "all_proxy")}  # fmt: skip


def normalize_host(host: str) -> str:
    """A host name as the allowlist compares it: lower case, no trailing dot, no brackets."""
    return host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")


def host_allowed(host: str, allowed_hosts: Iterable[str]) -> bool:
    """Whether `host` is on the allowlist: equal to an entry, or under a `*.domain` entry."""
    name = normalize_host(host)
    for entry in map(normalize_host, allowed_hosts):
        if entry.startswith("*.") and name.endswith(entry[1:]) and name != entry[2:]:
            return True
        if name == entry:
            return True
    return False


class EgressProxy:
    """An HTTP proxy on a unix socket that reaches only `allowed_hosts` (see the module doc).

    `decisions` records every request as (host, port, admitted); `resolved` the names the proxy
    looked up (admitted hosts only). Close it when the sandbox closes.
    """

    def __init__(
        self, socket_path: Path, allowed_hosts: Sequence[str], *, connect_timeout_s: float = 15.0
    ) -> None:
        self.socket_path = socket_path
        self.allowed_hosts = tuple(allowed_hosts)
        self.connect_timeout_s = connect_timeout_s
        self.decisions: list[tuple[str, int, bool]] = []
        self.resolved: list[str] = []
        self._lock = threading.Lock()
        self._server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._server.bind(str(socket_path))
            # The sandbox's uid connects to it; the directory above decides who can reach it.
            os.chmod(socket_path, 0o666)
            self._server.listen(64)
        except OSError:
            self._server.close()
            raise
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="rollyard-egress", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop accepting and remove the socket (connections in flight end with their peers)."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(OSError):
            self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()
        self._thread.join(timeout=5)
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(client,), daemon=True).start()

    def _record(self, host: str, port: int, admitted: bool) -> None:
        with self._lock:
            self.decisions.append((host, port, admitted))

    def _serve(self, client: socket.socket) -> None:
        with client:
            client.settimeout(self.connect_timeout_s)
            try:
                head, rest = _read_head(client)
                request = _parse(head)
            except (OSError, ValueError) as error:
                _answer(client, 400, f"not a proxy request: {error}")
                return
            method, host, port, forwarded = request
            if not host_allowed(host, self.allowed_hosts):
                self._record(host, port, False)
                _answer(client, 403, f"{host} is not on the task's network allowlist")
                return
            self._record(host, port, True)
            with self._lock:
                self.resolved.append(normalize_host(host))
            try:
                upstream = socket.create_connection(
                    (normalize_host(host), port), timeout=self.connect_timeout_s
                )
            except OSError as error:
                _answer(client, 502, f"cannot reach {host}:{port}: {error}")
                return
            with upstream:
                if method == "CONNECT":
                    client.sendall(b"HTTP/1.1 200 Connection established\r\n\r\n")
                else:
                    upstream.sendall(forwarded + rest)
                client.settimeout(None)
                upstream.settimeout(None)
                _relay(client, upstream)


def _read_head(client: socket.socket) -> tuple[bytes, bytes]:
    data = b""
    while b"\r\n\r\n" not in data:
        if len(data) > MAX_HEAD_BYTES:
            raise ValueError(f"request head over {MAX_HEAD_BYTES} bytes")
        chunk = client.recv(4096)
        if not chunk:
            raise ValueError("connection closed before the request ended")
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    return head, rest


def _split_host_port(authority: str, default_port: int) -> tuple[str, int]:
    if authority.startswith("["):
        host, _, tail = authority[1:].partition("]")
        port_text = tail.removeprefix(":")
    else:
        host, _, port_text = authority.partition(":")
    if not host:
        raise ValueError(f"no host in {authority!r}")
    port = int(port_text) if port_text else default_port
    if not 0 < port < 65536:
        raise ValueError(f"port {port} out of range")
    return host, port


def _parse(head: bytes) -> tuple[str, str, int, bytes]:
    """(method, host, port, the request to forward: origin-form, one request, no proxy headers)
    of a proxy request head."""
    lines = head.decode("latin-1").split("\r\n")
    method, target, version = lines[0].split(" ", 2)
    if method == "CONNECT":
        host, port = _split_host_port(target, 443)
        return method, host, port, b""
    if not target.startswith("http://"):
        raise ValueError(f"{method} {target[:80]!r}: only CONNECT and http:// URLs are proxied")
    authority, slash, path = target.removeprefix("http://").partition("/")
    host, port = _split_host_port(authority, 80)
    headers = [
        line for line in lines[1:]
        if line and line.split(":", 1)[0].strip().lower()
        not in ("proxy-connection", "proxy-authorization", "connection", "keep-alive")
    ]  # fmt: skip
    # One request per connection: a second one on a kept-alive connection would reach this host
    # whatever host it names, so the connection closes after the first.
    request = [f"{method} {slash}{path} {version}", *headers, "Connection: close", "", ""]
    return method, host, port, "\r\n".join(request).encode("latin-1")


def _answer(client: socket.socket, code: int, message: str) -> None:
    reason = {400: "Bad Request", 403: "Forbidden", 502: "Bad Gateway"}[code]
    body = f"rollyard egress proxy: {message}\n".encode()
    head = (f"HTTP/1.1 {code} {reason}\r\nContent-Type: text/plain\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n")  # fmt: skip
    with contextlib.suppress(OSError):
        client.sendall(head.encode() + body)


def _relay(client: socket.socket, upstream: socket.socket) -> None:
    """Copy bytes both ways until each side has closed its half."""

    def pump(source: socket.socket, target: socket.socket) -> None:
        try:
            while data := source.recv(1 << 16):
                target.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            target.shutdown(socket.SHUT_WR)

    back = threading.Thread(target=pump, args=(upstream, client), daemon=True)
    back.start()
    pump(client, upstream)
    back.join()
