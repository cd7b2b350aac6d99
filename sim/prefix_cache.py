"""Automatic prefix caching as vLLM does it: full blocks of prompt token ids, chained hashes, LRU
eviction within the KV capacity. A request reuses the longest run of cached leading blocks.

A prompt's blocks become the most recently used in reverse order, its last block first and its first block
last, so that under pressure a prompt loses its tail before its head, as vLLM frees a request's blocks
(`SingleTypeKVCacheManager.free`, vllm/v1/core/single_type_kv_cache_manager.py, 0.33: "we free the blocks in
reverse order so that the tail blocks are evicted first"; its free block queue evicts from the front). The
other order would evict a prompt's first block first, and since a block's hash chains everything before it,
the blocks left behind could never be hit again."""
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

    def lookup(self, ids: list[int], hashes: list[int] | None = None) -> int:
        """Tokens of the longest cached prefix; at least the last prompt token is always recomputed. `hashes`:
        block_hashes(ids) if the caller has them (a block's hash depends only on what precedes it, so the full
        blocks of ids[:-1] are their first (len(ids) − 1) // block)."""
        hit = 0
        hs = (block_hashes(ids[:-1], self.block) if hashes is None
              else hashes[:max(0, len(ids) - 1) // self.block])
        for h in hs:
            if h not in self._blocks:
                break
            self._blocks.move_to_end(h)
            hit += self.block
        return hit

    def insert(self, ids: list[int], hashes: list[int] | None = None) -> None:
        """Cache the full blocks of `ids` (`hashes`: their block_hashes if the caller has them), the last block
        first, so the first is the most recently used (evicted last)."""
        blocks = self._blocks
        touch = blocks.move_to_end
        for h in reversed(block_hashes(ids, self.block) if hashes is None else hashes):
            if h in blocks:
                touch(h)              # most recently used
            else:
                blocks[h] = None      # a new key goes last
        while len(blocks) > self.capacity_blocks:
            blocks.popitem(last=False)
