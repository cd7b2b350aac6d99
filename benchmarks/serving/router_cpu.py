"""How much CPU the router (vllm-router) uses per streamed token, and how bursty that use is: what the router
pod's CPU request and limit (target.kubernetes.router.cpu) must cover so CFS throttling never lands in ITL.
Serves one configuration on the simulator with vllm-router in front, streams cells at rising concurrency,
and samples the router process's CPU time (/proc/PID/stat) every 100 ms — the CFS quota period. Prints the
chunk rate reached, the router's mean and p99/max cores over 100 ms windows, and CPU-ms per 1000 chunks,
so that the cores for another chunk rate are rate × that figure.

    python benchmarks/serving/router_cpu.py [--preset pd-text] [--config pd-tcp] [--concurrency 4,16,64] [--tokens 128]
"""
from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.transport.proxy_hop import requests  # noqa: E402
from epdbench.specs.models import load_spec, spec_to_yaml  # noqa: E402
from epdbench.tasks.sim import target as sim_target  # noqa: E402
from epdbench.tasks.load.loadgen import LoadGenerator  # noqa: E402

PERIOD_S = 0.1                       # the kernel's default CFS period (cpu.cfs_period_us = 100000)
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS          # utime + stime


class Sampler:
    """Cores used in each 100 ms window while running."""

    def __init__(self, pid: int):
        self.pid, self.cores, self._stop = pid, [], threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        last_t, last_c = time.monotonic(), cpu_seconds(self.pid)
        while not self._stop.wait(PERIOD_S):
            t, c = time.monotonic(), cpu_seconds(self.pid)
            self.cores.append((c - last_c) / (t - last_t))
            last_t, last_c = t, c

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=5)


async def cell(url: str, model: str, n: int, tokens: int, concurrency: int):
    async with LoadGenerator(url, model, timeout_s=600) as lg:
        return await lg.run_cell(requests(n, tokens), concurrency)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="pd-text")
    ap.add_argument("--config", default="pd-tcp")
    ap.add_argument("--concurrency", default="4,16,64")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=2, help="requests per cell = rounds × concurrency")
    a = ap.parse_args()
    spec = load_spec(a.preset)
    config = spec.configuration(a.config)
    with tempfile.TemporaryDirectory() as tmp:
        spec_path = Path(tmp) / "spec.yaml"
        spec_path.write_text(spec_to_yaml(spec))
        dep = sim_target.start(spec, config, spec_path, Path(tmp) / "logs")
        try:
            router = next(p for p in dep.processes if p.role == "router")
            if dep.router != "vllm-router":
                print(f"error: {a.config} is served by {dep.router}, not vllm-router", file=sys.stderr)
                return 2
            print(f"{a.preset}/{a.config} on the simulator, vllm-router pid {router.popen.pid}; "
                  f"{os.cpu_count()} host cores\n")
            print(f"{'conc':>4} {'chunks/s':>9} {'mean cores':>10} {'p99 cores':>9} {'max cores':>9} "
                  f"{'CPU-ms/1k chunks':>16}")
            for c in (int(x) for x in a.concurrency.split(",")):
                asyncio.run(cell(dep.endpoint, spec.model.name, c, 8, c))             # warm
                t0, c0 = time.monotonic(), cpu_seconds(router.popen.pid)
                with Sampler(router.popen.pid) as s:
                    recs = asyncio.run(cell(dep.endpoint, spec.model.name, a.rounds * c, a.tokens, c))
                wall, used = time.monotonic() - t0, cpu_seconds(router.popen.pid) - c0
                chunks = sum(len(r.chunk_offsets_ns or []) for r in recs if r.ok)
                windows = sorted(s.cores) or [0.0]
                p99 = windows[min(len(windows) - 1, int(0.99 * len(windows)))]
                failed = sum(not r.ok for r in recs)
                print(f"{c:>4} {chunks / wall:9.0f} {used / wall:10.3f} {p99:9.3f} {windows[-1]:9.3f} "
                      f"{1000 * 1000 * used / max(chunks, 1):16.1f}" + (f"   {failed} failed" if failed else ""))
        finally:
            sim_target.stop(dep)
    return 0


if __name__ == "__main__":
    sys.exit(main())
