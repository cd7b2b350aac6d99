"""The MLflow UI as a person first meets it: a real `mlflow server` on loopback over a store, and what a fresh
headless Chromium (tests/devtools.Browser) shows at an address once MLflow's single-page app has drawn it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from epdbench.tasks.proc.processes import free_port
from tests.devtools import Browser

DRAWN_S = 60     # a cold server's first page on a busy 2-core host: about 5 s idle, 20 s under load
# the page: its address, its text and the runs table's run links, row by row (the table draws its rows in two parts)
PAGE = """(() => {
  const index = r => Number(r.getAttribute('row-index'));
  const rows = [...document.querySelectorAll('.ag-pinned-left-cols-container .ag-row, '
                                            + '.ag-center-cols-container .ag-row')].sort((a, b) => index(a) - index(b));
  const runs = rows.map(r => [...r.querySelectorAll('a[href*="/runs/"]')].map(a => a.getAttribute('href'))).flat();
  const text = document.body.innerText;
  return {href: location.href, text, runs, ready: %s};
})()"""
RUNS_TABLE = PAGE % "runs.length > 0 && text.includes('matching runs')"        # the runs table, its rows drawn
RUN_PAGE = PAGE % "text.includes('About this run')"                          # a run's page
GENAI = ("Detect Issues", "Evaluation runs", "Evaluations", "Judges")          # GenAI mode's Overview and navigation


@contextmanager
def mlflow_server(db: Path, artifacts: Path | None = None):
    """`mlflow server` on a free loopback port over the SQLite store `db` (and `artifacts` as its artifact store,
    when given): its address once /health answers."""
    port = free_port("127.0.0.1")
    server = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--backend-store-uri", f"sqlite:///{db}",
                               *(["--artifacts-destination", str(artifacts)] if artifacts else []),
                               "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                              env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(240):                      # up to 60 s
            try:
                urllib.request.urlopen(f"{url}/health", timeout=2).close()
                break
            except OSError:
                assert server.poll() is None, "mlflow server exited"
                time.sleep(0.25)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)     # the server and the uvicorn worker it starts
        server.wait(timeout=30)


def drawn(browser: Browser, url: str, ready: str) -> dict:
    """{href, text, runs, ready} of the page at `url` once drawn; AssertionError naming what it shows if never."""
    browser.open(url)
    page = browser.wait_for(ready, DRAWN_S, done=lambda p: bool(p and p["ready"]))
    assert page and page["ready"], f"{url} not drawn in {DRAWN_S} s: {page and page['href']}\n" \
                                   f"{page and page['text'][:1500]}"
    return page
