"""Automatic prefix caching as vLLM does it, as part of one block pool with the engine's KV cache
(vllm/v1/core/block_pool.py, kv_cache_manager.py, 0.33): full blocks of prompt token ids, chained hashes,
a request reuses the longest run of cached leading blocks.

- A request looks its prefix up when it arrives (`lookup`: vLLM when it schedules it) and takes the blocks
  when the engine admits it (`acquire`): a cached block is then held by sequences (a reference count:
  sequences sharing a prefix share its blocks, counted once in the KV cache) or else free; a held block
  leaves the free queue and cannot be evicted.
- Free blocks wait in one queue in the order they were freed; allocating a block takes the least recently freed
  one, and a cached block taken so is evicted. The queue never holds more blocks than the engine has free
  (`fit`), so running requests shrink what the cache can keep.
- A request frees its blocks last block first (`SingleTypeKVCacheManager.free`: "we free the blocks in reverse
  order so that the tail blocks are evicted first"): its generated and partial blocks (uncached: no later
  prompt can match them), then its prompt's blocks from the last to the first. So under pressure a prompt
  loses its tail before its head; the other order would evict the first block, and since a block's hash chains
  everything before it, the blocks left behind could never be hit again.

Simplifications: blocks evicted between a request's arrival and its admission still count as its hit
(computed for free; its KV blocks are counted all the same); a sequence's prompt blocks become cached when
its prompt's KV is complete (vLLM: as each chunk is scheduled); blocks of generated tokens are never hit
(vLLM caches them too, but only the same conversation continued could match them); a block another
sequence cached meanwhile stays its computer's own, uncached (vLLM keeps both copies cached)."""
from __future__ import annotations

from collections import deque

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
    def __init__(self, free_blocks: int, block: int = BLOCK_TOKENS):
        self.block = block
        self.room = max(0, free_blocks)          # the engine's free KV blocks: the free queue holds no more
        self._free: dict[object, int] = {}       # freed blocks, least recently freed first (a dict keeps the
        # order of insertion): a cached block by its hash (→ 1), a sequence's uncached blocks, freed together, as
        # one run (→ how many). Prompts run to thousands of blocks: whole-list operations below, run in C.
        self._free_blocks = 0                    # blocks in the free queue (runs counted in full)
        self._held: dict[int, int] = {}          # cached blocks sequences hold: hash → references
        self._runs = 0

    @property
    def held_blocks(self) -> int:
        """Cached blocks held by sequences (each counted once however many share it)."""
        return len(self._held)

    def cached_free(self) -> list[int]:
        """Hashes of the cached blocks nobody holds, the next evicted first."""
        return [h for h in self._free if not isinstance(h, tuple)]

    def lookup(self, n_tokens: int, hashes: list[int]) -> int:
        """Tokens of the longest run of cached leading blocks of a prompt of `n_tokens` whose block_hashes are
        `hashes` (held or free; nothing is touched); at least the last prompt token is always recomputed, so
        the full blocks of ids[:-1] count: a block's hash depends only on what precedes it."""
        held, free = self._held, self._free
        n = 0
        for h in hashes[:max(0, n_tokens - 1) // self.block]:
            if h not in held and h not in free:
                break
            n += 1
        return n * self.block

    def probe(self, hashes: list[int]) -> int:
        """Of the leading run of `hashes` still cached, how many other sequences hold (acquiring the others
        takes them off the free queue)."""
        held, free = self._held, self._free
        shared = 0
        for h in hashes:
            if h in held:
                shared += 1
            elif h not in free:
                break
        return shared

    def acquire(self, hashes: list[int]) -> list[int]:
        """Hold the leading run of `hashes` still cached (a reference each; a free one leaves the free queue, so
        it cannot be evicted); returns the hashes held."""
        held, free = self._held, self._free
        got: list[int] = []
        for h in hashes:
            if h in held:
                held[h] += 1
            elif h in free:
                del free[h]
                self._free_blocks -= 1
                held[h] = 1
                self.room -= 1               # a free block now held
            else:
                break
            got.append(h)
        return got

    def register(self, hashes: list[int], holds: list[int]) -> None:
        """A sequence's prompt KV is complete: its full blocks (`hashes`, in order) beyond the `holds` it already
        holds become cached and held by it (appended to `holds`). One still free in the cache (the same prompt's
        earlier copy) is taken back; one another sequence holds leaves this sequence's copy uncached, and so
        does every later block."""
        held, free = self._held, self._free
        new = hashes[len(holds):]
        if not held.keys().isdisjoint(new):
            new = new[:next(i for i, h in enumerate(new) if h in held)]
        if not free.keys().isdisjoint(new):
            for h in new:
                if free.pop(h, 0):
                    self._free_blocks -= 1
        held.update(dict.fromkeys(new, 1))
        holds.extend(new)

    def release(self, holds: list[int], uncached: int) -> int:
        """A sequence frees its blocks, last first: its `uncached` own blocks, then the cached ones it holds
        (`holds`, emptied) from last to first; a cached block nobody else holds joins the free queue. Returns
        the blocks that became free."""
        free, held = self._free, self._held
        freed = max(0, uncached)
        if freed:
            self._runs += 1
            free[("uncached", self._runs)] = freed
        last_first = holds[::-1]
        if max(map(held.__getitem__, last_first), default=1) == 1:   # nobody else holds any: all go free
            gone = last_first
            deque(map(held.__delitem__, gone), maxlen=0)
        else:
            gone = []
            for h in last_first:
                if held[h] > 1:
                    held[h] -= 1
                else:
                    del held[h]
                    gone.append(h)
        free.update(dict.fromkeys(gone, 1))
        freed += len(gone)
        self._free_blocks += freed
        holds.clear()
        self.room += freed
        return freed

    def fit(self, free_blocks: int) -> None:
        """The engine now has `free_blocks` free: blocks it allocated came off the front of the free queue,
        evicting the cached ones among them."""
        self.room = max(0, free_blocks)
        self._evict()

    def _evict(self) -> None:
        free = self._free
        excess = self._free_blocks - self.room
        if excess <= 0:
            return
        self._free_blocks -= excess
        evicted = []
        for key, n in free.items():
            if n > excess:                   # the front of a run of uncached blocks
                free[key] = n - excess
                break
            evicted.append(key)
            excess -= n
            if not excess:
                break
        deque(map(free.__delitem__, evicted), maxlen=0)
