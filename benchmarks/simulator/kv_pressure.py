"""Shared prefixes under KV-cache pressure: the `epd-reuse` preset's mm-reuse suite (every request sends the
same image, so 4096 of its 4519 prompt tokens are a prefix it shares with the others) in virtual time, with
the KV cache cut to a few request's worth (engine.num_gpu_blocks_override). Prints per configuration and
concurrency the requests finished, the mean cached tokens, TTFT and end-to-end p50 and requests per second.
With the prefix cache part of the block pool (sim.prefix_cache) the concurrent requests hold the shared
blocks once; counting each request's blocks on its own admits a fraction of them.

    python benchmarks/simulator/kv_pressure.py [--blocks 400 1000] [--spec epd-reuse]
"""
from __future__ import annotations

import argparse
import statistics

from epdbench.specs.models import load_spec
from epdbench.tasks.sim.vrun import prompt_calibration, simulate_configuration


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="epd-reuse", help="preset or spec path (default: epd-reuse)")
    ap.add_argument("--suite", default="mm-reuse", help="suite to report (default: mm-reuse)")
    ap.add_argument("--blocks", type=int, nargs="+", default=[400, 1000],
                    help="KV cache sizes in 16-token blocks (default: 400 1000)")
    args = ap.parse_args()
    base = load_spec(args.spec)
    for n_blocks in args.blocks:
        spec = base.model_copy(update={"engine": base.engine.model_copy(
            update={"num_gpu_blocks_override": n_blocks})})
        calibration = prompt_calibration(spec)
        for config in spec.configurations:
            rows = [r for r in simulate_configuration(spec, config, calibration)
                    if r["phase"] == "measured" and r["suite"] == args.suite]
            for conc in sorted({r["concurrency"] for r in rows}):
                cell = [r for r in rows if r["concurrency"] == conc]
                ok = [r for r in cell if r["ok"]]
                if not ok:
                    print(f"blocks={n_blocks} {config.name:<11} c={conc} 0 of {len(cell)} finished")
                    continue
                first = min(r["send_ns"] for r in ok) / 1e6
                span_s = (max(r["send_ns"] / 1e6 + r["e2e_ms"] for r in ok) - first) / 1e3
                print(f"blocks={n_blocks} {config.name:<11} c={conc} {len(ok)} of {len(cell)} finished, "
                      f"cached {statistics.mean(r['cached_tokens'] for r in ok):.0f} tokens, "
                      f"TTFT p50 {statistics.median(r['ttft_ms'] for r in ok):.1f} ms, "
                      f"e2e p50 {statistics.median(r['e2e_ms'] for r in ok):.1f} ms, {len(ok) / span_s:.2f} req/s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
