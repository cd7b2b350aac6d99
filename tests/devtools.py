"""Headless Chromium driven through the DevTools protocol over a pipe (`--remote-debugging-pipe`: no port, no
Playwright, the standard library only), for pages that render in the browser: a single-page app is read once its
scripts have drawn it. A fresh profile each time (nothing remembered from an earlier visit). Skips in one line where
Debian's chromium is not installed (tests/reports/browser.chromium)."""
from __future__ import annotations

import base64
import fcntl
import json
import os
import select
import shlex
import signal
import subprocess
import time
from pathlib import Path

from tests.reports.browser import FLAGS, chromium


class DevToolsError(RuntimeError):
    pass


class Browser:
    """One headless Chromium with one page; `with Browser(profile) as b: b.open(url); b.wait_for(js, timeout)`."""

    def __init__(self, profile: Path, width: int = 1400, height: int = 1000):
        to_browser, self._out = os.pipe()      # fd 3 in the browser: the commands it reads
        self._in, from_browser = os.pipe()     # fd 4 in the browser: its answers and events
        # above 4 first, so that placing one at 3 or 4 cannot overwrite the other
        to_browser, from_browser = (self._above_4(fd) for fd in (to_browser, from_browser))
        cmd = shlex.join([chromium(), *FLAGS, "--remote-debugging-pipe", f"--user-data-dir={profile}",
                        f"--window-size={width},{height}", "about:blank"])
        self.proc = subprocess.Popen(["bash", "-c", f"exec {cmd} 3<&{to_browser} 4>&{from_browser}"],
                                     pass_fds=(to_browser, from_browser), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        os.close(to_browser)
        os.close(from_browser)
        self._buf, self._id, self.session = b"", 0, None

    @staticmethod
    def _above_4(fd: int) -> int:
        moved = fcntl.fcntl(fd, fcntl.F_DUPFD, 5)
        os.close(fd)
        return moved

    def __enter__(self) -> Browser:
        page = next(t for t in self.call("Target.getTargets", timeout=30)["targetInfos"] if t["type"] == "page")
        self.session = self.call("Target.attachToTarget", targetId=page["targetId"], flatten=True)["sessionId"]
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (DevToolsError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)
        os.close(self._out)
        os.close(self._in)

    def call(self, method: str, timeout: float = 10, **params) -> dict:
        """One command's result (events in between are dropped); DevToolsError on its error or past `timeout`."""
        self._id += 1
        msg = {"id": self._id, "method": method, "params": params}
        if self.session and not method.startswith(("Target.", "Browser.")):
            msg["sessionId"] = self.session
        os.write(self._out, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            while b"\0" in self._buf:
                raw, self._buf = self._buf.split(b"\0", 1)
                reply = json.loads(raw)
                if reply.get("id") == self._id:
                    if "error" in reply:
                        raise DevToolsError(f"{method}: {reply['error']}")
                    return reply["result"]
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self._in], [], [], left)[0]:
                raise DevToolsError(f"{method}: no answer in {timeout} s")
            chunk = os.read(self._in, 1 << 20)
            if not chunk:
                raise DevToolsError(f"{method}: the browser exited")
            self._buf += chunk

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)

    def evaluate(self, expression: str):
        """The JSON value of a JavaScript expression in the page."""
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def wait_for(self, expression: str, timeout: float, done=bool, every: float = 0.25):
        """The first value of `expression` that is `done`, polled; the last value seen when `timeout` passes first."""
        deadline, value = time.monotonic() + timeout, None
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if done(value):
                return value
            time.sleep(every)
        return value

    def screenshot(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        return path
