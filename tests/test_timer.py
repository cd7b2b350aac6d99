"""epdbench/timer.py: the engine's precise sleep ends after its deadline, not much later, and cleans up."""
from __future__ import annotations

import asyncio
import sys
import time

import pytest

from epdbench.timer import TimerfdSleeper, precise_sleep


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="timerfd is Linux-only")
def test_timerfd_sleep_ends_after_its_deadline_and_a_cancelled_one_leaves_no_reader():
    sleeper = TimerfdSleeper()

    async def go():
        late = []
        for _ in range(20):
            t = time.perf_counter()
            await sleeper.sleep(0.003)
            late.append(time.perf_counter() - t - 0.003)
        task = asyncio.get_running_loop().create_task(sleeper.sleep(10))
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        t = time.perf_counter()
        await sleeper.sleep(0.002)          # the fd serves the next sleep after a cancellation
        return late, time.perf_counter() - t

    late, after_cancel = asyncio.run(go())
    sleeper.close()
    assert min(late) >= 0 and sorted(late)[10] < 0.005      # median overshoot well under a step, even on CI
    assert 0.002 <= after_cancel < 1.0


def test_precise_sleep_is_a_coroutine_function_of_seconds_on_every_platform():
    sleep = precise_sleep()

    async def go():
        t = time.perf_counter()
        await sleep(0.001)
        await sleep(0)
        return time.perf_counter() - t
    assert asyncio.run(go()) >= 0.001
