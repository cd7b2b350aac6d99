"""The virtual-time loop: timers move its clock, nothing waits on the host, a deadlock is named."""
import asyncio
import time

import pytest

from epdbench.sim.vloop import Deadlock, VirtualTimeLoop, run


def test_sleeps_move_virtual_time_and_cost_no_host_time():
    seen = []

    async def sleeper(name, delays):
        for d in delays:
            await asyncio.sleep(d)
            seen.append((round(asyncio.get_running_loop().time(), 9), name))

    async def main():
        await asyncio.gather(sleeper("a", [3600, 1]), sleeper("b", [0.5, 3600.25]))
        return asyncio.get_running_loop().time()

    t0 = time.perf_counter()
    end = run(main())
    assert time.perf_counter() - t0 < 1.0                 # two virtual hours
    assert end == pytest.approx(3601.0)
    assert seen == [(0.5, "b"), (3600.0, "a"), (3600.75, "b"), (3601.0, "a")]


def test_the_same_program_gives_the_same_trace():
    async def main():
        loop, trace = asyncio.get_running_loop(), []

        async def worker(i):
            for k in range(20):
                await asyncio.sleep((i * 7 + k * 3) % 5 * 0.001)
                trace.append((i, k, loop.time()))
        await asyncio.gather(*(worker(i) for i in range(5)))
        return trace

    assert run(main()) == run(main())


def test_a_wait_no_timer_can_end_is_a_deadlock():
    async def main():
        await asyncio.get_running_loop().create_future()

    with pytest.raises(Deadlock):
        run(main())


def test_the_clock_starts_at_zero_in_nanoseconds_too():
    loop = VirtualTimeLoop()
    assert loop.time() == 0 and loop.time_ns() == 0
    run(asyncio.sleep(1.5), loop)
    assert loop.time_ns() == 1_500_000_000


def test_simultaneous_timers_run_in_the_order_set_and_the_clock_lands_on_each_exactly():
    """asyncio orders timers by time only, so two set for one instant could run either way depending on the
    heap's history; here the first set runs first however many unrelated timers were set around them, and the
    clock reads exactly the time each timer was set for (not a sum of differences)."""
    def trace(noise: int) -> tuple[list[str], list[float]]:
        order, clocks = [], []

        async def main():
            loop = asyncio.get_running_loop()
            when = 0.1 + 0.2                                  # 0.30000000000000004: not a round sum of steps
            for k in range(noise):                            # unrelated timers before, between and after
                loop.call_at(when * k / noise, lambda: None)
                loop.call_at(when + 1e-3 * (k + 1), lambda: None)
            for name in "abcde":
                loop.call_at(when, lambda n=name: (order.append(n), clocks.append(loop.time())))
            await asyncio.sleep(1.0)
        run(main())
        return order, clocks
    for noise in (0, 7, 100):
        order, clocks = trace(noise)
        assert order == list("abcde"), noise
        assert clocks == [0.1 + 0.2] * 5, noise


@pytest.mark.parametrize("debug", [False, True])
def test_callbacks_run_in_order_cancelled_ones_never_and_debug_mode_gives_the_same(debug):
    """call_soon is FIFO, call_later is relative to the virtual clock, a cancelled handle never runs; in
    asyncio's debug mode the loop uses asyncio's own handles and behaves the same."""
    loop = VirtualTimeLoop()
    loop.set_debug(debug)
    seen = []

    async def main():
        lp = asyncio.get_running_loop()
        lp.call_soon(seen.append, ("soon", 1, lp.time()))
        lp.call_soon(seen.append, ("soon", 2, lp.time())).cancel()
        lp.call_soon(seen.append, ("soon", 3, lp.time()))
        lp.call_later(2.0, lambda: seen.append(("later", 2.0, lp.time())))
        lp.call_later(1.0, lambda: seen.append(("later", 1.0, lp.time())))
        lp.call_at(1.5, seen.append, ("at", 1.5, 1.5)).cancel()
        await asyncio.sleep(3)
        with pytest.raises(TypeError):
            lp.call_later(None, seen.append, "never")

    run(main(), loop)
    assert seen == [("soon", 1, 0.0), ("soon", 3, 0.0), ("later", 1.0, 1.0), ("later", 2.0, 2.0)]
