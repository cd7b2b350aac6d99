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
sequence cached meanwhile stays its computer's own, uncached (vLLM keeps both copies cached).

Prompts run to thousands of blocks, so the pool keeps runs of blocks, not blocks: a run is a contiguous
stretch of one prompt's blocks in one state (held by the same sequences, or free and next to each other in the
free queue, last block first), found by its first block's hash. Sequences hold leading blocks of their
prompts and free them last first, so a prompt meets a run at its first block; a hit or a block taken back
takes the front of a run, eviction its back; and a block whose predecessor is not cached is not cached
either (the free queue evicts a block after those that follow it). A request's work is per run, not per
block. tests/sim/test_prefix_cache.py checks every lookup, hit and free block, and the order of eviction,
against a model of vLLM's pool one block at a time."""
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


class _Run:
    """Blocks chain[lo:hi] of one chain of block hashes, in one state: held by `refs` sequences (the same
    ones for every block), or free (refs 0: in the free queue, evicted from hi down)."""
    __slots__ = ("chain", "lo", "hi", "refs")

    def __init__(self, chain: list[int], lo: int, hi: int, refs: int):
        self.chain, self.lo, self.hi, self.refs = chain, lo, hi, refs


class PrefixCache:
    def __init__(self, free_blocks: int, block: int = BLOCK_TOKENS):
        self.block = block
        self.room = max(0, free_blocks)          # the engine's free KV blocks: the free queue holds no more
        self._starts: dict[int, _Run] = {}       # every run by the hash of its first block
        self._free: dict[object, int] = {}       # the free queue, least recently freed first (a dict keeps the
        # order of insertion): free runs (→ 1) and a sequence's uncached blocks, freed together (→ how many)
        self._free_blocks = 0                    # blocks in the free queue (runs counted in full)
        self._held_blocks = 0
        self._runs = 0

    @property
    def held_blocks(self) -> int:
        """Cached blocks held by sequences (each counted once however many share it)."""
        return self._held_blocks

    def cached_free(self) -> list[int]:
        """Hashes of the cached blocks nobody holds, the next evicted first."""
        out: list[int] = []
        for run in self._free:
            if type(run) is _Run:
                out.extend(reversed(run.chain[run.lo:run.hi]))
        return out

    def _pieces(self, hashes: list[int], pos: int, limit: int) -> tuple[list[tuple[_Run, int, int]], int]:
        """The leading cached run of hashes[pos:limit] as (run, start, end) pieces, and where it ends. A block's
        hash chains everything before it, so where a prompt and a run's chain agree on a block they agree on
        every block before it: the agreement within a run ends where a binary search says."""
        starts = self._starts
        out = []
        while pos < limit:
            run = starts.get(hashes[pos])
            if run is None:
                break
            end = min(run.hi, limit)
            chain = run.chain
            if chain is not hashes and chain[end - 1] != hashes[end - 1]:
                lo, hi = pos + 1, end - 1            # chain[lo - 1] agrees, chain[hi] does not
                while lo < hi:
                    mid = (lo + hi) // 2
                    if chain[mid] == hashes[mid]:
                        lo = mid + 1
                    else:
                        hi = mid
                end = lo
            out.append((run, pos, end))
            pos = end
        return out, pos

    def lookup(self, n_tokens: int, hashes: list[int]) -> int:
        """Tokens of the longest run of cached leading blocks of a prompt of `n_tokens` whose block_hashes are
        `hashes` (held or free; nothing is touched); at least the last prompt token is always recomputed, so
        the full blocks of ids[:-1] count: a block's hash depends only on what precedes it."""
        return self._pieces(hashes, 0, min(len(hashes), max(0, n_tokens - 1) // self.block))[1] * self.block

    def probe(self, hashes: list[int]) -> int:
        """Of the leading run of `hashes` still cached, how many other sequences hold (acquiring the others
        takes them off the free queue)."""
        return sum(end - pos for run, pos, end in self._pieces(hashes, 0, len(hashes))[0] if run.refs)

    def acquire(self, hashes: list[int]) -> list[int]:
        """Hold the leading run of `hashes` still cached (a reference each; a free one leaves the free queue, so
        it cannot be evicted); returns the hashes held."""
        pieces, n = self._pieces(hashes, 0, len(hashes))
        for run, pos, end in pieces:
            part = self._front(run, end)
            if run.refs:
                part.refs += 1
            else:                                # free blocks now held
                if part is run:
                    del self._free[run]
                part.refs = 1
                self._free_blocks -= end - pos
                self._held_blocks += end - pos
                self.room -= end - pos
        return hashes[:n]

    def register(self, hashes: list[int], holds: list[int]) -> None:
        """A sequence's prompt KV is complete: its full blocks (`hashes`, in order) beyond the `holds` it already
        holds become cached and held by it (appended to `holds`). One still free in the cache (the same prompt's
        earlier copy) is taken back; one another sequence holds leaves this sequence's copy uncached, and so
        does every later block."""
        start = len(holds)
        cut = len(hashes)
        for run, pos, end in self._pieces(hashes, start, cut)[0]:
            if run.refs:                         # held by another sequence (so are the blocks before it)
                cut = pos
                break
            if self._front(run, end) is run:     # free: taken back
                del self._free[run]
            del self._starts[hashes[pos]]
            self._free_blocks -= end - pos
        if cut > start:
            self._starts[hashes[start]] = _Run(hashes, start, cut, 1)
            self._held_blocks += cut - start
            holds.extend(hashes[start:cut])

    def _front(self, run: _Run, end: int) -> _Run:
        """A run's blocks before `end` as a run in the same state (the run itself if that is all of it); the rest
        keeps the run's place in the free queue. A piece of a prompt always starts at its run's first block:
        runs are found by that block's hash."""
        if end == run.hi:
            return run
        part = self._starts[run.chain[run.lo]] = _Run(run.chain, run.lo, end, run.refs)
        run.lo = end
        self._starts[run.chain[end]] = run
        return part

    def release(self, holds: list[int], uncached: int) -> int:
        """A sequence frees its blocks, last first: its `uncached` own blocks, then the cached ones it holds
        (`holds`, emptied) from last to first; a cached block nobody else holds joins the free queue. Returns
        the blocks that became free."""
        free = self._free
        freed = max(0, uncached)
        if freed:
            self._runs += 1
            free[("uncached", self._runs)] = freed
        gone = 0
        for run, _, _ in reversed(self._pieces(holds, 0, len(holds))[0]):   # each held by this sequence in full
            if run.refs > 1:
                run.refs -= 1
            else:
                run.refs = 0
                free[run] = 1
                gone += run.hi - run.lo
        self._held_blocks -= gone
        freed += gone
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
            if type(key) is _Run:                # a run loses its last blocks first
                n = key.hi - key.lo
                if n > excess:
                    key.hi -= excess
                    break
                del self._starts[key.chain[key.lo]]
            elif n > excess:                     # the front of a run of uncached blocks
                free[key] = n - excess
                break
            evicted.append(key)
            excess -= n
            if not excess:
                break
        deque(map(free.__delitem__, evicted), maxlen=0)
