"""Ceiling of tasks.loadgen.LoadGenerator on this machine, against a zero-delay SSE server.

A vLLM-format streaming server (child process, 127.0.0.1, free port) answers POST /v1/completions
with max_tokens content chunks + a usage chunk + [DONE], written back to back with no sleep. Each
chunk carries the server's send stamp (`t_ns`), also kept per request id and served by GET /stamps,
so the client's per-chunk receipt stamp can be compared with it.

Clock: both processes use time.perf_counter_ns, which on Linux is CLOCK_MONOTONIC (system-wide),
so stamps taken in the server and client processes are directly comparable.

    python benchmarks/loadgen.py [--duration-per-level S] [--max-requests N] [--max-tokens N]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time

import aiohttp
from aiohttp import web

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONCURRENCIES = (1, 64, 256)


# ----------------------------------------------------------------------------- server (child)
def serve() -> None:
    """Zero-delay completions server; prints 'PORT <n>' once listening, runs until terminated."""
    stamps: dict[str, list[int]] = {}
    # Pre-formatted chunks keep server CPU per chunk low (the client is what we measure).
    chunk = 'data: {"id":"%s","object":"text_completion","choices":[{"index":0,"text":" x",' \
            '"finish_reason":%s}],"t_ns":%d}\n\n'
    usage = 'data: {"id":"%s","object":"text_completion","choices":[],"usage":{"prompt_tokens":%d,' \
            '"completion_tokens":%d,"total_tokens":%d},"t_ns":%d}\n\n'

    async def completions(request: web.Request) -> web.StreamResponse:
        body = await request.json()
        rid = body.get("request_id") or request.headers.get("X-Request-Id", "anon")
        n = int(body.get("max_tokens", 16))
        n_prompt = len(str(body.get("prompt", "")).split())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await resp.prepare(request)
        ts = stamps.setdefault(rid, [])
        for i in range(n):                       # one write (and drain) per chunk, no sleep
            t = time.perf_counter_ns()
            ts.append(t)
            fin = '"length"' if i == n - 1 else "null"
            await resp.write((chunk % (rid, fin, t)).encode())
        await resp.write((usage % (rid, n_prompt, n, n_prompt + n, time.perf_counter_ns())).encode())
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def get_stamps(request: web.Request) -> web.Response:
        """All stamps since the last call (then cleared) plus this process's CPU seconds."""
        out = {"stamps": dict(stamps), "cpu_s": time.process_time()}
        stamps.clear()
        return web.json_response(out)

    async def main() -> None:
        app = web.Application(client_max_size=1 << 20)
        app.add_routes([web.post("/v1/completions", completions), web.get("/stamps", get_stamps)])
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        print(f"PORT {port}", flush=True)
        await asyncio.Event().wait()             # parent terminates us

    asyncio.run(main())


# ----------------------------------------------------------------------------- client
def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def make_requests(n: int, max_tokens: int, start: int = 0):
    from epdbench.specs.workload import RequestSpec
    prompt = "benchmark prompt alpha bravo charlie"
    return [RequestSpec(start + i, "measured", "completions", {"prompt": prompt, "max_tokens": max_tokens},
                        len(prompt.split()), max_tokens, f"h{start + i}") for i in range(n)]


async def fetch_stamps(base: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/stamps", timeout=aiohttp.ClientTimeout(total=30)) as r:
            return await r.json()


async def run_level(base: str, conc: int, args) -> dict:
    from epdbench.tasks.loadgen import LoadGenerator
    async with LoadGenerator(base, "bench-model", args.timeout) as lg:
        # Pilot (doubles as warm-up): estimate the request rate to size the measured run.
        pilot_n = max(2 * conc, 20)
        t0 = time.perf_counter()
        await asyncio.wait_for(lg.run_cell(make_requests(pilot_n, args.max_tokens), conc), args.timeout * 2)
        rate = pilot_n / max(time.perf_counter() - t0, 1e-6)
        n = int(min(args.max_requests, max(conc, rate * args.duration_per_level)))
        srv_cpu0 = (await fetch_stamps(base))["cpu_s"]   # drops pilot stamps, server CPU baseline

        cli_cpu0, t0 = time.process_time(), time.perf_counter()
        # Hard bound: several times the planned duration (plus per-request timeout).
        recs = await asyncio.wait_for(lg.run_cell(make_requests(n, args.max_tokens, pilot_n), conc),
                                      args.duration_per_level * 4 + args.timeout)
        wall = time.perf_counter() - t0
        cli_cpu = time.process_time() - cli_cpu0
    srv = await fetch_stamps(base)
    stamps = srv["stamps"]

    errs, chunks, stamp_err_us, lag_ms = 0, 0, [], []
    for r in recs:
        lag_ms.append((r.send_ns - r.scheduled_ns) / 1e6)
        chunks += len(r.chunk_offsets_ns)
        srv_ts = stamps.get(r.request_id, [])
        if not r.ok or len(srv_ts) != len(r.chunk_offsets_ns):   # failed, or chunk count mismatch
            errs += 1
            continue
        stamp_err_us += [(r.send_ns + off - t) / 1e3 for off, t in zip(r.chunk_offsets_ns, srv_ts)]
    return {"conc": conc, "reqs": len(recs), "chunks": chunks, "wall": wall, "cps": chunks / wall,
            "e50": pct(stamp_err_us, 50), "e99": pct(stamp_err_us, 99), "emax": max(stamp_err_us, default=float("nan")),
            "lag99": pct(lag_ms, 99), "cli_cpu": 100 * cli_cpu / wall,
            "srv_cpu": 100 * (srv["cpu_s"] - srv_cpu0) / wall, "errs": errs}


async def start_server() -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, os.path.abspath(__file__), "--serve",
                                                stdout=asyncio.subprocess.PIPE)
    line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise RuntimeError(f"server failed to start: {line!r}")
    return proc, f"http://127.0.0.1:{line[1]}"


async def main(args) -> int:
    print(f"Python {platform.python_version()} ({platform.python_implementation()}), "
          f"CPUs: {os.cpu_count()}, aiohttp {aiohttp.__version__}, max_tokens={args.max_tokens}, "
          f"target {args.duration_per_level:g} s/level")
    proc, base = await start_server()
    rows = []
    try:
        for conc in args.concurrency:
            rows.append(await run_level(base, conc, args))
            print(f"  c={conc} done in {rows[-1]['wall']:.1f} s", file=sys.stderr, flush=True)
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()

    hdr = ("conc", "requests", "chunks", "wall s", "chunks/s", "err p50 us", "err p99 us", "err max us",
           "send lag p99 ms", "client CPU%", "server CPU%", "errors")
    fmt = "{:>5} {:>9} {:>10} {:>7} {:>9} {:>11} {:>11} {:>11} {:>16} {:>12} {:>12} {:>7}"
    print()
    print(fmt.format(*hdr))
    print("-" * len(fmt.format(*hdr)))
    for r in rows:
        print(fmt.format(r["conc"], r["reqs"], r["chunks"], f"{r['wall']:.2f}", f"{r['cps']:.0f}",
                         f"{r['e50']:.0f}", f"{r['e99']:.0f}", f"{r['emax']:.0f}", f"{r['lag99']:.3f}",
                         f"{r['cli_cpu']:.0f}", f"{r['srv_cpu']:.0f}", r["errs"]))
    print("\nerr = client receipt stamp (send_ns + chunk offset) - server send stamp t_ns, per chunk "
          "(delivery latency + client loop lag).\nsend lag = send_ns - scheduled_ns. "
          "CPU% is per process (100 = one core).")
    return 1 if any(r["errs"] for r in rows) else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--duration-per-level", type=float, default=8.0,
                   help="target seconds per concurrency level (request count sized from a pilot run)")
    p.add_argument("--max-requests", type=int, default=20000, help="cap on measured requests per level")
    p.add_argument("--max-tokens", type=int, default=256, help="streamed chunks (tokens) per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES), help="levels to run")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout passed to LoadGenerator")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)   # internal: child server mode
    a = p.parse_args()
    if a.serve:
        serve()
        sys.exit(0)
    sys.path.insert(0, REPO_ROOT)
    sys.exit(asyncio.run(main(a)))
