"""The sending pod's link as Mooncake's transfer engine uses it: transfers in flight share its bandwidth, and over
TCP at most MC_TCP_LANES_PER_PEER of them go to one peer at a time.

A transfer first waits for its lanes to the peer (physics.costmodel.peer_lanes: over TCP one per descriptor, at most
4; the peer's queue is first come first served), then spends its setup (physics.costmodel.setup_seconds), which
takes no bandwidth, then moves its bytes: while k transfers move bytes, each gets 1/k of the link (processor
sharing). So k equal transfers to different peers end together after k times one alone, and two KV transfers of
2·layers descriptors to one peer go one after the other — what benchmarks/transport/mooncake_tcp.py measured of the real
engine (see the notes next to physics.costmodel.setup_seconds). The HTTP simulator (sim.kv_handoff, sim.encoder)
and the virtual-time core (sim.vcluster) both move bytes through this class, so they agree.
"""
from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Hashable

from epdbench.physics.costmodel import MOONCAKE_TCP_LANES_PER_PEER

_DONE_S = 1e-7    # loop-clock seconds: a transfer that would end sooner than this has ended (clock rounding)


class _Lanes:
    """One peer's lanes: a transfer holds `k` of them while it runs; who waits is served first come first served."""

    def __init__(self, n: int):
        self.free = n
        self._waiting: deque[tuple[int, asyncio.Future]] = deque()

    async def acquire(self, k: int) -> None:
        if not self._waiting and self.free >= k:
            self.free -= k
            return
        granted = asyncio.get_running_loop().create_future()
        self._waiting.append((k, granted))
        try:
            await granted
        except asyncio.CancelledError:
            if granted.done() and not granted.cancelled():
                self.release(k)                       # granted, then cancelled before it ran: give them back
            elif (k, granted) in self._waiting:
                self._waiting.remove((k, granted))
                self._wake()
            raise

    def release(self, k: int) -> None:
        self.free += k
        self._wake()

    def _wake(self) -> None:
        while self._waiting and self._waiting[0][0] <= self.free:
            k, granted = self._waiting.popleft()
            if not granted.cancelled():
                self.free -= k
                granted.set_result(None)


class Link:
    """One pod's link on the running event loop. Durations are modelled seconds; `time_scale` stretches them on
    the loop's clock (target.sim.time_scale; 1 in virtual time)."""

    def __init__(self, time_scale: float = 1.0, lanes_per_peer: int = MOONCAKE_TCP_LANES_PER_PEER):
        self.time_scale = time_scale
        self.lanes_per_peer = lanes_per_peer
        self._lanes: dict[Hashable, _Lanes] = {}
        self._left: dict[asyncio.Future, float] = {}   # transfer -> link seconds it still needs alone
        self._since = 0.0                               # loop time of the last update of _left
        self._timer: asyncio.TimerHandle | None = None

    @property
    def active(self) -> int:
        """Transfers moving bytes now."""
        return len(self._left)

    async def send(self, setup_s: float, link_s: float, peer: Hashable | None = None, lanes: int = 0) -> None:
        """One transfer to `peer` holding `lanes` of its lanes (0: none needed): `setup_s` on its own, then `link_s`
        seconds of the link alone (bytes / bandwidth), shared with the transfers moving bytes meanwhile."""
        queue = None
        if peer is not None and lanes > 0:
            lanes = min(lanes, self.lanes_per_peer)
            queue = self._lanes.setdefault(peer, _Lanes(self.lanes_per_peer))
            await queue.acquire(lanes)
        try:
            if setup_s > 0:
                await asyncio.sleep(setup_s * self.time_scale)
            if link_s > 0:
                await self._move(link_s)
        finally:
            if queue is not None:
                queue.release(lanes)

    async def _move(self, link_s: float) -> None:
        loop = asyncio.get_running_loop()
        self._update(loop.time())
        done = loop.create_future()
        self._left[done] = link_s
        self._schedule(loop)
        try:
            await done
        finally:
            if done in self._left:                           # cancelled while moving bytes: free its share
                self._update(loop.time())
                del self._left[done]
                self._schedule(loop)

    def _update(self, now: float) -> None:
        """Charge the time since the last update to every transfer moving bytes, shared equally."""
        if self._left:
            share = (now - self._since) / self.time_scale / len(self._left)
            for t in self._left:
                self._left[t] -= share
        self._since = now

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        """One timer, for the next transfer to end at the current share."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._left:
            first = max(0.0, min(self._left.values()))
            self._timer = loop.call_at(self._since + first * len(self._left) * self.time_scale, self._finish, loop)

    def _finish(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        self._update(loop.time())
        n = len(self._left)
        for t, left in list(self._left.items()):
            if left * n * self.time_scale <= _DONE_S:
                del self._left[t]
                if not t.done():
                    t.set_result(None)
        self._schedule(loop)
