"""sim/link.py on the virtual-time loop: transfers in flight share the link, a peer's lanes queue the rest."""
from __future__ import annotations

import asyncio

import pytest

from epdbench.sim import vloop
from epdbench.sim.link import Link


def ends(link: Link, transfers: list[tuple[float, float, float, object, int]]) -> list[float]:
    """End time of each (start, setup_s, link_s, peer, lanes) transfer, all on `link`, run in virtual time."""
    async def one(start, setup_s, link_s, peer, lanes):
        await asyncio.sleep(start)
        await link.send(setup_s, link_s, peer, lanes)
        return asyncio.get_running_loop().time()

    async def main():
        return await asyncio.gather(*(one(*t) for t in transfers))
    return vloop.run(main())


def test_one_transfer_takes_its_setup_then_its_bytes():
    assert ends(Link(), [(0.0, 0.002, 0.010, None, 0)]) == [pytest.approx(0.012)]


def test_transfers_to_different_peers_share_the_link_and_end_together():
    assert ends(Link(), [(0.0, 0.001, 0.010, "d0", 4), (0.0, 0.001, 0.010, "d1", 4)]) == [pytest.approx(0.021)] * 2


def test_a_late_transfer_shares_only_what_is_left():
    # A alone for 5 ms (5 ms left), then both at half speed: A ends at 15 ms; B, 5 ms done, ends alone at 20 ms.
    assert ends(Link(), [(0.0, 0.0, 0.010, None, 0), (0.005, 0.0, 0.010, None, 0)]) == [
        pytest.approx(0.015), pytest.approx(0.020)]


def test_transfers_to_one_peer_that_need_all_its_lanes_go_one_after_the_other():
    # 56-descriptor KV transfers hold the peer's 4 lanes: the second waits for the first, setup included.
    assert ends(Link(), [(0.0, 0.001, 0.010, "d0", 4), (0.0, 0.001, 0.010, "d0", 4)]) == [
        pytest.approx(0.011), pytest.approx(0.022)]


def test_one_descriptor_transfers_to_one_peer_share_four_at_a_time():
    done = ends(Link(), [(0.0, 0.0, 0.010, "d0", 1)] * 6)
    assert done == [pytest.approx(0.040)] * 4 + [pytest.approx(0.060)] * 2     # 4 share, then the last 2


def test_time_scale_stretches_every_duration_on_the_loop_clock():
    assert ends(Link(time_scale=3.0), [(0.0, 0.001, 0.010, "d0", 4), (0.0, 0.001, 0.010, "d1", 4)]) == [
        pytest.approx(0.063)] * 2


def test_a_cancelled_transfer_frees_its_share_and_its_lanes():
    async def main():
        link, loop = Link(), asyncio.get_running_loop()
        a = asyncio.ensure_future(link.send(0.0, 0.010))
        b = asyncio.ensure_future(link.send(0.0, 0.010))
        c = asyncio.ensure_future(link.send(0.0, 0.002, "d0", 4))     # holds the peer's 4 lanes
        d = asyncio.ensure_future(link.send(0.0, 0.002, "d0", 4))     # waits for them
        await asyncio.sleep(0.004)
        b.cancel()
        d.cancel()
        await asyncio.gather(b, d, return_exceptions=True)
        await c
        c_end = loop.time()
        await a
        a_end = loop.time()
        await link.send(0.0, 0.001, "d0", 4)                           # the lanes are free again
        return c_end, a_end, loop.time() - a_end, link.active
    c_end, a_end, after, active = vloop.run(main())
    # 0–4 ms: a, b, c share three ways, 4/3 ms each. Then a and c two ways: c's last 2/3 ms take 4/3 ms.
    assert c_end == pytest.approx(0.004 + 2 * (0.002 - 0.004 / 3))
    assert a_end == pytest.approx(c_end + (0.010 - 0.002))             # a then has 10 − 2 ms left, alone
    assert after == pytest.approx(0.001) and active == 0
