"""A lone request's engine times: what one engine spends on a request that has it to itself (no other request
running or waiting), from the cost model's step laws alone (pure).

The simulator's engine (sim.engine) serves such a request so: its prompt in chunks of at most
max_num_batched_tokens (the first chunk also encoding its images, wherever its prefix-cache hit ends), the step that
completes the prompt sampling the first token; then one decode step per further token, the k-th over a context of
the prompt and k tokens. So, as vLLM reports a request's phases (vllm/v1/metrics/stats.py
`update_from_finished_request`): its prefill time (first scheduled → first token) is the sum of its prefill
steps, its decode time (first token → last) the sum of its decode steps, and its queue time nothing. A closed loop
at concurrency 1 sends each request when the last has ended, so each of its requests is lone.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from epdbench.physics.costmodel import CostModel, PrefillChunk
from epdbench.specs.node import EngineSpec


@dataclass(frozen=True)
class LoneTimes:
    prefill_s: float     # first scheduled → the step that samples the first token ends
    decode_s: float      # first token → last token: output_tokens − 1 decode steps

    def decode_per_token_s(self, output_tokens: int) -> float | None:
        """Decode time per output token after the first (vLLM's time per output token); None under 2 tokens."""
        return self.decode_s / (output_tokens - 1) if output_tokens > 1 else None


def lone_request(cost: CostModel, engine: EngineSpec, prompt_tokens: int, image_tokens: Sequence[int],
                 output_tokens: int, cached_tokens: int = 0) -> LoneTimes:
    """Engine times of a lone request of `prompt_tokens` prompt tokens (images' tokens included; `cached_tokens` of
    them found in the prefix cache), images of `image_tokens` LM tokens each, and `output_tokens` tokens out."""
    if prompt_tokens < 1 or output_tokens < 1 or not 0 <= cached_tokens < prompt_tokens:
        raise ValueError(f"a request of {prompt_tokens} prompt tokens ({cached_tokens} cached) and {output_tokens} "
                         "out: give at least one prompt token not cached and one token out")
    prefill, done, images = 0.0, cached_tokens, [n for n in image_tokens if n]
    while done < prompt_tokens:
        tokens = min(prompt_tokens - done, engine.max_num_batched_tokens)
        prefill += cost.step_seconds([], [PrefillChunk(done, tokens)], images)
        done, images = done + tokens, []
    decode = sum(cost.decode_step_seconds(1, prompt_tokens + k) for k in range(1, output_tokens))
    return LoneTimes(prefill, decode)
