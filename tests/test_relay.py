"""epdbench.relay.stream_back: SSE chunks relayed as they arrive; a client that leaves is not an error."""
from __future__ import annotations

import asyncio

import aiohttp
from aiohttp import web

from epdbench.relay import stream_back

EVENTS = [b'data: {"n":%d}\n\n' % i for i in range(5)] + [b"data: [DONE]\n\n"]


async def upstream_sse(request: web.Request) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    for event in EVENTS:
        await resp.write(event)
        await asyncio.sleep(0.01)
    await resp.write_eof()
    return resp


async def serve(app: web.Application) -> tuple[web.AppRunner, int]:
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, runner.addresses[0][1]


async def run(client_reads_events: int) -> tuple[list[int], list[BaseException], list[bytes]]:
    """Upstream → relay → client; the client stops after `client_reads_events` events and closes."""
    statuses: list[int] = []
    errors: list[BaseException] = []

    @web.middleware
    async def record(request, handler):
        try:
            resp = await handler(request)
            statuses.append(resp.status)
            return resp
        except BaseException as e:     # noqa: BLE001 - what an access-log middleware would log as 500
            errors.append(e)
            raise

    up = web.Application()
    up.router.add_get("/sse", upstream_sse)
    up_runner, up_port = await serve(up)
    session = aiohttp.ClientSession()

    async def relay(request: web.Request) -> web.StreamResponse:
        async with session.get(f"http://127.0.0.1:{up_port}/sse") as upstream:
            return await stream_back(request, upstream, {"content-length", "transfer-encoding"})

    app = web.Application(middlewares=[record])
    app.router.add_get("/relay", relay)
    runner, port = await serve(app)
    got: list[bytes] = []
    try:
        async with aiohttp.ClientSession() as client:
            async with client.get(f"http://127.0.0.1:{port}/relay") as r:
                assert r.headers["Content-Type"] == "text/event-stream"
                buf = b""
                async for chunk in r.content.iter_any():
                    buf += chunk
                    while b"\n\n" in buf:
                        event, buf = buf.split(b"\n\n", 1)
                        got.append(event + b"\n\n")
                    if len(got) >= client_reads_events:
                        r.connection.transport.abort()    # leave at once, as a load generator does after [DONE]
                        break
        for _ in range(50):                               # bounded: the relay handler finishes within 0.5 s
            if statuses or errors:
                break
            await asyncio.sleep(0.01)
    finally:
        await session.close()
        await runner.cleanup()
        await up_runner.cleanup()
    return statuses, errors, got


def test_every_event_is_relayed_in_order():
    statuses, errors, got = asyncio.run(run(client_reads_events=len(EVENTS)))
    assert got == EVENTS
    assert statuses == [200] and errors == []


def test_a_client_leaving_mid_stream_is_not_a_relay_error():
    statuses, errors, got = asyncio.run(run(client_reads_events=2))
    assert got == EVENTS[:2]
    assert errors == [] and statuses == [200]
