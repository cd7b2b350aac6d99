"""sim/prefix_cache.py: vLLM's automatic prefix caching as part of the KV block pool — chained block hashes,
the longest cached run of leading blocks, shared blocks held by reference, free blocks evicted in the order
they were freed as the engine allocates."""
import random

import pytest

from epdbench.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes


class ReferencePool:
    """vLLM's BlockPool one physical block at a time: `n` blocks, each with an optional hash and a reference
    count; free blocks in one list, allocation from its front (evicting a cached block it takes), freeing to
    its back; a hash maps to its cached block."""

    def __init__(self, n: int):
        self.free = [[None, 0] for _ in range(n)]   # [hash, refs]
        self.by_hash: dict[int, list] = {}

    def acquire(self, ids: list[int]) -> list[list]:
        got = []
        for h in block_hashes(ids[:-1]):
            b = self.by_hash.get(h)
            if b is None:
                break
            if b[1] == 0:
                self.free.remove(b)
            b[1] += 1
            got.append(b)
        return got

    def allocate(self, n: int) -> list[list]:
        taken = [self.free.pop(0) for _ in range(n)]
        for b in taken:
            if b[0] is not None:
                del self.by_hash[b[0]]
            b[0], b[1] = None, 1
        return taken

    def register(self, ids: list[int], holds: list[list], own: list[list]) -> None:
        """The prompt's full blocks beyond those held: one of the sequence's own blocks takes each hash; a hash
        already cached and free is taken instead (the own block goes back to the front, uncached); one held
        by another sequence stops it."""
        for h in block_hashes(ids)[len(holds):]:
            b = self.by_hash.get(h)
            if b is not None and b[1] > 0:
                break
            mine = own.pop()
            if b is None:
                mine[0] = h
                self.by_hash[h] = mine
                holds.append(mine)
            else:
                self.free.remove(b)
                b[1] = 1
                holds.append(b)
                mine[1] = 0
                self.free.insert(0, mine)

    def release(self, holds: list[list], own: list[list]) -> None:
        for b in own[::-1] + holds[::-1]:          # the sequence's last blocks first
            b[1] -= 1
            if b[1] == 0:
                self.free.append(b)

    def cached_free(self) -> list[int]:
        return [b[0] for b in self.free if b[0] is not None]


def take(cache: PrefixCache, ids: list[int], hashes: list[int] | None = None) -> list[int]:
    """Look a prompt up and hold its hit, as a request the engine admits."""
    hashes = block_hashes(ids) if hashes is None else hashes
    return cache.acquire(hashes[:cache.lookup(len(ids), hashes) // BLOCK_TOKENS])


def test_a_prompt_reuses_the_longest_cached_run_of_its_leading_blocks_and_recomputes_its_last_token():
    cache = PrefixCache(free_blocks=64)
    a = list(range(100))                                    # 6 full blocks and 4 tokens
    holds = take(cache, a)
    assert holds == []
    cache.fit(cache.room - 7)                               # its 7 blocks
    cache.register(block_hashes(a), holds)
    cache.release(holds, 1)                                 # and its partial block
    assert len(take(cache, a)) * BLOCK_TOKENS == 96       # the last token is recomputed: ids[:-1] has 6 blocks
    assert len(take(cache, a[:96])) * BLOCK_TOKENS == 80  # exactly 6 blocks: the 6th holds the last token
    b = a[:40] + [999] + a[41:]                             # differs in block 2: blocks 2.. have other hashes
    assert len(take(cache, b)) * BLOCK_TOKENS == 32
    assert cache.held_blocks == 6                           # shared: a's blocks counted once


@pytest.mark.parametrize("seed", [7, 11, 23, 42, 99])
def test_acquire_register_release_and_allocation_keep_the_blocks_and_order_of_vllms_block_pool(seed):
    """Random requests sharing prefixes come and go in a pool small enough to evict; a request's prompt is
    registered some time after its admission (others sharing its prefix may register it first, or free theirs
    meanwhile) and it may leave before that (preempted). Every lookup, probe and hit is the reference's, and
    the cached free blocks are the same, in the same order of eviction."""
    rng = random.Random(seed)
    n = 96
    stems = [[rng.randrange(50_000) for _ in range(rng.randrange(16, 400))] for _ in range(12)]
    cache, ref = PrefixCache(free_blocks=n), ReferencePool(n)
    live: list[dict] = []
    evicted = taken_back = 0
    for _ in range(1500):
        r = rng.random()
        pending = [s for s in live if not s["registered"]]
        if pending and r < 0.3:
            s = rng.choice(pending)
            hit = len(s["holds"])
            before = sum(1 for b in ref.free if b[0] is not None)
            ref.register(s["ids"], s["ref_holds"], s["ref_own"])
            taken_back += before - sum(1 for b in ref.free if b[0] is not None)
            cache.register(block_hashes(s["ids"]), s["holds"])
            assert len(s["holds"]) == len(s["ref_holds"])
            s["registered"], s["uncached"] = True, s["own"] - (len(s["holds"]) - hit)
        elif live and (r < 0.6 or len(live) > 6):
            s = live.pop(rng.randrange(len(live)))
            ref.release(s["ref_holds"], s["ref_own"])
            cache.release(s["holds"], s["uncached"])
        else:
            ids = (rng.choice(stems)[:rng.randrange(1, 400)]
                   + [rng.randrange(50_000) for _ in range(rng.randrange(0, 64))])
            hashes = block_hashes(ids)
            cached = hashes[:(len(ids) - 1) // BLOCK_TOKENS]
            ref_hit = next((i for i, h in enumerate(cached) if h not in ref.by_hash), len(cached))
            assert cache.lookup(len(ids), hashes) == ref_hit * BLOCK_TOKENS
            assert cache.probe(cached[:ref_hit]) == sum(ref.by_hash[h][1] > 0 for h in cached[:ref_hit])
            holds, ref_holds = take(cache, ids, hashes if rng.random() < 0.5 else None), ref.acquire(ids)
            assert len(holds) == len(ref_holds) and cache.room == len(ref.free)
            own = -(-(len(ids) + rng.randrange(0, 40)) // BLOCK_TOKENS) - len(holds)   # prompt and output
            if own > len(ref.free):                         # it does not fit: it gives its hit back
                ref.release(ref_holds, [])
                cache.release(holds, 0)
                continue
            before = len(ref.by_hash)
            ref_own = ref.allocate(own)
            cache.fit(cache.room - own)
            evicted += before - len(ref.by_hash)
            live.append({"ids": ids, "holds": holds, "ref_holds": ref_holds, "own": own, "ref_own": ref_own,
                         "registered": False, "uncached": own})
        assert cache.cached_free() == ref.cached_free()
        assert cache.held_blocks == sum(1 for b in ref.by_hash.values() if b[1] > 0)
        assert cache.room == len(ref.free)
    assert evicted > 50 and taken_back > 0                  # the pool was under pressure; copies were taken back


def test_under_pressure_a_prompt_loses_its_tail_before_its_head():
    """vLLM frees a request's blocks last block first, so eviction takes a prompt's tail and keeps the head
    that later prompts sharing it can still hit; evicting the head first would leave its tail unreachable."""
    cache = PrefixCache(free_blocks=9)
    a = list(range(6 * BLOCK_TOKENS + 1))                   # 6 full blocks and a partial one
    b = list(range(10_000, 10_000 + 4 * BLOCK_TOKENS + 1))  # 5 more: a's partial and 2 full blocks must go
    for ids in (a, b):
        holds = take(cache, ids)
        cache.fit(cache.room - len(block_hashes(ids)) - 1)
        cache.register(block_hashes(ids), holds)
        cache.release(holds, 1)
    assert len(take(cache, a)) == 4                       # a's first 4 blocks are still there
    assert len(take(cache, b)) == 4


def test_a_held_block_is_never_evicted_and_running_requests_shrink_what_the_cache_keeps():
    cache = PrefixCache(free_blocks=10)
    a = list(range(4 * BLOCK_TOKENS + 1))                   # 4 full blocks
    holds = take(cache, a)
    cache.fit(cache.room - 5)
    cache.register(block_hashes(a), holds)
    cache.fit(0)                                            # the engine allocated every free block
    assert cache.held_blocks == 4 and len(take(cache, a)) == 4
    cache.release(holds, 1)                                 # one of two holders is done: still held
    assert cache.held_blocks == 4 and cache.cached_free() == []
    cache2 = PrefixCache(free_blocks=10)
    h = take(cache2, a)
    cache2.fit(5)
    cache2.register(block_hashes(a), h)
    cache2.release(h, 1)                                    # free and cached: 4 of 10 blocks
    assert len(cache2.cached_free()) == 4
    cache2.fit(2)                                           # running requests now hold all but 2 blocks
    assert cache2.cached_free() == block_hashes(a)[1::-1]   # the head stays: freed last
    assert len(take(cache2, a)) == 2 and cache2.room == 0
