"""Live terminal line for `epdbench compare` in a terminal: configuration, suite, cell, requests done
and the running TTFT/ITL of the current cell. Inactive when stdout is not a terminal."""
from __future__ import annotations

import sys
import time

from epdbench.analysis.metrics import percentile


class LiveCell:
    def __init__(self, enabled: bool | None = None, min_interval_s: float = 0.25):
        self.enabled = sys.stdout.isatty() if enabled is None else enabled
        self.min_interval_s = min_interval_s
        self._live = None
        self._last = 0.0
        self.reset("", 0)

    def reset(self, label: str, total: int, warmup: int = 0) -> None:
        """A new cell of `total` measured requests after `warmup` warm-up ones (counted apart: the result
        line counts measured requests only)."""
        self.label, self.total, self.done, self.errors = label, total, 0, 0
        self.warmup, self.warm_done = warmup, 0
        self.ttft_ms: list[float] = []
        self.itl_ms: list[float] = []

    def text(self) -> str:
        ttft = percentile(self.ttft_ms, 50)
        itl = percentile(self.itl_ms, 99)
        warm = f"warm-up {self.warm_done}/{self.warmup}, " if self.warmup else ""
        return (f"{self.label}: {warm}{self.done}/{self.total} measured requests"
                + (f", {self.errors} errors" if self.errors else "")
                + (f", TTFT p50 {ttft:.1f} ms" if ttft is not None else "")
                + (f", ITL p99 {itl:.1f} ms" if itl is not None else ""))

    def on_record(self, rec) -> None:
        if rec.phase == "warmup":
            self.warm_done += 1
        else:
            self.done += 1
        if not rec.ok:
            self.errors += 1
        elif rec.phase == "measured":
            self.ttft_ms.append(rec.ttft_ms)
            offs = rec.chunk_offsets_ns
            self.itl_ms.extend((b - a) / 1e6 for a, b in zip(offs, offs[1:]))
        self._refresh()

    def _refresh(self, force: bool = False) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if not force and now - self._last < self.min_interval_s:
            return
        self._last = now
        from rich.text import Text  # plain text: "[pd-tcp]" is not markup
        if self._live is None:
            from rich.live import Live
            self._live = Live(Text(self.text()), refresh_per_second=4, transient=True)
            self._live.start()
        else:
            self._live.update(Text(self.text()))

    def stop(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None
