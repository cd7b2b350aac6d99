"""The cost model's TP all-reduce beside benchmarks/gpu/gpu_allreduce.py's rows: before (NCCL's ring constants and the
datasheet's NVLink, physics.allreduce.nccl_seconds) and after (the law fitted to the rows, physics.allreduce).

For every row of the law's impl (CUDA-graph rows where there are any): measured / model before, and measured /
the law fitted to the other sizes of its TP (leave one out: the error between measured sizes; at the sizes
themselves the law is the rows). The node is pd-text's (H100 SXM5, NVLink 900 GB/s: the H200's figure, so no
scaling). Prints per TP the median and range of both ratios, and per row with --all.

    python benchmarks/simulator/allreduce_vs_model.py --csv physics/data/allreduce_h200x2.csv [--all]
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from epdbench.physics import allreduce
from epdbench.physics.gpu_ops import GpuOpsError, OpRow, read_ops_csv
from epdbench.specs.models import load_spec


def comparisons(rows: list[OpRow]) -> list[dict]:
    """Per row of the fitted law's impl: its size, measured ms, and the two ratios (measured / model)."""
    hw = load_spec("pd-text").hardware
    laws = allreduce.fit_laws(rows)
    out = []
    for tp, law in sorted(laws.items()):
        used = [r for r in rows if r.op == "allreduce" and r.tp == tp
                and (law.impl in r.impl if law.impl == "cuda-graph" else r.impl == law.impl)]
        sizes = sorted({r.bytes for r in used})
        for r in sorted(used, key=lambda r: r.bytes):
            others = allreduce.fit_laws([o for o in used if o.bytes != r.bytes]).get(tp)
            inside = sizes[0] < r.bytes < sizes[-1]
            out.append(dict(tp=tp, model=r.model, tokens=r.tokens, bytes=r.bytes, measured_ms=r.time_ms,
                            before=r.time_ms / (allreduce.nccl_seconds(hw, tp, r.bytes) * 1e3),
                            left_out=(r.time_ms / (others.seconds_at_source(r.bytes) * 1e3)
                                      if others is not None and inside else None)))
    return out


def summary(cases: list[dict]) -> list[str]:
    lines = []
    for tp in sorted({c["tp"] for c in cases}):
        mine = [c for c in cases if c["tp"] == tp]
        before = [c["before"] for c in mine]
        left = [c["left_out"] for c in mine if c["left_out"] is not None]
        lines.append(f"TP {tp}: {len(mine)} sizes; measured / NCCL constants: median {statistics.median(before):.2f} "
                     f"({min(before):.2f} to {max(before):.2f}); measured / law without that size: "
                     + (f"median {statistics.median(left):.3f}, worst {max(abs(x - 1) for x in left):.1%} off"
                        if left else "no interior size"))
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--csv", type=Path, default=allreduce.SOURCE_CSV, help="gpu_allreduce rows (default: %(default)s)")
    ap.add_argument("--all", action="store_true", help="one line per row too")
    args = ap.parse_args(argv)
    try:
        cases = comparisons(read_ops_csv(args.csv))
    except GpuOpsError as e:
        print(f"allreduce_vs_model: {e}", file=sys.stderr)
        return 2
    if not cases:
        print(f"allreduce_vs_model: {args.csv} has no all-reduce rows of two sizes at one TP: run "
              "benchmarks/gpu/gpu_allreduce.py", file=sys.stderr)
        return 2
    if args.all:
        for c in cases:
            left = "" if c["left_out"] is None else f", / law without it {c['left_out']:.3f}"
            print(f"TP {c['tp']} {c['model']} {c['tokens']} tokens {c['bytes']:.0f} B: {c['measured_ms'] * 1e3:.1f} "
                  f"µs, / NCCL constants {c['before']:.2f}{left}")
    print("\n".join(summary(cases)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
