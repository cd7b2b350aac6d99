"""Decode steps fused into one event, for the virtual-time core (pure).

A step with only decodes, planned without a preemption, is followed by more steps of the same decodes for as
long as nothing the scheduler reads can change: no sequence finishes (its max_tokens) before the last of them,
every decode still finds the KV block its next token needs (free blocks only shrink meanwhile, so nothing
waiting becomes admissible either), and no request arrives or leaves — which only the engine knows as it
happens, so it cuts the stretch there (sim.engine.Engine). Over such a stretch the step durations follow from
the decodes' context sum alone (CostModel.decode_law, the law step_seconds evaluates for a decode-only step),
so the virtual core computes them in one go instead of planning, timing and sleeping each step: the same
steps, ends and tokens, at a fraction of the host time.
"""
from __future__ import annotations

import itertools

from epdbench.physics.costmodel import CostModel
from epdbench.sim.prefix_cache import BLOCK_TOKENS

MAX_STEPS = 1024     # one stretch at most: bounds the work done before the engine looks at its queue again


def decode_stretch(cost: CostModel, kv: list[int], remaining: list[int], free_blocks: int, first_end: float,
                   first_duration: float, time_scale: float = 1.0, max_steps: int = MAX_STEPS
                   ) -> tuple[list[float], list[float]]:
    """The ends (host clock) and modelled durations of the steps of a decode stretch, the first one given.

    kv: each decode's tokens in the KV cache plus its last sampled one (its context) at the first step;
    remaining: tokens each has left to generate, the first step's included; free_blocks: KV blocks free after
    the first step took the blocks its tokens needed. Step i (from 0) serves contexts kv + i; it needs a new
    block for each decode whose kv + i − 1 fills whole blocks, and is not in the stretch when they do not fit."""
    n, steps = len(kv), min(min(remaining), max_steps)
    needs_at = [0] * BLOCK_TOKENS         # decodes needing a block at steps i ≡ r (mod BLOCK_TOKENS)
    for k in kv:
        needs_at[(1 - k) % BLOCK_TOKENS] += 1
    for i in range(1, steps):             # the first step whose blocks do not fit ends the stretch before it
        needs = needs_at[i % BLOCK_TOKENS]
        if needs > free_blocks:
            steps = i
            break
        free_blocks -= needs
        if free_blocks >= n * ((steps - i) // BLOCK_TOKENS + 1):
            break       # every later step's blocks fit: a decode needs one per BLOCK_TOKENS steps
    law = cost.decode_law(n)   # CostModel.decode_step_seconds
    context_sum = sum(kv)
    durations = [first_duration] + [law(s) for s in range(context_sum + n, context_sum + steps * n, n)]
    ends = list(itertools.accumulate((duration * time_scale for duration in durations[1:]), initial=first_end))
    return ends, durations
