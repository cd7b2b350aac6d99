"""Small fake engines on loopback for the proxy's tests (sim/proxy.py in front of real vLLM): each answers every
completion with what it is given and records what it received, with the request id the proxy handed it."""
from __future__ import annotations

import socket

import aiohttp
from aiohttp import web

from epdbench.sim.proxy import Proxy


def port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def engine(role: str, seen: list, answer: dict) -> web.Application:
    """An engine of `role` whose completions answer `answer`; each request lands in `seen` as (role, X-Request-Id,
    body)."""
    async def chat(request):
        seen.append((role, request.headers.get("X-Request-Id"), await request.json()))
        return web.json_response({"choices": [{"message": {"content": "x"}}], **answer})
    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    return app


class Served:
    """Apps and a proxy served on loopback ports until close()."""

    def __init__(self):
        self.runners: list[web.AppRunner] = []
        self.proxy: Proxy | None = None

    async def start(self, app: web.Application, at: int | None = None) -> str:
        runner = web.AppRunner(app)
        await runner.setup()
        at = at or port()
        await web.TCPSite(runner, "127.0.0.1", at).start()
        self.runners.append(runner)
        return f"http://127.0.0.1:{at}"

    async def start_proxy(self, proxy: Proxy) -> str:
        proxy.session = aiohttp.ClientSession()
        self.proxy = proxy
        return await self.start(proxy.app())

    async def close(self) -> None:
        if self.proxy is not None:
            await self.proxy.session.close()
        for r in self.runners:
            await r.cleanup()


async def post(url: str, body: dict) -> tuple[int, dict]:
    """A chat completion through `url` (the proxy): its status and JSON answer."""
    async with aiohttp.ClientSession() as s:
        async with s.post(f"{url}/v1/chat/completions", json=body) as resp:
            return resp.status, await resp.json(content_type=None)
