"""Streaming an upstream HTTP response back to the client, chunk by chunk as it arrives (SSE tokens keep
their timing). Shared by the simulator's EPD proxy, the Kubernetes API relay and the test fake API server."""
from __future__ import annotations

from collections.abc import Collection

import aiohttp
from aiohttp import web


async def stream_back(request: web.Request, upstream: aiohttp.ClientResponse,
                      dropped_headers: Collection[str]) -> web.StreamResponse:
    """Answer `request` with `upstream`'s status, headers (less `dropped_headers`, lower case) and body."""
    resp = web.StreamResponse(status=upstream.status, headers={
        k: v for k, v in upstream.headers.items() if k.lower() not in dropped_headers})
    await resp.prepare(request)
    try:
        async for chunk in upstream.content.iter_any():
            await resp.write(chunk)
        await resp.write_eof()
    except ConnectionResetError:
        # The client went away, after its last event or mid-stream: the status line is already out and
        # nothing is left to send. Not the relay's error, so it is not logged as one.
        pass
    return resp
