"""The egress proxy: the only way out of a sandbox whose task allows network to listed hosts.

A sandbox with `Limits.allowed_hosts` keeps its own empty network namespace (loopback only: a
bwrap sandbox's own, a container's `--network none`). Its
commands see `HTTP_PROXY`/`HTTPS_PROXY` = http://127.0.0.1:3128, where a relay started with each
command inside the sandbox (`relay_argv`) hands every connection to a unix socket bind-mounted
from the host. On the host, `EgressProxy` serves that socket: it reads one proxy request
(`CONNECT host:port`, or an absolute-form `GET http://host/...`), admits it only when host and
port are on the allowlist, and answers anything else with 403 *before* resolving the name, so a
name built from data (DNS exfiltration) never reaches a resolver. Nothing else leaves: the
sandbox has no route, no reachable DNS server and no other socket into the host.

An allowlist entry is `host:port` (`[v6]:port` for an IPv6 address) or a bare `host`, which
means ports 80 and 443 only. Addresses of this host (loopback, its own interfaces) are reached
only through an entry naming their port, and never the run's own services (`RUN_DENIED_ENV`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import ipaddress
import os
import re
import socket
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
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
    """A host as the allowlist compares it: lower case, no trailing dot, no brackets, an IP
    address in its canonical form (`0:0::1` is `::1`)."""
    name = host.strip().lower().rstrip(".").removeprefix("[").removesuffix("]")
    try:
        return str(ipaddress.ip_address(name))
    except ValueError:
        return name


DEFAULT_PORTS = (80, 443)
"""The ports a bare `host` entry opens (HTTP and HTTPS)."""
RUN_DENIED_ENV = "ROLLYARD_EGRESS_DENIED"
"""Comma-separated `host:port` endpoints every egress proxy of this process refuses even when
the allowlist names them: the run's own services (its Prefect API, its Dask scheduler and
dashboard), set by whoever starts the run and inherited by its worker processes."""
_HOST_NAME = re.compile(r"(\*\.)?[a-z0-9_]([a-z0-9_-]{0,62})(\.[a-z0-9_][a-z0-9_-]{0,62})*")
ENTRY_FORM = 'write host (ports 80 and 443), host:port or [IPv6]:port, e.g. "pypi.org:443"'
"""How to write an allowlist entry: the fix every refusal of a bad one names."""


@dataclasses.dataclass(frozen=True, slots=True)
class HostPort:
    """One allowlist entry: a host (`*.domain` for its subdomains) and its port, or None for a
    bare host (`DEFAULT_PORTS`, and never an address of this host)."""

    host: str
    port: int | None = None

    @classmethod
    def parse(cls, text: str, *, port_required: bool = False) -> HostPort:
        """The entry `text` spells; ValueError says what is wrong with it (`ENTRY_FORM`: the
        fix)."""
        if not isinstance(text, str):
            raise ValueError(f"{text!r} is not a string")
        if not text.strip():
            raise ValueError(f"{text!r} is empty")
        spelled = text.strip()
        if spelled.startswith("["):
            host, bracket, tail = spelled[1:].partition("]")
            if not bracket or (tail and not tail.startswith(":")):
                raise ValueError(f"{text!r} is not [IPv6] or [IPv6]:port")
            port_text: str | None = tail[1:] if tail else None
            if not _is_ip(host, version=6):
                raise ValueError(f"{text!r}: {host!r} in brackets is not an IPv6 address")
        elif spelled.count(":") > 1:
            # `::1:8080` is itself an address: only brackets say where the port starts.
            raise ValueError(f"{text!r}: an IPv6 address needs brackets, e.g. [::1]:8080")
        else:
            host, colon, tail = spelled.partition(":")
            port_text = tail if colon else None
        port = None if port_text is None else _parse_port(text, port_text)
        if port is None and port_required:
            raise ValueError(f"{text!r} names no port; write it as host:port")
        name = normalize_host(host)
        if not _is_ip(name) and (len(name) > 253 or not _HOST_NAME.fullmatch(name)):
            raise ValueError(f"{text!r}: {host!r} is not a host name or address")
        return cls(name, port)

    def __str__(self) -> str:
        host = f"[{self.host}]" if _is_ip(self.host, version=6) else self.host
        return host if self.port is None else f"{host}:{self.port}"

    def names(self, host: str, port: int) -> bool:
        """Whether a request for `host:port` matches this entry by name (before any lookup)."""
        if port != self.port and (self.port is not None or port not in DEFAULT_PORTS):
            return False
        name = normalize_host(host)
        if self.host.startswith("*."):
            return name.endswith(self.host[1:]) and name != self.host[2:]
        return name == self.host


def _parse_port(text: str, port_text: str) -> int:
    if not port_text.isascii() or not port_text.isdigit():
        raise ValueError(f"{text!r}: port {port_text!r} is not a number")
    port = int(port_text)
    if not 0 < port < 65536:
        raise ValueError(f"{text!r}: port {port} is out of range; use 1 to 65535")
    return port


def _is_ip(text: str, *, version: int | None = None) -> bool:
    try:
        address = ipaddress.ip_address(text)
    except ValueError:
        return False
    return version is None or address.version == version


def is_host_address(address: str) -> bool:
    """Whether `address` reaches this host itself: loopback, unspecified (0.0.0.0, ::),
    link-local, or an address of one of its interfaces (which a socket can bind; nothing else
    can be bound)."""
    ip = ipaddress.ip_address(address.split("%", 1)[0])
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    # Link-local counts as this host's own: its link's neighbours (a cloud's metadata server at
    # 169.254.169.254) are the host's services, not the internet's.
    if ip.is_loopback or ip.is_unspecified or ip.is_link_local:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as probe:
        try:
            probe.bind((str(ip), 0))
        except OSError:
            return False
    return True


def _addresses(host: str, port: int) -> list[str]:
    infos = socket.getaddrinfo(normalize_host(host), port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


def run_denied_endpoints() -> tuple[str, ...]:
    """The run's own services, from `RUN_DENIED_ENV` (read when a proxy starts)."""
    return tuple(item.strip() for item in os.environ.get(RUN_DENIED_ENV, "").split(",") if item)


@dataclasses.dataclass(frozen=True, slots=True)
class EgressPolicy:
    """What the proxy admits: `allowed` entries, less the `denied` endpoints (the run's own
    services), by the address each name resolves to."""

    allowed: tuple[HostPort, ...]
    denied_addresses: frozenset[tuple[str, int]] = frozenset()
    """Resolved (address, port) pairs refused whatever the allowlist says."""
    denied_host_ports: frozenset[int] = frozenset()
    """Ports refused on every address of this host: a denied service listening on one of them
    (or on 0.0.0.0) is reached through any of them."""

    @classmethod
    def of(
        cls,
        allowed_hosts: Iterable[str],
        denied_endpoints: Iterable[str] = (),
        *,
        resolve: Callable[[str, int], list[str]] = _addresses,
    ) -> EgressPolicy:
        """The policy of an allowlist and a deny set (`host:port` each; ValueError if bad). A
        denied name that does not resolve is kept by name, so it is refused all the same."""
        addresses: set[tuple[str, int]] = set()
        host_ports: set[int] = set()
        for text in denied_endpoints:
            endpoint = HostPort.parse(text, port_required=True)
            assert endpoint.port is not None
            try:
                found = resolve(endpoint.host, endpoint.port)
            except OSError:
                found = []
            for address in [endpoint.host, *map(normalize_host, found)]:
                addresses.add((address, endpoint.port))
                if _is_ip(address) and is_host_address(address):
                    host_ports.add(endpoint.port)
        allowed = tuple(HostPort.parse(text) for text in allowed_hosts)
        return cls(allowed, frozenset(addresses), frozenset(host_ports))

    def entry_for(self, host: str, port: int) -> HostPort | None:
        """The entry that names `host:port`, or None: refused before the name is resolved."""
        return next((entry for entry in self.allowed if entry.names(host, port)), None)

    def address_refusal(self, entry: HostPort, address: str, port: int) -> str | None:
        """Why the resolved `address:port` of a request `entry` admitted is refused, or None."""
        address = normalize_host(address)
        own = is_host_address(address)
        if (address, port) in self.denied_addresses or (own and port in self.denied_host_ports):
            return f"{address}:{port} is one of the run's own services, never reachable"
        if own and entry.port is None:
            return (f"{address}:{port} is this host's own address, reached only through an "
                    f"entry naming its port (e.g. {entry.host}:{port})")  # fmt: skip
        return None

    def screen(self, entry: HostPort, addresses: Iterable[str], port: int) -> list[str]:
        """The addresses a request `entry` admitted may connect to (`address_refusal` of each)."""
        return [
            address for address in addresses if self.address_refusal(entry, address, port) is None
        ]

    def decide(
        self, host: str, port: int, *, resolve: Callable[[str, int], list[str]] = _addresses
    ) -> tuple[list[str], str | None]:
        """(the addresses a request for `host:port` may connect to, why it is refused when none):
        the proxy's whole decision, the name checked before `resolve` is called."""
        entry = self.entry_for(host, port)
        if entry is None:
            return [], f"{host}:{port} is not on the task's network allowlist"
        found = resolve(host, port)
        admitted = self.screen(entry, found, port)
        if admitted:
            return admitted, None
        refusals = (self.address_refusal(entry, address, port) for address in found)
        return [], next(filter(None, refusals), f"{host} resolves to no address")


def host_allowed(host: str, allowed_hosts: Iterable[str], port: int = 443) -> bool:
    """Whether `host:port` is on the allowlist by name (before resolution and the address
    rules of `EgressPolicy`)."""
    return EgressPolicy.of(allowed_hosts).entry_for(host, port) is not None


class EgressProxy:
    """An HTTP proxy on a unix socket that reaches only `allowed_hosts` (see the module doc),
    never `denied_endpoints` nor the run's own services (`RUN_DENIED_ENV`).

    `decisions` records every request as (host, port, admitted); `resolved` the names the proxy
    looked up (admitted hosts only). Close it when the sandbox closes.
    """

    def __init__(
        self,
        socket_path: Path,
        allowed_hosts: Sequence[str],
        *,
        denied_endpoints: Sequence[str] = (),
        connect_timeout_s: float = 15.0,
    ) -> None:
        self.socket_path = socket_path
        self.allowed_hosts = tuple(allowed_hosts)
        try:
            self.policy = EgressPolicy.of(
                self.allowed_hosts, (*denied_endpoints, *run_denied_endpoints())
            )
        except ValueError as error:
            raise ValueError(f"egress deny set (`{RUN_DENIED_ENV}` or the caller's): {error}; "
                             "list host:port endpoints, comma-separated") from None  # fmt: skip
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

    def _connect(self, client: socket.socket, host: str, port: int) -> socket.socket | None:
        """The upstream connection of an admitted request, or None once `client` has its
        refusal. The name is resolved only when the allowlist names it, and the connection goes
        to an address the policy checked (no second lookup to rebind)."""
        if self.policy.entry_for(host, port) is None:
            self._record(host, port, False)
            _answer(client, 403, f"{host}:{port} is not on the task's network allowlist")
            return None
        with self._lock:
            self.resolved.append(normalize_host(host))
        try:
            admitted, refusal = self.policy.decide(host, port)
        except OSError as error:
            self._record(host, port, False)
            _answer(client, 502, f"cannot resolve {host}: {error}")
            return None
        self._record(host, port, bool(admitted))
        if not admitted:
            _answer(client, 403, str(refusal))
            return None
        failures: list[OSError] = []
        for address in admitted:
            try:
                return socket.create_connection((address, port), timeout=self.connect_timeout_s)
            except OSError as failure:
                failures.append(failure)
        _answer(client, 502, f"cannot reach {host}:{port}: {failures[-1]}")
        return None

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
            upstream = self._connect(client, host, port)
            if upstream is None:
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
