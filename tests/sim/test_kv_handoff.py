"""sim/kv_handoff.py in process (aiohttp's test server on loopback): the prefill's bootstrap server pushes held KV
over its pod's link (sim.link) in real time, as the virtual-time core does: transfers to one decode go in turn,
to two decodes they share the link."""
from __future__ import annotations

import asyncio
import time

import pytest
from aiohttp.test_utils import TestClient, TestServer

from epdbench.physics.costmodel import link_bytes_per_s, setup_seconds
from epdbench.sim.replica import Replica
from epdbench.sim.server import bootstrap_app

TOKENS = 2000       # 2000 × 57344 B of KV at 3 GB/s: 38 ms on the link alone


async def pull_two(replica: Replica, decodes: list[str]) -> list[float]:
    """Seconds until each of two KV pulls, sent at once by `decodes` (engine ids), is answered."""
    for i in range(2):
        replica.kv.hold({"transfer_id": f"x{i}"}, f"r{i}", TOKENS)
    client = TestClient(TestServer(bootstrap_app(replica)))
    await client.start_server()
    try:
        t0 = time.perf_counter()

        async def pull(i: int) -> float:
            resp = await client.post("/epdbench/kv_pull", json={"transfer_id": f"x{i}", "request_id": f"r{i}",
                                                                 "tokens": TOKENS, "engine_id": decodes[i]})
            assert resp.status == 200, await resp.text()
            return time.perf_counter() - t0
        return sorted(await asyncio.gather(pull(0), pull(1)))
    finally:
        await client.close()


@pytest.mark.parametrize("decodes, in_turn", [(["d0", "d0"], True), (["d0", "d1"], False)])
def test_two_kv_pushes_go_in_turn_to_one_decode_and_share_the_link_to_two(tiny_spec, decodes, in_turn):
    config = next(c for c in tiny_spec.configurations if c.name == "pd-tcp")
    replica = Replica(tiny_spec, config, "prefill", 0, "127.0.0.1", 0, 0)
    hw = tiny_spec.hardware
    setup = setup_seconds(hw, "tcp", replica.cost.kv_descriptors)
    move = replica.cost.kv_bytes(TOKENS) / link_bytes_per_s(hw, "tcp")
    first, second = asyncio.run(pull_two(replica, decodes))
    if in_turn:                    # the second starts when the first ends: one whole transfer later
        assert first >= setup + move and second - first >= 0.9 * (setup + move)
    else:                          # both move bytes at once, at half the link each: both end after 2 × move
        assert first >= setup + 2 * move and second - first < 0.5 * move
    assert second < 2 * (setup + move) + 0.5      # host slack: the test server and the event loop's timers
