"""Headless Chromium driven over the DevTools protocol, for tests that look at what a user sees:
open a page, let its scripts run (single-page apps such as the Prefect UI, Bokeh dashboards fed
over websockets), read the rendered text, take a screenshot."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from websockets.sync.client import ClientConnection, connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
SKIP_REASON = "chromium is not installed (infra/setup.sh installs it: apt-get install chromium)"


class Browser:
    """One headless Chromium with one page; its profile and HOME live in `home`."""

    def __init__(self, home: Path, *, width: int = 1400, height: int = 900) -> None:
        assert CHROMIUM is not None, SKIP_REASON
        profile = home / "chromium"
        (profile / "DevToolsActivePort").unlink(missing_ok=True)  # a previous browser's port
        self._process = subprocess.Popen(
            [
                CHROMIUM,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--no-first-run",
                "--hide-scrollbars",
                "--remote-debugging-port=0",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        )
        self._ids = itertools.count(1)
        self._socket = self._connect(profile / "DevToolsActivePort")

    def _connect(self, port_file: Path) -> ClientConnection:
        deadline = time.monotonic() + 60
        while not port_file.is_file() or not port_file.read_text().strip():
            assert time.monotonic() < deadline, "chromium did not open its DevTools port"
            assert self._process.poll() is None, "chromium exited during start-up"
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
            page = next(t for t in json.load(answer) if t["type"] == "page")
        return connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=30)

    def _call(self, method: str, **params: Any) -> dict[str, Any]:
        call_id = next(self._ids)
        self._socket.send(json.dumps({"id": call_id, "method": method, "params": params}))
        while True:
            message = json.loads(self._socket.recv(timeout=60))
            if message.get("id") == call_id:
                assert "error" not in message, f"{method}: {message['error']}"
                return dict(message.get("result", {}))

    def open(self, url: str) -> None:
        self._call("Page.navigate", url=url)

    def text(self) -> str:
        """The page's rendered text (what a reader sees, scripts having run)."""
        result = self._call(
            "Runtime.evaluate", expression="document.body ? document.body.innerText : ''"
        )
        return str(result["result"].get("value", ""))

    def evaluate(self, expression: str) -> Any:
        return self._call("Runtime.evaluate", expression=expression, returnByValue=True)[
            "result"
        ].get("value")

    def wait_for_text(self, *needles: str, timeout_s: float = 60.0) -> str:
        """Poll the rendered text until it holds every needle; returns it."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            missing = [n for n in needles if n not in text]
            if not missing:
                return text
            assert time.monotonic() < deadline, (
                f"page never showed {missing}; it shows:\n{text[:3000]}"
            )
            time.sleep(0.5)

    def screenshot(self, path: Path) -> Path:
        data = self._call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        self._socket.close()
        self._process.terminate()
        try:
            self._process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()


def colours_in(png: Path) -> int:
    """Distinct colours of a screenshot: a rendered page has many, a blank one a few."""
    from PIL import Image

    with Image.open(png) as image:
        return len(image.convert("RGB").getcolors(maxcolors=1 << 24) or [])
