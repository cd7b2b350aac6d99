"""A replica's API server CPU on the request path that is not about images: tokenizing the prompt text.

vLLM's API server tokenizes each request it is sent before the engine sees it, on one worker thread (the
renderer's tokenizer executor): requests to one API server queue for it. Every replica on a request's path
does this (the server; in PD the prefill and then the decode; in EPD the encode replica too). Shared by the HTTP
simulator (sim.replica) and the virtual-time core (sim.vcluster).
"""
from __future__ import annotations

import asyncio

from epdbench.physics.costmodel import tokenize_seconds


class ApiServer:
    def __init__(self, replica):
        self.replica = replica          # spec and time_scale of a Replica or VReplica
        self.tokenizer = asyncio.Lock()

    async def tokenize(self, text_tokens: int) -> None:
        """Hold this API server's tokenizer for the prompt's text tokens (tokenize_seconds)."""
        r = self.replica
        seconds = tokenize_seconds(r.spec.hardware, text_tokens) * r.time_scale
        if seconds <= 0:
            return
        async with self.tokenizer:
            await asyncio.sleep(seconds)
