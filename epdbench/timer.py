"""Precise sleeps: the simulator engine's modelled timeline and the load generator's event-loop lag ticker.

asyncio wakes a sleeping task through epoll_wait, whose timeout has millisecond granularity (rounded up), so
`asyncio.sleep(0.00677)` ends on average 0.4 ms late on an idle host — 6% of a 6.8 ms decode step, every
step. On Linux a timerfd armed at the absolute deadline (CLOCK_MONOTONIC, the clock of time.perf_counter)
wakes the loop within the kernel's timer slack, which is set to 1 ns for the process. Measured on the 2-core
development machine with `python benchmarks/simulator/sim_timing.py --timer`: overshoot mean/p99 0.40/0.53 ms with
asyncio.sleep, 0.13/0.28 ms with the timerfd. Elsewhere (or if the calls fail) asyncio.sleep is used.
"""
from __future__ import annotations

import asyncio
import ctypes
import os
import sys
import time

CLOCK_MONOTONIC = 1
TFD_NONBLOCK, TFD_CLOEXEC, TFD_TIMER_ABSTIME = 0o4000, 0o2000000, 1
PR_SET_TIMERSLACK = 29


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


class TimerfdSleeper:
    """`await sleeper.sleep(seconds)`: one timerfd per sleeper (one sleeper per engine, one sleep at a time)."""

    def __init__(self):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.timerfd_create.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.timerfd_settime.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.POINTER(_Itimerspec), ctypes.c_void_p]
        fd = libc.timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC)
        if fd < 0:
            raise OSError(ctypes.get_errno(), "timerfd_create failed")
        libc.prctl(PR_SET_TIMERSLACK, 1, 0, 0, 0)      # best effort: 1 ns of slack instead of 50 µs
        self._libc, self.fd = libc, fd

    async def sleep(self, seconds: float) -> None:
        if seconds <= 0:
            await asyncio.sleep(0)
            return
        deadline = time.perf_counter() + seconds
        sec = int(deadline)
        spec = _Itimerspec(_Timespec(0, 0), _Timespec(sec, int((deadline - sec) * 1e9)))
        if self._libc.timerfd_settime(self.fd, TFD_TIMER_ABSTIME, ctypes.byref(spec), None) != 0:
            await asyncio.sleep(max(0.0, deadline - time.perf_counter()))
            return
        loop = asyncio.get_running_loop()
        fired = loop.create_future()

        def ready() -> None:
            try:
                os.read(self.fd, 8)
            except BlockingIOError:
                return
            if not fired.done():
                fired.set_result(None)

        loop.add_reader(self.fd, ready)
        try:
            await fired
        finally:
            loop.remove_reader(self.fd)

    def close(self) -> None:
        os.close(self.fd)


def precise_sleep():
    """The best sleep this platform offers for the modelled timeline (a coroutine function of seconds)."""
    if sys.platform.startswith("linux") and time.get_clock_info("perf_counter").implementation.endswith(
            "(CLOCK_MONOTONIC)"):
        try:
            return TimerfdSleeper().sleep
        except (OSError, AttributeError):
            pass
    return asyncio.sleep


async def cancel_and_wait(task: "asyncio.Task | None") -> None:
    """Cancel a background task and wait until it has ended (its cancellation swallowed)."""
    if task is None:
        return
    task.cancel()
    try:
        await task
    except asyncio.CancelledError:
        pass
