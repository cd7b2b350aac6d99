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
import contextlib

from epdbench.physics.costmodel import tokenize_seconds

BATCH_WAIT_S = 0.002    # AsyncMicrobatchTokenizer(batch_wait_timeout_s=0.002), vllm/utils/async_utils.py
MAX_BATCH = 32          # AsyncMicrobatchTokenizer(max_batch_size=32)


class ApiServer:
    def __init__(self, replica):
        self.replica = replica          # spec, time_scale and encoder of a Replica or VReplica
        self.queue: asyncio.Queue | None = None
        self.batcher: asyncio.Task | None = None
        self.current: list = []         # the batch being collected or tokenized
        self.batches = 0                # tokenizer calls, for tests and diagnostics

    async def tokenize(self, prompt_tokens: int, images: list[bytes] = ()) -> None:
        """Return when this API server has tokenized a prompt's text: its `prompt_tokens` but the placeholders of
        its `images`, which the multimodal processor expands instead."""
        text_tokens = prompt_tokens - sum(self.replica.encoder.tokens(b) for b in images)
        loop = asyncio.get_running_loop()
        if self.batcher is None:
            self.queue = asyncio.Queue()
            self.batcher = loop.create_task(self._batch_loop())
        done = loop.create_future()
        self.queue.put_nowait((text_tokens, done))
        await done

    async def _batch_loop(self) -> None:
        loop = asyncio.get_running_loop()
        r = self.replica
        while True:
            self.current = batch = [await self.queue.get()]
            deadline = loop.time() + BATCH_WAIT_S * r.time_scale
            while len(batch) < MAX_BATCH:
                timeout = deadline - loop.time()
                if timeout <= 0:
                    break
                try:
                    batch.append(await asyncio.wait_for(self.queue.get(), timeout))
                except asyncio.TimeoutError:
                    break
            seconds = tokenize_seconds(r.spec.hardware, sum(n for n, _ in batch)) * r.time_scale
            if seconds > 0:
                await asyncio.sleep(seconds)
            self.batches += 1
            for _, done in batch:
                if not done.done():
                    done.set_result(None)
            self.current = []

    async def close(self) -> None:
        """Stop the batcher; a request still waiting for it is cancelled, none is left hanging."""
        if self.batcher is None:
            return
        self.batcher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self.batcher
        self.batcher = None
        for _, done in self.current:
            done.cancel()
        while not self.queue.empty():
            self.queue.get_nowait()[1].cancel()
        self.current = []
