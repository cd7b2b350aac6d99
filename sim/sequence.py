"""One request as a simulated engine holds it (sim.engine): its prompt, what of it is computed and cached, the
tokens generated, its KV blocks' place in the scheduler's order, and the modelled times its span reports."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from epdbench.sim.prefix_cache import BLOCK_TOKENS


@dataclass
class Sequence:
    request_id: str
    prompt_tokens: int
    max_tokens: int
    image_tokens: list[int] = field(default_factory=list)   # LM tokens of each image this engine must encode
    pass_launched: bool = False      # its vision pass's fixed time was spent in a step before its encoding (sim.engine)
                                                            # with its first prefill chunk
    computed: int = 0              # prompt tokens already in the KV cache (and recomputed ones after a preemption)
    cached: int = 0                # of which found in the prefix cache
    generated: int = 0
    out: asyncio.Queue = field(default_factory=asyncio.Queue)
    finish_reason: str | None = None
    aborted: bool = False
    block_hashes: list[int] | None = None   # its prompt's full blocks (sim.prefix_cache); None: not cached
    hit: int = 0                   # prefix-cache blocks its lookup found: taken when it is admitted
    shared: list[int] = field(default_factory=list)   # the prefix cache's blocks it holds, in prompt order
    arrived: float | None = None   # host clock at submit: no step that serves it can start earlier
    admitted: int | None = None    # when it got KV blocks (vLLM's running order); None while it holds none
    recompute_tokens: int = 0      # generated tokens a preemption dropped from the KV: prefilled again
    preemptions: int = 0
    reported_cached: int | None = None   # the cached tokens its usage reports, when not its own (a PD decode
                                         # reports its prefill's: sim.responses.usage)
    # the modelled timeline it went through (host clock), for its span (sim.spans): first step that served it,
    # the end of the step that completed its prefill, when its first and last tokens left the API server
    scheduled_at: float | None = None
    prefill_end_at: float | None = None
    first_token_at: float | None = None
    last_token_at: float | None = None

    @property
    def context(self) -> int:
        return self.computed + self.generated

    @property
    def prefill_end(self) -> int:
        """Where its prefill ends: the prompt, plus the generated tokens to recompute after a preemption."""
        return self.prompt_tokens + self.recompute_tokens


def blocks(tokens: int) -> int:
    """KV cache blocks that hold `tokens` tokens."""
    return -(-tokens // BLOCK_TOKENS)


def new_blocks(decodes: list[Sequence]) -> int:
    """KV blocks a step of these decodes takes: one for each whose KV so far fills whole blocks."""
    return sum(1 for s in decodes if (s.computed + s.generated - 1) % BLOCK_TOKENS == 0)


def admission_order(seq: Sequence) -> int:
    """A running sequence's place: the order it was admitted in (vLLM's running list)."""
    return -1 if seq.admitted is None else seq.admitted


def drop(queue, seq: Sequence) -> bool:
    """Remove `seq` (by identity) from a list or deque; whether it was there."""
    for i, s in enumerate(queue):
        if s is seq:
            del queue[i]
            return True
    return False
