"""Built-in router for the simulator: aggregated round-robin, PD (prefill leg then decode leg)
and EPD (encode leg, prefill leg, decode leg), with uvicorn-format access lines.

vllm-router fronts aggregated and PD by default; it has no encode stage, so EPD always runs here,
following vLLM's disagg_epd_proxy: requests without images skip the encode leg. The decode leg carries the
kv_transfer_params the prefill answered (NixlConnector's protocol, and the simulator's), or with `--kv-connector
mooncake` the ones MooncakeConnector needs, which the proxy makes itself (sim/mooncake_pd.py).
"""
from __future__ import annotations

import argparse
import asyncio
import copy
import itertools
import os
import random
import socket
import sys
import time
import uuid

import aiohttp
from aiohttp import web

from epdbench.otlp import format_traceparent, new_span_id, parse_traceparent
from epdbench.relay import stream_back
from epdbench.sim import logfmt
from epdbench.sim.mooncake_pd import (BootstrapError, Bootstraps, bootstrap_addr, decode_params, holds_kv,
                                      prefill_params)
from epdbench.sim.server import access_log_middleware, log, until_signalled
from epdbench.sim.spans import SpanExporter, epoch_ns, router_span, span_resource

HOP_HEADERS = {"content-length", "transfer-encoding", "connection", "content-encoding"}
# Fault injection (the real-engine fault tests): every Nth decode leg of NIXL's PD protocol names, in its
# kv_transfer_params, a prefill engine the decode has never met at a side-channel port no one listens on — the
# decode's NIXL handshake cannot reach it, and the request's KV never arrives (its own `NIXL transfer failure` lines).
FAULT_KV_UNREACHABLE_EVERY = "EPDBENCH_FAULT_KV_UNREACHABLE_EVERY"


def unreachable_side_channel(kv_params: dict, n: int, port: int) -> dict:
    """NixlConnector's kv_transfer_params pointed at an engine id of its own (so no handshake already made is
    reused) on `port` of the same host."""
    return {**kv_params, "remote_engine_id": f"{kv_params.get('remote_engine_id')}-unreachable-{n}",
            "remote_port": port}


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def has_images(body: dict) -> bool:
    for m in body.get("messages") or []:
        content = m.get("content")
        if isinstance(content, list) and any(p.get("type") == "image_url" for p in content):
            return True
    return False


class Proxy:
    def __init__(self, servers: list[str], encoders: list[str], prefills: list[str], decodes: list[str],
                 skip_prefill_fraction: float = 0.0, fault_seed: int = 0, mooncake: dict[str, str] | None = None):
        """`mooncake`: each prefill URL's Mooncake bootstrap server (MooncakeConnector's PD protocol); none: the
        decode leg carries what the prefill answered."""
        self.servers, self.encoders, self.prefills, self.decodes = servers, encoders, prefills, decodes
        self.skip_prefill_fraction = skip_prefill_fraction    # fault switch: send straight to decode
        self.fault_rng = random.Random(fault_seed)
        self.legs = {"direct": 0, "encode": 0, "prefill": 0, "decode": 0, "skipped_prefill": 0}
        self._rr = {name: itertools.cycle(urls) for name, urls in
                    [("server", servers), ("encode", encoders), ("prefill", prefills), ("decode", decodes)] if urls}
        self.pid = os.getpid()
        self.session: aiohttp.ClientSession | None = None
        self.spans = SpanExporter.from_env(span_resource("proxy"))
        self.mooncake = Bootstraps(mooncake) if mooncake is not None else None
        self.kv_fault_every = int(os.environ.get(FAULT_KV_UNREACHABLE_EVERY) or 0)

    @property
    def mode(self) -> str:
        if self.servers:
            return "aggregated"
        return "epd" if self.encoders else "pd"

    def pick(self, role: str) -> str:
        return next(self._rr[role])

    def info(self, msg: str) -> None:
        log(logfmt.vllm_line("Router", self.pid, "INFO", "proxy.py", 1, msg))

    async def leg(self, url: str, path: str, body: dict, headers: dict) -> tuple[int, dict | str]:
        assert self.session is not None
        async with self.session.post(url + path, json=body, headers=headers) as r:
            if r.status != 200:
                return r.status, await r.text()
            return 200, await r.json()

    async def generate(self, request: web.Request) -> web.StreamResponse:
        """Route a completion; a traced one (W3C traceparent, with a span exporter) gets a `router.request` span
        over the whole of it, which the legs' traceparent names as their parent."""
        ctx = parse_traceparent(request.headers.get("traceparent")) if self.spans is not None else None
        if ctx is None:
            return await self._generate(request, {})
        span_id, start = new_span_id(), time.perf_counter()
        try:
            return await self._generate(request, {"traceparent": format_traceparent(ctx[0], span_id)})
        finally:
            self.spans.add([router_span(ctx[0], span_id, ctx[1], epoch_ns(start), epoch_ns(time.perf_counter()),
                                        request.headers.get("X-Request-Id", ""), self.mode)])

    async def _generate(self, request: web.Request, trace_headers: dict) -> web.StreamResponse:
        body = await request.json()
        path = request.path
        rid = body.get("request_id") or request.headers.get("X-Request-Id") or uuid.uuid4().hex
        headers = {"X-Request-Id": rid, **trace_headers}
        if self.mode == "aggregated":
            self.legs["direct"] += 1
            return await self.relay(request, self.pick("server") + path, body, headers)
        if self.skip_prefill_fraction and self.fault_rng.random() < self.skip_prefill_fraction:
            self.legs["skipped_prefill"] += 1
            self.legs["decode"] += 1
            dec = self.pick("decode")
            self.info(f"request {rid}: FAULT skip disaggregated prefill, fallback to decode on {dec}")
            return await self.relay(request, dec + path, body, headers)
        if self.mode == "epd" and has_images(body):
            enc = self.pick("encode")
            encode_body = {**body, "max_tokens": 1, "stream": False, "stream_options": None}
            encode_body.pop("max_completion_tokens", None)
            status, out = await self.leg(enc, path, encode_body, headers)
            if status != 200:
                return web.json_response({"error": {"message": f"encode leg failed: {out}"}}, status=502)
            self.legs["encode"] += 1
            self.info(f"request {rid}: encode leg done on {enc}")
            # what the encoder answered, passed on as it is (vLLM's ECExampleConnector answers none: the prefill
            # finds the outputs by the image's mm_hash in the shared folder)
            if out.get("ec_transfer_params"):
                body = {**body, "ec_transfer_params": out["ec_transfer_params"]}
        pre = self.pick("prefill")
        xfer = f"xfer-{uuid.uuid4()}"
        engine = None
        if self.mooncake is not None:     # before the prefill holds any KV: a decode must be able to find it
            try:
                engine = await self.mooncake.engine_id(self.session, pre)
            except BootstrapError as e:
                return web.json_response({"error": {"message": str(e)}}, status=502)
        prefill_body = copy.deepcopy(body)
        prefill_body.update({"max_tokens": 1, "stream": False, "stream_options": None,
                             "kv_transfer_params": prefill_params(xfer)})
        prefill_body.pop("max_completion_tokens", None)
        status, out = await self.leg(pre, path, prefill_body, headers)
        if status != 200:
            return web.json_response({"error": {"message": f"prefill leg failed: {out}"}}, status=502)
        self.legs["prefill"] += 1
        self.legs["decode"] += 1
        dec = self.pick("decode")
        self.info(f"request {rid}: prefill leg done on {pre}, decoding on {dec}")
        kv_params = out.get("kv_transfer_params")
        if engine is not None:
            kv_params = decode_params(xfer, self.mooncake.addrs[pre], engine) if holds_kv(out) else None
            if kv_params is None:
                self.info(f"request {rid}: the prefill on {pre} stopped before its length cap and holds no KV: "
                          f"{dec} prefills it itself")
        elif kv_params and self.kv_fault_every and self.legs["decode"] % self.kv_fault_every == 0:
            kv_params = unreachable_side_channel(kv_params, self.legs["decode"], closed_port())
            self.info(f"request {rid}: FAULT kv_transfer_params name an unreachable NIXL side channel "
                      f"(port {kv_params['remote_port']})")
        decode_body = {**body, "kv_transfer_params": kv_params}
        decode_body.pop("ec_transfer_params", None)
        return await self.relay(request, dec + path, decode_body, headers)

    async def relay(self, request: web.Request, url: str, body: dict, headers: dict) -> web.StreamResponse:
        assert self.session is not None
        async with self.session.post(url, json=body, headers=headers) as upstream:
            return await stream_back(request, upstream, HOP_HEADERS)

    async def forward_get(self, request: web.Request) -> web.Response:
        target = (self.servers or self.prefills)[0]
        assert self.session is not None
        async with self.session.get(target + request.path) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def tokenize(self, request: web.Request) -> web.Response:
        target = (self.servers or self.prefills)[0]
        assert self.session is not None
        async with self.session.post(target + "/tokenize", json=await request.json()) as r:
            return web.Response(status=r.status, body=await r.read(), content_type=r.content_type)

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=200)

    async def metrics(self, request: web.Request) -> web.Response:
        lines = ["# HELP epdbench_proxy_legs_total Requests sent per leg by the epdbench router.",
                 "# TYPE epdbench_proxy_legs_total counter"]
        lines += [f'epdbench_proxy_legs_total{{leg="{leg}"}} {n}' for leg, n in self.legs.items()]
        return web.Response(text="\n".join(lines) + "\n", content_type="text/plain")

    def app(self) -> web.Application:
        app = web.Application(middlewares=[access_log_middleware(self.pid)], client_max_size=256 * 1024 ** 2)
        app.router.add_post("/v1/completions", self.generate)
        app.router.add_post("/v1/chat/completions", self.generate)
        app.router.add_post("/tokenize", self.tokenize)
        app.router.add_get("/v1/models", self.forward_get)
        app.router.add_get("/health", self.health)
        app.router.add_get("/metrics", self.metrics)
        return app


async def serve(proxy: Proxy, host: str, port: int) -> None:
    proxy.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600),
                                          connector=aiohttp.TCPConnector(limit=0))
    if proxy.spans is not None:
        proxy.spans.start()
    runner = web.AppRunner(proxy.app(), access_log=None, handle_signals=False)
    await runner.setup()
    await web.TCPSite(runner, host, port).start()
    kv = f" mooncake bootstrap={proxy.mooncake.addrs}" if proxy.mooncake is not None else ""
    proxy.info(f"epdbench router ({proxy.mode}) on http://{host}:{port}: encode={proxy.encoders} "
               f"prefill={proxy.prefills} decode={proxy.decodes} server={proxy.servers}{kv}")
    try:
        await until_signalled()
    finally:
        if proxy.spans is not None:
            await proxy.spans.close()
        await proxy.session.close()
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m epdbench.sim.proxy", description="Built-in router of the simulator.")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--server", action="append", default=[])
    p.add_argument("--encode", action="append", default=[])
    p.add_argument("--prefill", action="append", default=[], nargs="+", metavar=("URL", "BOOTSTRAP_PORT"),
                   help="a prefill engine; with --kv-connector mooncake, its Mooncake bootstrap port after it")
    p.add_argument("--decode", action="append", default=[])
    p.add_argument("--kv-connector", choices=["nixl", "mooncake"], default="nixl",
                   help="the engines' KV connector: nixl (the decode leg carries what the prefill answered, as the "
                        "simulator's engines do too) or mooncake (MooncakeConnector's protocol: the proxy makes the "
                        "decode's kv_transfer_params from each prefill's bootstrap server)")
    p.add_argument("--fault-skip-prefill", type=float, default=0.0,
                   help="fault injection: fraction of requests sent straight to decode, skipping prefill")
    p.add_argument("--fault-seed", type=int, default=0)
    a = p.parse_args(argv)
    if not a.server and not (a.prefill and a.decode):
        print("give --server URLs, or --prefill and --decode URLs", file=sys.stderr)
        return 2
    prefills = [v[0] for v in a.prefill]
    wanted = 2 if a.kv_connector == "mooncake" else 1
    if any(len(v) != wanted or (wanted == 2 and not v[1].isdigit()) for v in a.prefill):
        print("give each prefill as --prefill URL BOOTSTRAP_PORT with --kv-connector mooncake, else as --prefill URL",
              file=sys.stderr)
        return 2
    mooncake = {v[0]: bootstrap_addr(v[0], int(v[1])) for v in a.prefill} if a.kv_connector == "mooncake" else None
    proxy = Proxy(a.server, a.encode, prefills, a.decode, a.fault_skip_prefill, a.fault_seed, mooncake)
    asyncio.run(serve(proxy, a.host, a.port))
    return 0


if __name__ == "__main__":
    sys.exit(main())
