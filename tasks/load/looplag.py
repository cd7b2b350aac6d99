"""The load generator's own noise: how late its event loop wakes against a timer while a cell runs.

A ticker sleeps TICK_S and records how much later than asked it woke (host scheduling, the loop busy
parsing other streams, other threads holding the GIL): every stamp the load generator takes is late by about
as much. The ticker sleeps on a timerfd (epdbench.timer), so asyncio's millisecond timer granularity — which
does not delay a socket read, hence no stamp — is not counted as lag.
"""
from __future__ import annotations

import asyncio
import time
from array import array

from epdbench.timer import cancel_and_wait, precise_sleep

TICK_S = 0.005           # 200 wake-ups a second: cheap, and finer than the decode steps it guards
MAX_TICKS = 2_000_000    # about 3 hours of ticks (8 MB); later ticks are not kept


class LoopLag:
    """`async with LoopLag(time_scale) as lag:` ticks while the block runs; `lag.samples_s` holds each
    tick's lateness divided by the time scale (modelled seconds)."""

    def __init__(self, time_scale: float = 1.0, tick_s: float = TICK_S, clock=time.perf_counter):
        self.time_scale, self.tick_s, self.clock = time_scale, tick_s, clock
        self.samples_s = array("d")
        self._task: asyncio.Task | None = None
        self._sleep = precise_sleep()

    async def _tick(self) -> None:
        while len(self.samples_s) < MAX_TICKS:
            t = self.clock()
            await self._sleep(self.tick_s)
            self.samples_s.append(max(0.0, self.clock() - t - self.tick_s) / self.time_scale)

    async def __aenter__(self) -> "LoopLag":
        self._task = asyncio.get_running_loop().create_task(self._tick())
        return self

    async def __aexit__(self, *exc) -> None:
        await cancel_and_wait(self._task)
        close = getattr(getattr(self._sleep, "__self__", None), "close", None)
        if close:
            close()
