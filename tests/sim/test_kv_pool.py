"""sim/engine.py with sim/prefix_cache.py: one KV block pool — requests sharing a cached prefix hold its blocks
once, and the blocks running requests take are the ones the prefix cache can no longer keep."""
from __future__ import annotations

import asyncio

from epdbench.physics.costmodel import CostModel
from epdbench.sim.engine import Engine, Sequence
from epdbench.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes
from epdbench.specs.models import EngineSpec, HardwareSpec, ModelSpec

TINY = ModelSpec(name="toy/tiny", params_b=1.0, n_layers=4, hidden_size=256, n_heads=4, n_kv_heads=2, head_dim=64)
TOY_GPU = HardwareSpec(gpu="toy", bf16_tflops=20, hbm_tb_s=1.0, compute_efficiency=1.0, hbm_efficiency=1.0,
                       step_overhead_ms=1.0, nvlink_gb_s=100, tcp_gb_s=1.0, rdma_nic_gbit_s=100,
                       output_us_per_token=0.0)
PREFIX = list(range(4 * BLOCK_TOKENS))                      # 4 full blocks every prompt below starts with


class Clock:
    """Modelled time only: a sleep moves the clock."""

    def __init__(self):
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    async def sleep(self, d: float) -> None:
        self.now += d
        await asyncio.sleep(0)


def pooled(blocks: int, clock: Clock | None = None, **limits) -> Engine:
    kw = {} if clock is None else {"clock": clock.clock, "sleep": clock.sleep}
    e = Engine(CostModel(TINY, TOY_GPU), EngineSpec(num_gpu_blocks_override=blocks, **limits), **kw)
    e.prefix_cache = PrefixCache(e.kv_blocks)
    return e


def looked_up(e: Engine, rid: str, ids: list[int], max_tokens: int) -> Sequence:
    """A request after its prefix-cache lookup, as sim.replica / sim.vcluster make it."""
    seq = Sequence(rid, len(ids), max_tokens, block_hashes=block_hashes(ids))
    seq.computed = seq.cached = e.prefix_cache.lookup(len(ids), seq.block_hashes)
    seq.hit = seq.cached // BLOCK_TOKENS
    return seq


def test_requests_sharing_a_cached_prefix_hold_its_blocks_once_and_run_together(serve):
    e = pooled(10, max_num_batched_tokens=512)
    asyncio.run(serve(e, [looked_up(e, "warm", PREFIX + [900], 1)]))
    assert len(e.prefix_cache.cached_free()) == 4
    seqs = [looked_up(e, f"r{i}", PREFIX + [1000 + 20 * i + k for k in range(17)], 4) for i in range(3)]
    assert [s.cached for s in seqs] == [64] * 3 and e.used_blocks() == 0   # nothing held before admission
    for s in seqs:
        e.submit(s)
    _, scheduled, _ = e.plan_step()
    assert e.prefix_cache.held_blocks == 4 and all(s.shared == block_hashes(PREFIX) for s in seqs)
    # each needs 2 blocks beyond the shared 4 (81 tokens: 6 blocks): 4 + 3 × 2 = 10, all of the cache; counted
    # each on its own (6 blocks) only one would fit
    assert [s for s, _ in scheduled] == seqs and e.stats.preemptions == 0


def test_blocks_running_requests_take_evict_the_cached_prefixes_least_recently_freed_first(serve):
    e = pooled(10, max_num_batched_tokens=512)
    a = PREFIX + [900]                                      # 4 full blocks and a partial one
    asyncio.run(serve(e, [looked_up(e, "a", a, 1)]))
    assert looked_up(e, "again", a, 1).cached == 64 and e.used_blocks() == 0
    assert e.prefix_cache.cached_free() == block_hashes(a)[::-1]
    big = looked_up(e, "big", list(range(5000, 5000 + 8 * BLOCK_TOKENS - 4)), 1)   # 8 blocks of the 10
    e.submit(big)
    e.plan_step()
    assert e.prefix_cache.cached_free() == block_hashes(a)[1::-1]   # a's tail went first; 2 free blocks left
    assert looked_up(e, "late", a, 1).cached == 2 * BLOCK_TOKENS



def test_under_pressure_every_block_comes_back_once_requests_finish_or_are_preempted(serve):
    """Requests sharing a prefix in a cache too small for all of them: decodes preempt, recomputes follow, and
    when all are done no block is left held and the free queue holds at most the cache."""
    clock = Clock()
    e = pooled(16, clock, max_num_batched_tokens=256)
    seqs: list[Sequence] = []

    async def go() -> None:
        await serve(e, [looked_up(e, "warm", PREFIX + [900], 1)])
        # all 4 are admitted at once (the prefix's 4 blocks shared, 2 more each); growing, they preempt each other
        seqs.extend(looked_up(e, f"r{i}", PREFIX + [2000 + 40 * i + k for k in range(20)], 40) for i in range(4))
        await serve(e, seqs)
    asyncio.run(go())
    assert e.stats.preemptions > 0 and all(s.generated == 40 for s in seqs)
    assert e.used_blocks() == 0 and e.prefix_cache.held_blocks == 0
    assert e.prefix_cache.room == 16 and len(e.prefix_cache.cached_free()) <= 16
    assert looked_up(e, "after", PREFIX + [1], 1).cached == 64     # the shared prefix survived: freed last
    # a preempted request recomputes only what of its prompt left the cache, plus the tokens it had generated
    recomputed = e.stats.prompt_tokens_computed - 65 - sum(84 - 64 for _ in seqs)
    assert 0 < recomputed < sum(s.preemptions for s in seqs) * (84 - 64 + 40)
