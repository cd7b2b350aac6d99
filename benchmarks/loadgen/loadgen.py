"""Ceiling of tasks.load.loadgen.LoadGenerator on this machine against a zero-delay SSE server, and side by side
with vLLM's benchmark client (`--peer vllm`), interleaved in one run.

A vLLM-format streaming server (child process, 127.0.0.1, free port) answers POST /v1/completions with
max_tokens content chunks, a usage chunk and [DONE], written back to back with no sleep. It sends what
vLLM sends for the options each client asks: with stream_options.continuous_usage_stats (epdbench asks)
every chunk carries the running usage, as vLLM's does. Each chunk also carries the server's send stamp
(`t_ns`), kept per request id and served by GET /stamps, so every client's receipt stamps can be compared
with it: TTFT error (first chunk received − first chunk sent) and ITL error (received gap − sent gap).

Clock: both processes use time.perf_counter_ns, which on Linux is CLOCK_MONOTONIC (system-wide).
The peer runs in its own virtual environment under ~/.cache/epdbench/peers/ (created on first use from PyPI:
aiohttp at our version, regex, tqdm, and vllm/benchmarks/lib/endpoint_request_func.py from the vllm wheel).

    python benchmarks/loadgen/loadgen.py [--peer vllm] [--concurrency 64 256] [--rounds 2] [--duration-per-level S]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import aiohttp

REPO_ROOT = Path(__file__).resolve().parents[2]
PEERS = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "epdbench" / "peers"
VLLM_VERSION = "0.33.0"
VLLM_FILE = "vllm/benchmarks/lib/endpoint_request_func.py"
CONCURRENCIES = (1, 64, 256)


# ----------------------------------------------------------------------------- server (child)
def serve() -> None:
    """Zero-delay completions server on a bare asyncio protocol (HTTP/1.1 keep-alive, chunked responses), so
    its CPU per chunk stays well below any client's; prints 'PORT <n>' once listening, runs until terminated."""
    stamps: dict[str, list[int]] = {}
    # Pre-formatted chunks, vLLM's fields; continuous usage when the request asks for it, as vLLM does.
    chunk = '{"id":"%s","object":"text_completion","created":1,"model":"bench-model","choices":[{"index":0,' \
            '"text":" x","logprobs":null,"finish_reason":%s,"stop_reason":null}]%s,"t_ns":%d}'
    running = ',"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d}'
    usage = '{"id":"%s","object":"text_completion","created":1,"model":"bench-model","choices":[],' \
            '"usage":{"prompt_tokens":%d,"total_tokens":%d,"completion_tokens":%d},"t_ns":%d}'
    head = (b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
            b"Transfer-Encoding: chunked\r\n\r\n")

    def framed(event: str) -> bytes:
        payload = b"data: " + event.encode() + b"\n\n"
        return b"%x\r\n%s\r\n" % (len(payload), payload)

    def completions(write, body: dict, headers: dict) -> None:
        rid = body.get("request_id") or headers.get("x-request-id", "anon")
        n = int(body.get("max_tokens", 16))
        n_prompt = len(str(body.get("prompt", "")).split())
        options = body.get("stream_options") or {}
        continuous = bool(options.get("continuous_usage_stats"))
        write(head)
        ts = stamps.setdefault(rid, [])
        for i in range(n):                       # one write per chunk, no sleep
            t = time.perf_counter_ns()
            ts.append(t)
            fin = '"length"' if i == n - 1 else "null"
            use = running % (n_prompt, n_prompt + i + 1, i + 1) if continuous else ""
            write(framed(chunk % (rid, fin, use, t)))
        if options.get("include_usage"):
            write(framed(usage % (rid, n_prompt, n_prompt + n, n, time.perf_counter_ns())))
        write(framed("[DONE]") + b"0\r\n\r\n")

    class Http(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport, self.buf = transport, b""

        def data_received(self, data):
            self.buf += data
            while True:
                end = self.buf.find(b"\r\n\r\n")
                if end < 0:
                    return
                lines = self.buf[:end].decode("latin-1").split("\r\n")
                headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
                size = int(headers.get("content-length", 0))
                if len(self.buf) < end + 4 + size:
                    return
                body, self.buf = self.buf[end + 4:end + 4 + size], self.buf[end + 4 + size:]
                method, path = lines[0].split(" ")[:2]
                if method == "POST" and path == "/v1/completions":
                    completions(self.transport.write, json.loads(body), headers)
                elif path == "/stamps":
                    out = json.dumps({"stamps": dict(stamps), "cpu_s": time.process_time()}).encode()
                    stamps.clear()
                    self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                                         b"Content-Length: %d\r\n\r\n%s" % (len(out), out))
                else:
                    self.transport.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")

    async def main() -> None:
        server = await asyncio.get_running_loop().create_server(Http, "127.0.0.1", 0, backlog=1024)
        print(f"PORT {server.sockets[0].getsockname()[1]}", flush=True)
        await asyncio.Event().wait()             # parent terminates us

    asyncio.run(main())


# ----------------------------------------------------------------------------- figures
def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    s = sorted(xs)
    return s[min(len(s) - 1, int(round(q / 100 * (len(s) - 1))))]


def errors(received: dict[str, list[int]], sent: dict[str, list[int]]) -> dict:
    """TTFT error (µs) per request and |ITL error| (µs) per gap, for requests whose chunk counts match."""
    ttft, itl, bad = [], [], 0
    for rid, got in received.items():
        want = sent.get(rid, [])
        if not got or len(got) != len(want):
            bad += 1
            continue
        ttft.append((got[0] - want[0]) / 1e3)
        itl += [abs((b - a) - (d - c)) / 1e3 for a, b, c, d in zip(got, got[1:], want, want[1:])]
    return {"ttft_p50": pct(ttft, 50), "ttft_p99": pct(ttft, 99), "itl_p99": pct(itl, 99), "bad": bad}


def make_requests(n: int, max_tokens: int, start: int = 0, traced: bool = False):
    from epdbench.specs.workload import RequestSpec
    prompt = "benchmark prompt alpha bravo charlie"
    return [RequestSpec(start + i, "measured", "completions", {"prompt": prompt, "max_tokens": max_tokens},
                        len(prompt.split()), max_tokens, f"h{start + i}", traced=traced) for i in range(n)]


async def fetch_stamps(base: str) -> dict:
    async with aiohttp.ClientSession() as s:
        async with s.get(base + "/stamps", timeout=aiohttp.ClientTimeout(total=60)) as r:
            return await r.json()


# ----------------------------------------------------------------------------- clients
async def run_epdbench(base: str, conc: int, n: int, args, first: int, traced: bool = False) -> dict:
    """epdbench's client; `traced`: every request with a client span and a traceparent (the spec's tracing at
    its most: every request of the cell traced)."""
    from epdbench.tasks.load.loadgen import LoadGenerator
    async with LoadGenerator(base, "bench-model", args.timeout) as lg:
        await lg.run_cell(make_requests(conc, 8, first), conc)                  # warm the connections
        await fetch_stamps(base)
        cpu0, t0 = time.process_time(), time.perf_counter()
        recs = await asyncio.wait_for(lg.run_cell(make_requests(n, args.max_tokens, first + conc, traced), conc),
                                      args.duration_per_level * 6 + args.timeout)
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    received = {r.request_id: [r.send_ns + o for o in (r.chunk_arrival_ns or r.chunk_offsets_ns)]
                for r in recs if r.ok}
    return {"wall": wall, "cpu": cpu, "received": received, "failed": sum(not r.ok for r in recs)}


def peer_python(kind: str) -> tuple[Path, Path]:
    """The peer's venv interpreter and its request-function file; created on first use."""
    home = PEERS / f"{kind}-{VLLM_VERSION}"
    python, module = home / "bin" / "python", home / "endpoint_request_func.py"
    if python.exists() and module.exists():
        return python, module
    from importlib.metadata import version
    print(f"setting up {home} (once) ...", file=sys.stderr, flush=True)
    subprocess.run([sys.executable, "-m", "venv", str(home)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "-q", f"aiohttp=={version('aiohttp')}", "regex", "tqdm"],
                   check=True)
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run([str(python), "-m", "pip", "download", "-q", "--no-deps", f"vllm=={VLLM_VERSION}", "-d", tmp],
                       check=True)
        (wheel,) = Path(tmp).glob("vllm-*.whl")
        with zipfile.ZipFile(wheel) as z:
            module.write_bytes(z.read(VLLM_FILE))
    return python, module


async def run_vllm(base: str, conc: int, n: int, args, first: int) -> dict:
    python, module = peer_python("vllm")
    cmd = [str(python), str(Path(__file__).parent / "peers" / "vllm_client.py"), "--module", str(module),
           "--url", base, "--concurrency", str(conc), "--max-tokens", str(args.max_tokens)]
    warm = await asyncio.create_subprocess_exec(*cmd, "--requests", str(conc), "--first-id", str(first),
                                                stdout=asyncio.subprocess.DEVNULL)
    await warm.wait()                                                           # (its own process: imports)
    await fetch_stamps(base)
    proc = await asyncio.create_subprocess_exec(*cmd, "--requests", str(n), "--first-id", str(first + conc),
                                                stdout=asyncio.subprocess.PIPE)
    out, _ = await asyncio.wait_for(proc.communicate(), args.duration_per_level * 6 + args.timeout)
    res = json.loads(out)
    received = {r["id"]: r["stamps"] for r in res["requests"] if r["ok"]}
    return {"wall": res["wall"], "cpu": res["cpu"], "received": received,
            "failed": sum(not r["ok"] for r in res["requests"])}


async def run_epdbench_traced(base: str, conc: int, n: int, args, first: int) -> dict:
    return await run_epdbench(base, conc, n, args, first, traced=True)


CLIENTS = {"epdbench": run_epdbench, "vllm": run_vllm, "epdbench+trace": run_epdbench_traced}


async def measure(client: str, base: str, conc: int, n: int, args, first: int) -> dict:
    srv0 = (await fetch_stamps(base))["cpu_s"]
    res = await CLIENTS[client](base, conc, n, args, first)
    srv = await fetch_stamps(base)
    chunks = sum(len(s) for s in res["received"].values())
    return {"client": client, "conc": conc, "requests": n, "chunks": chunks, "cps": chunks / res["wall"],
            "cpu_ms_per_1k": 1e6 * res["cpu"] / max(chunks, 1), "cpu_pct": 100 * res["cpu"] / res["wall"],
            "srv_pct": 100 * (srv["cpu_s"] - srv0) / res["wall"], "failed": res["failed"],
            **errors(res["received"], srv["stamps"])}


async def start_server() -> tuple[asyncio.subprocess.Process, str]:
    proc = await asyncio.create_subprocess_exec(sys.executable, os.path.abspath(__file__), "--serve",
                                                stdout=asyncio.subprocess.PIPE)
    line = (await asyncio.wait_for(proc.stdout.readline(), 20)).decode().split()
    if len(line) != 2 or line[0] != "PORT":
        proc.kill()
        raise RuntimeError(f"server failed to start: {line!r}")
    return proc, f"http://127.0.0.1:{line[1]}"


async def main(args) -> int:
    print(f"Python {platform.python_version()}, CPUs: {os.cpu_count()}, aiohttp {aiohttp.__version__}, "
          f"{args.loop} loop, max_tokens={args.max_tokens}, ~{args.duration_per_level:g} s per run, {args.rounds} round(s), "
          f"clients: epdbench{', vLLM ' + VLLM_VERSION + ' (endpoint_request_func)' if args.peer else ''}")
    clients = ["epdbench"] + ([args.peer] if args.peer else []) + (["epdbench+trace"] if args.tracing else [])
    if args.peer:
        peer_python(args.peer)
    proc, base = await start_server()
    if args.pin and len(os.sched_getaffinity(0)) >= 2:
        # the server on the last core, the clients (this process, the peer's) on the others: a client is
        # measured on cores it does not share with the server it reads from
        cores = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(proc.pid, {cores[-1]})
        os.sched_setaffinity(0, set(cores[:-1]))
        print(f"server pinned to core {cores[-1]}, clients to {cores[:-1]}")
    rows, first = [], 0
    try:
        for conc in args.concurrency:
            # size the runs from a pilot of epdbench's client, then interleave the clients round by round
            pilot_n = max(2 * conc, 20)
            t0 = time.perf_counter()
            await run_epdbench(base, conc, pilot_n, args, first)
            first += 10 * pilot_n
            n = int(min(args.max_requests, max(conc, pilot_n / (time.perf_counter() - t0) * args.duration_per_level)))
            for rnd in range(args.rounds):
                for client in (clients if rnd % 2 == 0 else clients[::-1]):
                    rows.append({**await measure(client, base, conc, n, args, first), "round": rnd})
                    first += n + 2 * conc
                    print(f"  c={conc} round {rnd} {client}: {rows[-1]['cps']:.0f} chunks/s", file=sys.stderr,
                          flush=True)
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 5)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()

    hdr = ("conc", "client", "round", "requests", "chunks/s", "CPU ms/1k chunks", "client CPU%", "server CPU%",
           "TTFT err p50 us", "TTFT err p99 us", "ITL err p99 us", "failed")
    fmt = "{:>5} {:<14} {:>5} {:>8} {:>9} {:>16} {:>11} {:>11} {:>15} {:>15} {:>14} {:>6}"
    print("\n" + fmt.format(*hdr))
    for r in rows:
        print(fmt.format(r["conc"], r["client"], r["round"], r["requests"], f"{r['cps']:.0f}",
                         f"{r['cpu_ms_per_1k']:.1f}", f"{r['cpu_pct']:.0f}", f"{r['srv_pct']:.0f}",
                         f"{r['ttft_p50']:.0f}", f"{r['ttft_p99']:.0f}", f"{r['itl_p99']:.0f}",
                         r["failed"] + r["bad"]))
    if args.peer:
        print(f"\nepdbench ÷ {args.peer}, per concurrency (means over rounds; chunks/s also per round, each "
              "round's two runs back to back):")
        for conc in args.concurrency:
            def mean(client, key):
                vals = [r[key] for r in rows if r["conc"] == conc and r["client"] == client]
                return sum(vals) / len(vals)
            paired = [next(r["cps"] for r in rows if r["conc"] == conc and r["round"] == k and r["client"] == "epdbench")
                      / next(r["cps"] for r in rows if r["conc"] == conc and r["round"] == k and r["client"] == args.peer)
                      for k in range(args.rounds)]
            print(f"  c={conc}: chunks/s ×{mean('epdbench', 'cps') / mean(args.peer, 'cps'):.2f} (rounds: "
                  f"{', '.join(f'×{x:.2f}' for x in paired)}), CPU per chunk "
                  f"×{mean('epdbench', 'cpu_ms_per_1k') / mean(args.peer, 'cpu_ms_per_1k'):.2f}, TTFT err p99 "
                  f"{mean('epdbench', 'ttft_p99'):.0f} vs {mean(args.peer, 'ttft_p99'):.0f} us, ITL err p99 "
                  f"{mean('epdbench', 'itl_p99'):.0f} vs {mean(args.peer, 'itl_p99'):.0f} us")
    if args.tracing:
        print("\nepdbench with every request traced ÷ untraced, ingest (chunks/s), per concurrency (means over rounds):")
        for conc in args.concurrency:
            cps = {c: [r["cps"] for r in rows if r["conc"] == conc and r["client"] == c]
                   for c in ("epdbench", "epdbench+trace")}
            ratio = (sum(cps["epdbench+trace"]) / len(cps["epdbench+trace"])) / (sum(cps["epdbench"]) / len(cps["epdbench"]))
            print(f"  c={conc}: ×{ratio:.3f} ({ratio - 1:+.1%})")
    print("\nTTFT err = first chunk received - first chunk sent (server stamp); ITL err = |received gap - sent "
          "gap|.\nCPU% is per process (100 = one core).")
    return 1 if any(r["failed"] or r["bad"] for r in rows) else 0


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--duration-per-level", type=float, default=6.0,
                   help="target seconds per run (request count sized from a pilot run)")
    p.add_argument("--max-requests", type=int, default=20000, help="cap on measured requests per run")
    p.add_argument("--max-tokens", type=int, default=256, help="streamed chunks (tokens) per request")
    p.add_argument("--concurrency", type=int, nargs="+", default=list(CONCURRENCIES), help="levels to run")
    p.add_argument("--rounds", type=int, default=1, help="runs per client and level, alternating the order")
    p.add_argument("--peer", choices=["vllm"], default=None, help="also run this client, interleaved")
    p.add_argument("--tracing", action="store_true",
                   help="also run epdbench's client with every request traced (span + traceparent), interleaved")
    p.add_argument("--timeout", type=float, default=60.0, help="per-request timeout passed to LoadGenerator")
    p.add_argument("--loop", choices=["asyncio", "uvloop"], default="asyncio",
                   help="event loop of epdbench's client (the peer runs on asyncio's, as its own driver does)")
    p.add_argument("--no-pin", dest="pin", action="store_false",
                   help="do not pin the server and the clients to separate cores")
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)   # internal: child server mode
    a = p.parse_args()
    if a.serve:
        serve()
        sys.exit(0)
    sys.path.insert(0, str(REPO_ROOT))
    if a.loop == "uvloop":
        import uvloop
        sys.exit(uvloop.run(main(a)))
    sys.exit(asyncio.run(main(a)))
