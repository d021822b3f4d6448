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

    def deep_text(self) -> str:
        """The page's text including what web components keep in shadow roots (Bokeh 3 renders
        every widget there, out of reach of `text`)."""
        return str(self.evaluate(_DEEP_TEXT) or "")

    def bokeh_models(self) -> dict[str, list[str]]:
        """What the page's Bokeh documents show: the plot titles and the `name` column values
        of their data sources (a Dask dashboard's task stream names its tasks there); empty
        until Bokeh has received its document."""
        found = self.evaluate(_BOKEH_MODELS)
        return dict(found) if found else {"titles": [], "names": []}

    def evaluate(self, expression: str) -> Any:
        return self._call("Runtime.evaluate", expression=expression, returnByValue=True)[
            "result"
        ].get("value")

    def wait_for_text(self, *needles: str, timeout_s: float = 60.0, after: str = "") -> str:
        """Poll the rendered text until it holds every needle (in the part after the first
        `after`, when given: a list below its heading); returns that part."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            part = text.split(after, 1)[1] if after and after in text else ("" if after else text)
            missing = [n for n in needles if n not in part]
            if not missing:
                return part
            assert time.monotonic() < deadline, (
                f"page never showed {missing}{f' after {after!r}' if after else ''}; "
                f"it shows:\n{text[:3000]}"
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


_DEEP_TEXT = """(() => {
  const parts = [];
  const walk = (node) => {
    if (node.nodeType === Node.TEXT_NODE) { parts.push(node.textContent); return; }
    if (node.nodeName === "STYLE" || node.nodeName === "SCRIPT") return;
    if (node.shadowRoot) walk(node.shadowRoot);
    node.childNodes.forEach(walk);
  };
  walk(document.body);
  return parts.join(" ").replace(/\\s+/g, " ");
})()"""

_BOKEH_MODELS = """(() => {
  if (!window.Bokeh || !Bokeh.documents.length) return null;
  const titles = [], names = new Set();
  for (const doc of Bokeh.documents) for (const model of doc.all_models) {
    if (model.type === "Title" && model.text) titles.push(model.text);
    if (model.data && model.data.name) for (const name of model.data.name) names.add(String(name));
  }
  return {titles: titles, names: Array.from(names)};
})()"""


def colours_in(png: Path) -> int:
    """Distinct colours of a screenshot: a rendered page has many, a blank one a few."""
    from PIL import Image

    with Image.open(png) as image:
        return len(image.convert("RGB").getcolors(maxcolors=1 << 24) or [])
