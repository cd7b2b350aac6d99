"""An asyncio event loop on virtual time: the simulator's engines, links and clients run as a discrete-event
simulation, with no I/O and no sleeping.

`loop.time()` is a virtual clock that starts at 0. When no callback is ready, the loop moves the clock to the
next timer instead of waiting for it, so `asyncio.sleep(d)` costs no host time and every coroutine sees exactly
the time it was modelled to see. Host load cannot bend it, and the same inputs give the same event order, hence
the same results, on every run.

Only timers move the clock: a loop that has nothing scheduled and nothing ready is deadlocked (a coroutine
waits for something no timer will bring), and says so instead of hanging.
"""
from __future__ import annotations

import asyncio
import contextvars
import heapq
import itertools
import selectors
from asyncio import events

_COMPACT_AT = 100   # timers in the heap before cancelled ones are swept out (asyncio: 100, half cancelled)


class Deadlock(RuntimeError):
    """Every coroutine waits and no timer is set: virtual time cannot advance."""


class _NoIOSelector(selectors.BaseSelector):
    """A selector with nothing to select on, never polled: VirtualTimeLoop's iteration moves the clock itself.
    The loop's own wake-up pipe is registered here (only other threads write to it, and a virtual-time
    simulation has none)."""

    def __init__(self):
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
        return []

    def get_map(self):
        return self._keys

    def close(self):
        self._keys.clear()


class _Handle(events.Handle):
    """events.Handle as asyncio makes it outside debug mode (VirtualTimeLoop uses asyncio's own in debug mode):
    a virtual run makes one or two for every event, so the debug checks alone were a measurable share."""
    __slots__ = ()

    def __init__(self, callback, args, loop, context=None):
        self._context = contextvars.copy_context() if context is None else context
        self._loop, self._callback, self._args = loop, callback, args
        self._cancelled, self._repr, self._source_traceback = False, None, None


class _TimerHandle(events.TimerHandle):
    """events.TimerHandle likewise."""
    __slots__ = ()

    def __init__(self, when, callback, args, loop, context=None):
        _Handle.__init__(self, callback, args, loop, context)
        self._when, self._scheduled = when, False


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """asyncio on a virtual clock (seconds from 0). Use `run(coro)`; reading sockets or files is not supported,
    nor asyncio's debug mode. Simultaneous timers run in the order they were set (asyncio's own heap compares
    the time only, so which of two simultaneous timers ran first would depend on the heap's history: on every
    other timer the simulation ever set), and the clock moves to a timer's time exactly: the same inputs give
    the same event order however many unrelated timers the simulation sets.

    One iteration (`_run_once`) does what asyncio's does for a loop without I/O: drop cancelled timers, move
    the clock to the next timer when nothing is ready, make the timers now due ready, run what is ready. The
    timer heap holds (time, order set, handle) tuples, compared in C: a virtual run is little more than
    its callbacks."""

    def __init__(self):
        self._now = 0.0
        self._orders = itertools.count()
        super().__init__(selector=_NoIOSelector())
        self._clock_resolution = 1e-12

    def time(self) -> float:
        return self._now

    def call_soon(self, callback, *args, context=None):
        if self._debug:
            return super().call_soon(callback, *args, context=context)
        self._check_closed()
        handle = _Handle(callback, args, self, context)
        self._ready.append(handle)
        return handle

    def call_later(self, delay, callback, *args, context=None):
        if delay is None:
            raise TypeError("delay must not be None")
        return self.call_at(self._now + delay, callback, *args, context=context)

    def call_at(self, when, callback, *args, context=None):
        self._check_closed()
        timer = (_TimerHandle if not self._debug else events.TimerHandle)(when, callback, args, self, context)
        heapq.heappush(self._scheduled, (when, next(self._orders), timer))
        timer._scheduled = True
        return timer

    def _run_once(self):
        scheduled, ready = self._scheduled, self._ready
        if len(scheduled) > _COMPACT_AT and 2 * self._timer_cancelled_count > len(scheduled):
            kept = []
            for entry in scheduled:
                if entry[2]._cancelled:
                    entry[2]._scheduled = False
                else:
                    kept.append(entry)
            scheduled[:] = kept
            heapq.heapify(scheduled)
            self._timer_cancelled_count = 0
        else:
            while scheduled and scheduled[0][2]._cancelled:
                self._timer_cancelled_count -= 1
                heapq.heappop(scheduled)[2]._scheduled = False
        if not ready and not self._stopping:
            if not scheduled:
                raise Deadlock("virtual time: every task waits and no timer is set")
            if scheduled[0][0] > self._now:
                self._now = scheduled[0][0]
        due = self._now + self._clock_resolution
        while scheduled and scheduled[0][0] < due:
            timer = heapq.heappop(scheduled)[2]
            timer._scheduled = False
            ready.append(timer)
        for _ in range(len(ready)):
            handle = ready.popleft()
            if not handle._cancelled:
                handle._run()

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
