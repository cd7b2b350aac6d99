"""sim/prefix_cache.py: vLLM's automatic prefix caching — chained block hashes, the longest cached run of
leading blocks, least recently used blocks evicted beyond the capacity."""
import random
from collections import OrderedDict

from epdbench.sim.prefix_cache import BLOCK_TOKENS, PrefixCache, block_hashes


class ReferenceCache:
    """The same rules one block at a time: a hit or an insert makes a block the most recently used; an insert
    takes a prompt's blocks from its last to its first (vLLM frees a request's blocks in reverse order)."""

    def __init__(self, capacity_tokens: int):
        self.capacity = capacity_tokens // BLOCK_TOKENS
        self.blocks: OrderedDict[int, None] = OrderedDict()

    def lookup(self, ids: list[int]) -> int:
        hit = 0
        for h in block_hashes(ids[:-1]):
            if h not in self.blocks:
                break
            self.blocks.move_to_end(h)
            hit += BLOCK_TOKENS
        return hit

    def insert(self, ids: list[int]) -> None:
        for h in block_hashes(ids)[::-1]:
            if h in self.blocks:
                self.blocks.move_to_end(h)
            else:
                self.blocks[h] = None
        while len(self.blocks) > self.capacity:
            self.blocks.popitem(last=False)


def test_a_prompt_reuses_the_longest_cached_run_of_its_leading_blocks_and_recomputes_its_last_token():
    cache = PrefixCache(capacity_tokens=64 * BLOCK_TOKENS)
    a = list(range(100))                                    # 6 full blocks and 4 tokens
    assert cache.lookup(a) == 0
    cache.insert(a)
    assert cache.lookup(a) == 96                            # the last token is recomputed: ids[:-1] has 6 blocks
    assert cache.lookup(a[:96]) == 80                       # exactly 6 blocks: the 6th holds the last token
    b = a[:40] + [999] + a[41:]                             # differs in block 2: blocks 2.. have other hashes
    assert cache.lookup(b) == 32


def test_inserts_and_lookups_keep_exactly_the_blocks_and_order_of_one_block_at_a_time():
    """Random prompts sharing prefixes, under a capacity that forces evictions: every lookup answers as the
    reference does and the cached blocks are the same, in the same least-to-most recently used order."""
    rng = random.Random(7)
    stems = [[rng.randrange(50_000) for _ in range(rng.randrange(16, 400))] for _ in range(12)]
    cache, ref = PrefixCache(capacity_tokens=90 * BLOCK_TOKENS), ReferenceCache(90 * BLOCK_TOKENS)
    for _ in range(400):
        ids = rng.choice(stems)[:rng.randrange(1, 400)] + [rng.randrange(50_000) for _ in range(rng.randrange(0, 64))]
        assert cache.lookup(ids) == ref.lookup(ids)
        if rng.random() < 0.7:
            hashes = block_hashes(ids) if rng.random() < 0.5 else None
            cache.insert(ids, hashes)
            ref.insert(ids)
        assert list(cache._blocks) == list(ref.blocks)
    assert len(ref.blocks) == 90                            # the capacity was reached: evictions happened


def test_under_pressure_a_prompt_loses_its_tail_before_its_head():
    """vLLM frees a request's blocks last block first, so eviction takes a prompt's tail and keeps the head
    that later prompts sharing it can still hit; evicting the head first would leave its tail unreachable."""
    cache = PrefixCache(capacity_tokens=8 * BLOCK_TOKENS)
    a = list(range(6 * BLOCK_TOKENS + 1))                   # 6 full blocks
    b = list(range(10_000, 10_000 + 4 * BLOCK_TOKENS + 1))  # 4 more: 2 of a's must go
    cache.insert(a)
    cache.insert(b)
    assert cache.lookup(a) == 4 * BLOCK_TOKENS              # a's first 4 blocks are still there
    assert cache.lookup(b) == 4 * BLOCK_TOKENS
