"""Serve one simulated vLLM replica on a loopback port: its aiohttp apps (OpenAI API, Mooncake bootstrap),
uvicorn-format access lines, and the command line the targets spawn (`python -m epdbench.sim.server`)."""
from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys

import aiohttp
from aiohttp import web

from epdbench.sim import logfmt
from epdbench.sim.metrics import lag_log, metrics_windows
from epdbench.sim.replica import Replica, log
from epdbench.specs.models import load_spec

LAG_LOG_INTERVAL_S = 10.0   # vLLM logs its engine stats every 10 s; the emulation-lag line keeps that pace
REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error", 502: "Bad Gateway"}


def access_log_middleware(pid: int):
    """One uvicorn-format access line per request, as vLLM's API server writes them."""
    @web.middleware
    async def access_log(request: web.Request, handler):
        status = 500
        try:
            resp = await handler(request)
            status = resp.status
            return resp
        except web.HTTPException as e:
            status = e.status
            raise
        finally:
            peer = request.transport.get_extra_info("peername") if request.transport else None
            peer_s = f"{peer[0]}:{peer[1]}" if peer else "127.0.0.1:0"
            log(logfmt.access_line(pid, peer_s, request.method, request.path_qs, status, REASONS.get(status, "")))
    return access_log


def app(replica: Replica) -> web.Application:
    """The vLLM OpenAI API of the replica (and, on an encode replica, its encoder-output pull)."""
    application = web.Application(middlewares=[access_log_middleware(replica.pid)], client_max_size=256 * 1024 ** 2)
    application.router.add_post("/v1/completions", lambda r: replica.generate(r, chat=False))
    application.router.add_post("/v1/chat/completions", lambda r: replica.generate(r, chat=True))
    application.router.add_post("/tokenize", replica.tokenize)
    application.router.add_get("/v1/models", replica.models)
    application.router.add_get("/health", replica.health)
    application.router.add_get("/metrics", replica.metrics)
    if replica.role == "encode":
        application.router.add_post("/epdbench/ec_pull", replica.encoder.ec_pull)
    return application


def bootstrap_app(replica: Replica) -> web.Application:
    """The Mooncake bootstrap server of a prefill replica, through which decodes pull KV."""
    application = web.Application()
    application.router.add_get("/query", replica.kv.bootstrap_query)
    application.router.add_post("/epdbench/kv_pull", replica.kv.kv_pull)
    return application


async def until_signalled() -> None:
    """Return on SIGTERM or SIGINT (how the targets stop a simulated process)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()


class EngineDead(Exception):
    """The engine's step loop failed; the replica exits (code 1)."""


def engine_failure(task: asyncio.Task | None) -> str | None:
    """The traceback of a step loop that ended with an exception, else None."""
    if task is None or not task.done() or task.cancelled() or task.exception() is None:
        return None
    import traceback
    return "".join(traceback.format_exception(task.exception())).rstrip()


async def serve(replica: Replica) -> None:
    replica.startup_lines()
    replica.engine.start()
    replica.session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
    if replica.spans is not None:
        replica.spans.start()
    runners = []
    for application, port in [(app(replica), replica.port)] + (
            [(bootstrap_app(replica), replica.bootstrap_port)] if replica.bootstrap_port else []):
        runner = web.AppRunner(application, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, replica.host, port).start()
        runners.append(runner)
    tasks = [asyncio.get_running_loop().create_task(lag_log(replica, LAG_LOG_INTERVAL_S))]
    if replica.moves_kv:
        interval = float(os.environ.get("MC_TE_METRIC_INTERVAL_SECONDS", "5"))
        tasks.append(asyncio.get_running_loop().create_task(metrics_windows(replica, interval)))
    stop = asyncio.get_running_loop().create_task(until_signalled())
    try:
        await asyncio.wait({stop, replica.engine.task}, return_when=asyncio.FIRST_COMPLETED)
        failed = engine_failure(replica.engine.task)
        if failed is not None:
            # as vLLM's engine core: a fatal error ends the server (EngineDeadError) instead of leaving every
            # request waiting for tokens that will never come
            replica.engine_log("EngineCore encountered a fatal error.", level="ERROR", file="core.py")
            for line in failed.splitlines():
                replica.engine_log(line, level="ERROR", file="core.py")
            raise EngineDead()
    finally:
        stop.cancel()
        for t in tasks:
            t.cancel()
        if not replica.engine.task.done():
            await replica.engine.stop()
        await replica.api.close()
        if replica.spans is not None:
            await replica.spans.close()
        await replica.session.close()
        for r in runners:
            await r.cleanup()
        replica.api_log("Shutting down simulator.")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="epdbench sim", description="Serve one simulated vLLM role replica.")
    p.add_argument("--spec", required=True, help="spec YAML (path or preset name)")
    p.add_argument("--config", required=True, help="configuration name in the spec")
    p.add_argument("--role", required=True, choices=["server", "prefill", "decode", "encode"])
    p.add_argument("--replica", type=int, default=0)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--bootstrap-port", type=int, default=None,
                   help="Mooncake bootstrap port (prefill replicas of PD/EPD)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    spec = load_spec(args.spec)
    config = spec.configuration(args.config)
    if config.role(args.role) is None:
        print(f"configuration {config.name} has no role {args.role}", file=sys.stderr)
        return 2
    replica = Replica(spec, config, args.role, args.replica, args.host, args.port, args.bootstrap_port)
    if why := replica.engine.cost.start_problem(spec.engine):
        # as vLLM: the engine core fails its start-up check and the API server exits before it serves
        replica.header_line()
        replica.engine_log("EngineCore failed to start.", level="ERROR", file="core.py")
        replica.engine_log(f"ValueError: {why}", level="ERROR", file="core.py")
        replica.api_log("RuntimeError: Engine core initialization failed. See root cause above.", level="ERROR")
        return 1
    try:
        asyncio.run(serve(replica))
    except EngineDead:
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
