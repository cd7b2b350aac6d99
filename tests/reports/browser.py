"""Headless Chromium for report checks: does every image of a page decode, and a screenshot of it.
Skips cleanly where Debian's chromium is not installed (the CI script installs it)."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--no-first-run", "--disable-sync"]
PROBE = ('<script>window.addEventListener("load", () => { const imgs = [...document.images]; '
         'document.title = JSON.stringify({images: imgs.length, '
         'decoded: imgs.filter(i => i.complete && i.naturalWidth > 0).length, '
         'height: document.documentElement.scrollHeight}); });</script>')


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if not found:
        pytest.skip("chromium is not installed (apt-get install chromium; .ci/run installs it)")
    return found


def run_chromium(profile: Path, *args: str) -> str:
    out = subprocess.run([chromium(), *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def probe(html: Path, work: Path) -> dict:
    """{images, decoded, height} of the page once loaded (a copy of it with a probe script)."""
    copy = work / "probe.html"
    copy.write_text(html.read_text().replace("</body>", PROBE + "</body>"))
    dom = run_chromium(work / "profile", "--virtual-time-budget=3000", "--window-size=1400,3000", "--dump-dom",
                       copy.as_uri())
    return json.loads(re.search(r"<title>(.*?)</title>", dom).group(1).replace("&quot;", '"'))


def screenshot(html: Path, work: Path, name: str, height: int) -> Path:
    """The whole page at 1400 px wide, kept under tests/artifacts/."""
    ARTIFACTS.mkdir(exist_ok=True)
    out = ARTIFACTS / name
    run_chromium(work / "profile", f"--screenshot={out}", f"--window-size=1400,{height}", html.as_uri())
    return out
