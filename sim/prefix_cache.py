"""Automatic prefix caching as vLLM does it: full blocks of prompt token ids, chained hashes, LRU
eviction within the KV capacity. A request reuses the longest run of cached leading blocks."""
from __future__ import annotations

from collections import OrderedDict

BLOCK_TOKENS = 16   # vLLM's KV cache block on CUDA: CacheConfig.DEFAULT_BLOCK_SIZE (vllm/config/cache.py, 0.33)


def block_hashes(ids: list[int], block: int = BLOCK_TOKENS) -> list[int]:
    """Chained hash of every full block: a block's identity includes everything before it."""
    out: list[int] = []
    h = 0
    for i in range(0, len(ids) - len(ids) % block, block):
        h = hash((h, tuple(ids[i:i + block])))
        out.append(h)
    return out


class PrefixCache:
    def __init__(self, capacity_tokens: int, block: int = BLOCK_TOKENS):
        self.capacity_blocks = max(0, capacity_tokens // block)
        self.block = block
        self._blocks: OrderedDict[int, None] = OrderedDict()

    def lookup(self, ids: list[int]) -> int:
        """Tokens of the longest cached prefix; at least the last prompt token is always recomputed."""
        hit = 0
        for h in block_hashes(ids[:-1], self.block):
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit += self.block
        return hit

    def insert(self, ids: list[int]) -> None:
        for h in block_hashes(ids, self.block):
            self._blocks[h] = None
            self._blocks.move_to_end(h)
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
