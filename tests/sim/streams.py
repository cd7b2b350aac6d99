"""A sequence's token times on the running loop's clock, with something done after its n-th token (a request sent
beside it): shared by the engine tests of what runs beside a decode."""
from __future__ import annotations

import asyncio
from collections.abc import Callable

from epdbench.sim.engine import Sequence


async def token_gaps(seq: Sequence, after: int, then: Callable[[], None], timeout_s: float = 5.0) -> list[float]:
    """The gaps between `seq`'s tokens until it is done, calling `then` once after its `after`-th token."""
    loop, times = asyncio.get_running_loop(), []
    while True:
        kind, _ = await asyncio.wait_for(seq.out.get(), timeout=timeout_s)
        if kind == "done":
            return [y - x for x, y in zip(times, times[1:])]
        times.append(loop.time())
        if len(times) == after:
            then()
