"""How closely the simulator keeps its modelled timeline, idle and under host load.

Starts one simulated replica (the smoke preset's aggregated server) on loopback, streams requests one at a
time, and prints the measured inter-token gaps against the cost model's decode step, with the replica's own
emulation lag (epdbench_sim_step_lag_seconds from /metrics). `--hog N` runs N busy-loop processes meanwhile.
`--timer` instead measures how late a sleep of one decode step ends: asyncio.sleep against the engine's
timerfd sleeper (epdbench/timer.py).

    python benchmarks/simulator/sim_timing.py [--requests 8] [--tokens 256] [--hog 2] [--timer]
"""
from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

from epdbench.analysis.prom import parse_prometheus
from epdbench.physics.costmodel import CostModel
from epdbench.timer import precise_sleep
from epdbench.specs.models import load_spec


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def hog(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def stream_gaps(url: str, model: str, tokens: int) -> list[float]:
    body = json.dumps({"model": model, "prompt": "timing probe", "max_tokens": tokens, "stream": True}).encode()
    req = urllib.request.Request(url + "/v1/completions", data=body, headers={"Content-Type": "application/json"})
    stamps = []
    with urllib.request.urlopen(req, timeout=120) as r:
        for line in r:
            if line.startswith(b"data: {"):
                stamps.append(time.perf_counter())
    return [b - a for a, b in zip(stamps[1:], stamps[2:])]     # gaps after the first token: decode steps


def lag_figures(url: str) -> tuple[float, float, float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
        samples = {name: v for name, _, v in parse_prometheus(r.read().decode())}
    n = samples.get("epdbench_sim_step_lag_seconds_count", 0)
    return n, samples.get("epdbench_sim_step_lag_seconds_sum", 0) / max(n, 1), \
        samples.get("epdbench_sim_step_lag_max_seconds", 0)


def timer_overshoot(n: int = 500, step_s: float = 0.00677) -> int:
    """How late a sleep of one decode step ends: asyncio.sleep vs the timerfd sleeper the engine uses."""
    async def measure(sleep) -> list[float]:
        out = []
        for _ in range(n):
            t = time.perf_counter()
            await sleep(step_s)
            out.append((time.perf_counter() - t - step_s) * 1e3)
        return sorted(out)
    for name, sleep in (("asyncio.sleep", asyncio.sleep), ("timerfd (epdbench/timer.py)", precise_sleep())):
        xs = asyncio.run(measure(sleep))
        print(f"{name:<24} overshoot of a {step_s * 1e3:.2f} ms sleep over {n}: mean {statistics.fmean(xs):.3f} ms, "
              f"p50 {xs[n // 2]:.3f} ms, p99 {xs[int(0.99 * n)]:.3f} ms")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=256)
    ap.add_argument("--hog", type=int, default=0, help="busy-loop processes run meanwhile")
    ap.add_argument("--timer", action="store_true", help="compare the overshoot of asyncio.sleep and the timerfd")
    a = ap.parse_args()
    if a.timer:
        return timer_overshoot()
    spec = load_spec("smoke")
    config = spec.configuration("aggregated")
    modelled = CostModel(spec.model, spec.hardware, config.role("server").tp).step_seconds([64], [])
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "epdbench.sim.server", "--spec", "smoke", "--config",
                             "aggregated", "--role", "server", "--port", str(port)], stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    hogs = []
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(url + "/health", timeout=1)
                break
            except OSError:
                time.sleep(0.2)
        stop_at = time.monotonic() + 3600
        hogs = [multiprocessing.Process(target=hog, args=(stop_at,), daemon=True) for _ in range(a.hog)]
        for h in hogs:
            h.start()
        gaps = [g for _ in range(a.requests) for g in stream_gaps(url, spec.model.name, a.tokens)]
        n, lag_mean, lag_max = lag_figures(url)
    finally:
        for h in hogs:
            h.terminate()
        proc.terminate()
        proc.wait(timeout=10)
    gaps_ms = sorted(g * 1e3 for g in gaps)
    p = lambda q: gaps_ms[min(len(gaps_ms) - 1, int(q * len(gaps_ms)))]   # noqa: E731
    print(f"host load: {a.hog} busy process(es); {len(gaps_ms)} decode gaps over {a.requests} requests")
    print(f"modelled decode step      {modelled * 1e3:8.3f} ms")
    print(f"measured gap mean         {statistics.fmean(gaps_ms):8.3f} ms  ({statistics.fmean(gaps_ms) / (modelled * 1e3):.3f}×)")
    print(f"measured gap p50/p99/max  {p(0.5):8.3f} / {p(0.99):.3f} / {gaps_ms[-1]:.3f} ms")
    print(f"emulation lag (replica)   {n:.0f} steps, mean {lag_mean * 1e3:.3f} ms, max {lag_max * 1e3:.3f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
