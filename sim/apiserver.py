"""A replica's API server CPU on the request path that is not about images: tokenizing the prompt text.

vLLM's API server tokenizes each request it is sent before the engine sees it, through one
AsyncMicrobatchTokenizer per tokenizer (vllm/utils/async_utils.py, used by the renderers): a loop takes the
first queued prompt, waits `batch_wait_timeout_s` (2 ms) for more (up to `max_batch_size`, 32), then tokenizes
the batch on a single-thread executor and starts over — so a prompt waits those 2 ms, then for the batch's
tokenizing (tokenize_seconds of the batch's text tokens: the cost of each prompt, one after another), and
prompts arriving meanwhile queue for the next batch. Every replica on a request's path does this (the server;
in PD the prefill and then the decode; in EPD the encode replica too). Shared by the HTTP simulator
(sim.replica) and the virtual-time core (sim.vcluster).
"""
from __future__ import annotations

import asyncio
from collections import deque

from epdbench.physics.costmodel import TOKENIZER_BATCH_WAIT_S, tokenize_seconds

BATCH_WAIT_S = TOKENIZER_BATCH_WAIT_S    # AsyncMicrobatchTokenizer(batch_wait_timeout_s=0.002)
MAX_BATCH = 32          # AsyncMicrobatchTokenizer(max_batch_size=32)


class ApiServer:
    """The micro-batching loop as timer callbacks on the running loop (no task of its own, so no task switch per
    prompt): idle → collecting (from the first queued prompt, until BATCH_WAIT_S later or MAX_BATCH prompts) →
    tokenizing (the batch's tokenize_seconds) → collecting again from the first prompt that queued meanwhile, or
    idle. The same times as vLLM's loop on any loop: its deadline, its full-batch cut, its queue order."""

    def __init__(self, replica):
        self.replica = replica          # spec, time_scale and encoder of a Replica or VReplica
        self.queue: deque = deque()     # (text tokens, future) not yet in a batch
        self.current: list = []         # the batch being tokenized
        self.collecting = False         # the window of the next batch is open
        self.timer: asyncio.TimerHandle | None = None
        self.batches = 0                # tokenizer calls, for tests and diagnostics

    async def tokenize(self, prompt_tokens: int, images: list[bytes] = (), after: float = 0.0) -> None:
        """Return when this API server has tokenized a prompt's text: its `prompt_tokens` but the placeholders of
        its `images`, which the multimodal processor expands instead. `after`: seconds (loop clock) before the
        prompt reaches the server — the virtual core's hop to it, waited for here as one timer."""
        text_tokens = prompt_tokens - sum(self.replica.encoder.tokens(b) for b in images)
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        if after > 0:
            loop.call_at(loop.time() + after, self._arrive, text_tokens, done)
        else:
            self._arrive(text_tokens, done)
        await done

    def _arrive(self, text_tokens: int, done: asyncio.Future) -> None:
        if done.cancelled():          # its request went away on the way
            return
        self.queue.append((text_tokens, done))
        if self.collecting:
            if len(self.queue) >= MAX_BATCH:
                self._close()
        elif not self.current:
            self._open(asyncio.get_running_loop())

    def _open(self, loop: asyncio.AbstractEventLoop) -> None:
        """The first queued prompt opens a batch's window (a full queue closes it at once)."""
        if len(self.queue) >= MAX_BATCH:
            self._close()
            return
        self.collecting = True
        self.timer = loop.call_at(loop.time() + BATCH_WAIT_S * self.replica.time_scale, self._close)

    def _close(self) -> None:
        """The window ends: tokenize what queued, up to MAX_BATCH prompts."""
        if self.timer is not None:
            self.timer.cancel()
        self.collecting = False
        self.current = [self.queue.popleft() for _ in range(min(MAX_BATCH, len(self.queue)))]
        r = self.replica
        seconds = tokenize_seconds(r.spec.hardware, sum(n for n, _ in self.current),
                                   len(self.current)) * r.time_scale
        loop = asyncio.get_running_loop()
        self.timer = loop.call_at(loop.time() + max(0.0, seconds), self._tokenized)

    def _tokenized(self) -> None:
        self.timer = None
        self.batches += 1
        for _, done in self.current:
            if not done.done():
                done.set_result(None)
        self.current = []
        if self.queue:
            self._open(asyncio.get_running_loop())

    async def close(self) -> None:
        """Stop batching; a request still waiting for it is cancelled, none is left hanging."""
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None
        self.collecting = False
        for _, done in [*self.current, *self.queue]:
            done.cancel()
        self.current = []
        self.queue.clear()
