"""`rollyard report` writes a self-contained HTML report that a real headless browser renders:
every section present, every figure decoded, nothing fetched from elsewhere."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from flows.cli import main
from storage import TrajectoryStore
from storage.report import collect, write_report

SMALL_RUN_ID = "ops"  # the run of the `small_store` fixture

SECTIONS = [
    "runs",
    "curves",
    "evaluation",
    "gates",
    "failures",
    "flags",
    "throughput",
    "library",
    "checkpoints",
]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _chromium(home: Path, *arguments: str) -> subprocess.CompletedProcess[str]:
    assert CHROMIUM is not None
    return subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--no-first-run",
            f"--user-data-dir={home / 'chromium'}",
            *arguments,
        ],
        capture_output=True,
        text=True,
        timeout=90,
        env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
    )


def test_report_cli_writes_a_self_contained_page(small_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "report.html"
    assert main(["report", "--store", str(small_store), "--out", str(out)]) == 0
    page = out.read_text()
    assert re.findall(r'<h2 id="([a-z]+)">', page) == SECTIONS
    assert f"<h3>{SMALL_RUN_ID}</h3>" in page
    # self-contained: images inline, no external fetches
    assert page.count('src="data:image/png;base64,') >= 2
    assert not re.search(r'(src|href)="(https?:)?//', page)


def test_report_of_a_missing_store_is_a_one_line_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", "--store", str(tmp_path / "nowhere")]) == 3
    assert "no store here" in capsys.readouterr().err


def test_report_tables_hold_the_run(small_store: Path) -> None:
    tables = collect(TrajectoryStore(str(small_store)))
    assert [r["iteration"] for r in tables["iterations"]] == [0, 1]
    assert {r["run_id"] for r in tables["gates"]} == {SMALL_RUN_ID}  # gate history recorded
    assert tables["checkpoints"]


@pytest.mark.skipif(
    CHROMIUM is None,
    reason="chromium is not installed (infra/setup.sh installs it: apt-get install chromium)",
)
def test_report_renders_in_a_headless_browser(
    small_store: Path, tmp_path: Path, private_home: Path
) -> None:
    out = write_report(TrajectoryStore(str(small_store)), tmp_path / "report.html")
    dom = _chromium(private_home, "--dump-dom", out.as_uri())
    assert dom.returncode == 0, dom.stderr[-2000:]
    for section in SECTIONS:
        assert f'id="{section}"' in dom.stdout
    assert "<table>" in dom.stdout and "reward curve" in dom.stdout

    shot = tmp_path / "shot.png"
    rendered = _chromium(
        private_home, "--window-size=1100,1400", f"--screenshot={shot}", out.as_uri()
    )
    assert rendered.returncode == 0 and shot.is_file(), rendered.stderr[-2000:]
    from PIL import Image

    with Image.open(shot) as image:
        assert image.size == (1100, 1400)
        # a rendered page has text, table rules and plotted lines: many colours, not a blank
        colours = image.convert("RGB").getcolors(maxcolors=1 << 20) or []
        assert len(colours) > 50, f"the page rendered as {len(colours)} colours"


def test_report_of_an_empty_store_says_so(tmp_path: Path) -> None:
    store = tmp_path / "store"
    store.mkdir()
    page = write_report(TrajectoryStore(str(store)), tmp_path / "r.html").read_text()
    assert re.findall(r'<h2 id="([a-z]+)">', page) == SECTIONS
    assert "No episodes in this store yet." in page and "<img" not in page


def test_report_of_one_run(small_store: Path, tmp_path: Path) -> None:
    out = tmp_path / "r.html"
    assert main(["report", "--store", str(small_store), "--out", str(out), "--run-id", "x"]) == 0
    assert "No iterations yet." in out.read_text()  # run x does not exist in the store
