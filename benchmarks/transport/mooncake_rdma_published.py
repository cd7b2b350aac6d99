"""Mooncake's RDMA transport per KV transfer, from the Mooncake team's own measurement (no RDMA NIC here).

The simulator prices one KV transfer over RDMA as a fixed cost (`hardware.rdma_latency_ms`: posting the
request's 64 KiB slices and waiting for the last completion) plus its bytes at the sending pod's NIC line rate
times an efficiency (`hardware.rdma_efficiency`). Both come from this script: it fits T = latency + bytes /
bandwidth to the transfer times Mooncake published for vLLM's MooncakeConnector between two H800 nodes —
`docs/source/performance/vllm/vllm-v1-pd-performance.md` of kvcache-ai/Mooncake (snapshot 3b5a594), "Detailed
Performance Data": Qwen3-8B, TP 8 on each side, 8 × ConnectX-7 RoCE per node ("approximately 200 GB/s for the
8x RoCE connections"), prefix caching off, one request at a time (`--max-concurrency 1`), prompts of 128 to
32768 tokens. vLLM's MooncakeConnector times exactly the engine's `batch_transfer_sync_write` call (its
`_send_blocks`: perf_counter around the call, recorded in its transfer stats and logged at DEBUG level, which
their launch commands set), the same span the simulator's two constants price.

The table's units are binary: 20 MB / 0.54 ms is its 36.53 "GB/s" only as MiB and GiB/s (and so for every
row), so sizes are taken as MiB and GiB. The fit weighs each row by its relative error (a least-squares fit
on absolute times would be decided by the 4.5 GiB row alone); the 95 % interval of the intercept is the fit's
own (Student t, n − 2 degrees of freedom). The efficiency is the fitted bandwidth over 8 × 200 Gbit/s.

    python benchmarks/transport/mooncake_rdma_published.py
"""
from __future__ import annotations

import math

from scipy import stats

MiB, GiB = 2 ** 20, 2 ** 30
LINE_RATE_B_S = 8 * 200e9 / 8          # 8 RoCE interfaces of 200 Gbit/s ("approximately 200 GB/s")

# (prompt tokens, KV size in bytes, "Actual Transfer Time (ms)") as published
TABLE = [
    (128, 20 * MiB, 0.54),
    (256, 38 * MiB, 0.61),
    (512, 74 * MiB, 0.92),
    (1024, 146 * MiB, 1.50),
    (2048, 290 * MiB, 2.51),
    (4096, 578 * MiB, 4.75),
    (8192, 1.13 * GiB, 8.84),
    (16384, 2.25 * GiB, 16.43),
    (32768, 4.50 * GiB, 31.65),
]


def fit(rows: list[tuple[int, float, float]]) -> dict:
    """Weighted least squares of T = a + S·b with weights 1/T (relative residuals); a's 95 % interval."""
    s = [r[1] for r in rows]
    t = [r[2] / 1e3 for r in rows]
    w = [1 / x for x in t]
    # normal equations of the weighted problem (rows scaled by w)
    sww = sum(x * x for x in w)
    swws = sum(wi * wi * si for wi, si in zip(w, s))
    swwss = sum(wi * wi * si * si for wi, si in zip(w, s))
    swwt = sum(wi * wi * ti for wi, ti in zip(w, t))
    swwst = sum(wi * wi * si * ti for wi, si, ti in zip(w, s, t))
    det = sww * swwss - swws * swws
    a = (swwss * swwt - swws * swwst) / det
    b = (sww * swwst - swws * swwt) / det
    n = len(rows)
    resid = [wi * (ti - a - b * si) for wi, si, ti in zip(w, s, t)]
    s2 = sum(r * r for r in resid) / (n - 2)
    half = stats.t.ppf(0.975, n - 2) * math.sqrt(s2 * swwss / det)
    worst = max(abs((a + b * si - ti) / ti) for si, ti in zip(s, t))
    return {"n": n, "latency_ms": a * 1e3, "lo_ms": (a - half) * 1e3, "hi_ms": (a + half) * 1e3,
            "bandwidth_b_s": 1 / b, "efficiency": (1 / b) / LINE_RATE_B_S, "worst_rel": worst}


def main() -> int:
    print("Mooncake over RDMA (H800, 8 x ConnectX-7 RoCE, vLLM MooncakeConnector, Mooncake docs @3b5a594)")
    print(f"{'rows':<28} {'latency ms':>10} {'95% interval':>16} {'GB/s':>7} {'efficiency':>10} {'worst fit':>9}")
    for label, rows in (("all 9 (20 MiB - 4.5 GiB)", TABLE), ("first 7 (to 1.13 GiB)", TABLE[:7]),
                        ("first 5 (to 290 MiB)", TABLE[:5])):
        f = fit(rows)
        interval = f"[{f['lo_ms']:.3f}, {f['hi_ms']:.3f}]"
        print(f"{label:<28} {f['latency_ms']:>10.3f} {interval:>16} {f['bandwidth_b_s'] / 1e9:>7.1f} "
              f"{f['efficiency']:>10.3f} {f['worst_rel']:>9.1%}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
