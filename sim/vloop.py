"""An asyncio event loop on virtual time: the simulator's engines, links and clients run as a discrete-event
simulation, with no I/O and no sleeping.

`loop.time()` is a virtual clock that starts at 0. When no callback is ready, the loop asks its selector to
wait until the next timer; this selector waits for nothing and moves the clock to that timer instead, so
`asyncio.sleep(d)` costs no host time and every coroutine sees exactly the time it was modelled to see. Host
load cannot bend it, and the same inputs give the same event order, hence the same results, on every run.

Only timers move the clock: a loop that has nothing scheduled and nothing ready is deadlocked (a coroutine
waits for something no timer will bring), and says so instead of hanging.
"""
from __future__ import annotations

import asyncio
import heapq
import itertools
import selectors
from asyncio import events


class Deadlock(RuntimeError):
    """Every coroutine waits and no timer is set: virtual time cannot advance."""


class _NoIOSelector(selectors.BaseSelector):
    """A selector with nothing to select on: `select(timeout)` advances the loop's virtual clock by the timeout.
    The loop's own wake-up pipe is registered here and never polled (only other threads write to it, and a
    virtual-time simulation has none)."""

    def __init__(self, loop: VirtualTimeLoop):
        self._loop = loop
        self._keys: dict = {}

    def register(self, fileobj, events, data=None):
        key = selectors.SelectorKey(fileobj, fileobj if isinstance(fileobj, int) else fileobj.fileno(), events, data)
        self._keys[fileobj] = key
        return key

    def unregister(self, fileobj):
        return self._keys.pop(fileobj)

    def modify(self, fileobj, events, data=None):
        self.unregister(fileobj)
        return self.register(fileobj, events, data)

    def select(self, timeout=None):
        if timeout is None:
            raise Deadlock("virtual time: every task waits and no timer is set")
        if timeout > 0:
            self._loop.advance(timeout)
        return []

    def get_map(self):
        return self._keys

    def close(self):
        self._keys.clear()


class _Timer(events.TimerHandle):
    """A timer ordered by its time and, at equal times, by when it was set (asyncio's own compares the time
    only, so which of two simultaneous timers runs first would depend on the heap's history: on every other
    timer the simulation ever set)."""
    __slots__ = ("_key",)

    def __init__(self, when, callback, args, loop, context, order: int):
        super().__init__(when, callback, args, loop, context)
        self._key = (when, order)

    def __lt__(self, other):
        return self._key < other._key

    def __le__(self, other):
        return self._key <= other._key

    def __gt__(self, other):
        return self._key > other._key

    def __ge__(self, other):
        return self._key >= other._key


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """asyncio on a virtual clock (seconds from 0). Use `run(coro)`; reading sockets or files is not supported.
    Simultaneous timers run in the order they were set, and the clock moves to a timer's time exactly (not by a
    difference, which would round differently depending on the timers in between): the same inputs give the
    same event order however many unrelated timers the simulation sets."""

    def __init__(self):
        self._now = 0.0
        self._orders = itertools.count()
        super().__init__(selector=_NoIOSelector(self))
        self._clock_resolution = 1e-12

    def time(self) -> float:
        return self._now

    def call_at(self, when, callback, *args, context=None):
        self._check_closed()
        timer = _Timer(when, callback, args, self, context, next(self._orders))
        if timer._source_traceback:
            del timer._source_traceback[-1]
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def advance(self, seconds: float) -> None:
        """Move the clock by `seconds`, to the next timer's time exactly when that is where it leads."""
        target = self._now + seconds
        if self._scheduled and abs(self._scheduled[0]._when - target) <= 1e-9:
            target = max(self._now, self._scheduled[0]._when)
        self._now = target

    def time_ns(self) -> int:
        return int(round(self._now * 1e9))


def run(coro, loop: VirtualTimeLoop | None = None):
    """Run `coro` to completion on a fresh virtual-time loop (or `loop`) and close it; returns its result."""
    loop = loop or VirtualTimeLoop()
    try:
        asyncio.set_event_loop(loop)
        return loop.run_until_complete(coro)
    finally:
        asyncio.set_event_loop(None)
        loop.close()
