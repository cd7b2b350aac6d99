"""What the API server hop costs the figures of an outside-the-cluster client: the same requests, sent to the
router directly and through the Kubernetes API server's service proxy (the fake API server of the tests,
fronting the simulator on loopback — the path `compare --target kubernetes` takes today with
`access: service-proxy`), timed by arrival at the client as on real hardware. Prints TTFT p50 and ITL p99/p50
per concurrency for both paths and their difference.

    python benchmarks/transport/proxy_hop.py [--requests 32] [--tokens 64] [--concurrency 1,4,16]
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from epdbench.specs.workload import RequestSpec  # noqa: E402
from epdbench.tasks.k8s import target as k8s_target  # noqa: E402
from epdbench.tasks.load.loadgen import LoadGenerator  # noqa: E402
from tests.k8s.fake_apiserver import SPEC_PATH, FakeApiServer, k8s_spec  # noqa: E402


def requests(n: int, tokens: int, prompt_words: int = 256) -> list[RequestSpec]:
    return [RequestSpec(i, "measured", "completions", {"prompt": " ".join(f"w{i}x{k}" for k in range(prompt_words)),
                                                       "max_tokens": tokens, "ignore_eos": True},
                        prompt_words, tokens, f"hop-{i}") for i in range(n)]


def arrival_figures(records) -> tuple[float, float, float]:
    """TTFT p50, ITL p50 and ITL p99 (ms) from when chunks arrived (what a client without stamps measures)."""
    ttft, itl = [], []
    for r in records:
        arrivals = r.chunk_arrival_ns or r.chunk_offsets_ns
        if not r.ok or not arrivals:
            continue
        ttft.append(arrivals[0] / 1e6)
        itl += [(b - a) / 1e6 for a, b in zip(arrivals, arrivals[1:])]
    itl.sort()
    return statistics.median(ttft), itl[len(itl) // 2], itl[min(len(itl) - 1, int(0.99 * len(itl)))]


async def measure(url: str, model: str, reqs: list[RequestSpec], concurrency: int):
    async with LoadGenerator(url, model, timeout_s=120) as lg:
        await lg.run_cell(reqs[:concurrency], concurrency)          # warm the path
        return await lg.run_cell(reqs, concurrency)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="1,4,16")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        fake = FakeApiServer(work / "cluster", SPEC_PATH).start()
        dep = None
        try:
            spec = k8s_spec(fake.kubeconfig(work / "kubeconfig"))
            run_dir = work / "results" / "hop"
            run_dir.mkdir(parents=True)
            dep = k8s_target.start(spec, spec.configuration("aggregated"), run_dir / "spec.yaml",
                                   run_dir / "evidence" / "aggregated")
            router_pod = next(name for name in fake.kubelet.lives if "router" in name)
            direct = f"http://127.0.0.1:{fake.kubelet.ready_life(router_pod).port}"
            print(f"router directly: {direct}\nthrough the API server: {dep.endpoint}\n")
            print(f"{'conc':>4}  {'path':<11} {'TTFT p50':>9} {'ITL p50':>8} {'ITL p99':>8}   (ms, by arrival; "
                  f"{a.requests} requests × {a.tokens} tokens)")
            for c in (int(x) for x in a.concurrency.split(",")):
                rows = {}
                for name, url in (("direct", direct), ("api-proxy", dep.endpoint)):
                    recs = asyncio.run(measure(url, spec.model.name, requests(a.requests, a.tokens), c))
                    failed = sum(not r.ok for r in recs)
                    rows[name] = arrival_figures(recs)
                    print(f"{c:>4}  {name:<11} {rows[name][0]:9.2f} {rows[name][1]:8.3f} {rows[name][2]:8.3f}"
                          + (f"   {failed} failed" if failed else ""))
                d, p = rows["direct"], rows["api-proxy"]
                print(f"{c:>4}  {'hop adds':<11} {p[0] - d[0]:+9.2f} {p[1] - d[1]:+8.3f} {p[2] - d[2]:+8.3f}")
        finally:
            if dep is not None:
                k8s_target.stop(dep)
            fake.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
