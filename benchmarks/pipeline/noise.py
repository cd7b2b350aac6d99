"""Does host load move the simulator's numbers? Runs the smoke preset idle and with a CPU hog on every core
(or idle twice) and prints, per cell and metric, the ratio between the two runs, which cells were marked
contaminated, and whether the two runs name the same winner (or tie) in every matched cell.

    python benchmarks/pipeline/noise.py                       # idle, then a hog per core
    python benchmarks/pipeline/noise.py --idle-twice          # two identical idle runs: verdicts must agree
    python benchmarks/pipeline/noise.py --time-scale 2 --spec smoke --out /tmp/noise

Each run is `epdbench compare` on the simulator with its own results folder and MLflow store under --out.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from epdbench.analysis.compare import VERDICT_METRICS, compare
from epdbench.analysis.noise import distinct
from epdbench.specs.models import load_spec, spec_to_yaml

METRICS = ["ttft_p50_ms", "itl_p99_ms", "tpot_p50_ms", "output_tok_s"]
SPREAD_METRICS = ["ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
                  "output_tok_s", "req_s", "output_tok_s_per_gpu"]
WITHIN = 0.10     # the bar: within 10% of the idle run, or marked contaminated
KEYS = ["config", "suite", "workload", "concurrency", "stream"]


def hog(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def run(name: str, spec_path: Path, out: Path, hogs: int) -> tuple[pd.DataFrame, float]:
    rdir = out / name
    procs = [multiprocessing.Process(target=hog, args=(time.monotonic() + 3600,), daemon=True) for _ in range(hogs)]
    for p in procs:
        p.start()
    t0 = time.monotonic()
    try:
        cmd = [sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec_path), "--out", str(rdir),
               "--tracking-uri", f"sqlite:///{out / (name + '-mlflow.db')}"]
        print(f"# {name}: {' '.join(cmd[2:])}" + (f" with {hogs} busy-loop processes" if hogs else ""), flush=True)
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode not in (0, 5):
            print(done.stderr[-3000:], file=sys.stderr)
            raise SystemExit(f"{name}: epdbench compare exited {done.returncode}")
    finally:
        for p in procs:
            p.terminate()
            p.join(5)
    return pd.read_csv(rdir / "summary.csv"), time.monotonic() - t0


def side(row, suffix: str) -> dict:
    """One run's summary row (columns without the merge suffix), as a single trial."""
    return {**{k: row[k] for k in KEYS}, **{k[: -len(suffix)]: v for k, v in row.items() if k.endswith(suffix)},
            "trials": 1}


def beyond_sample_cis(r, metric: str) -> float | None:
    """|b − a| beyond what the two cells' sample CIs reach towards each other (each side from its bounds, else the
    larger half-width), relative to a: the run-to-run spread the cells' own samples do not explain."""
    va, vb = r[f"{metric}_a"], r[f"{metric}_b"]
    if pd.isna(va) or pd.isna(vb) or not va:
        return None

    def reach(suffix: str, up: bool) -> float:
        value, half = r[f"{metric}{suffix}"], r.get(f"{metric}_sample_ci95{suffix}")
        bound = r.get(f"{metric}_sample_ci95_{'hi' if up else 'lo'}{suffix}")
        if bound is not None and not pd.isna(bound):
            return abs(bound - value)
        return 0.0 if half is None or pd.isna(half) else float(half)

    reached = reach("_a", vb > va) + reach("_b", va > vb)
    return max(0.0, abs(vb - va) - reached) / va


def verdicts(summary: pd.DataFrame) -> dict[tuple, str | None]:
    return {(c.suite, c.workload, c.concurrency, c.stream, c.metric): c.verdict
            for c in compare(summary, VERDICT_METRICS)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="smoke")
    ap.add_argument("--time-scale", type=float, default=None, help="target.sim.time_scale (default: the spec's)")
    ap.add_argument("--idle-twice", action="store_true", help="two idle runs instead of idle and hogged")
    ap.add_argument("--hogs", type=int, default=os.cpu_count() or 2, help="busy-loop processes (default: one per core)")
    ap.add_argument("--out", default="results/noise-benchmark")
    args = ap.parse_args()

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    spec = load_spec(args.spec)
    if args.time_scale is not None:
        spec = spec.model_copy(update={"target": spec.target.model_copy(update={
            "sim": spec.target.sim.model_copy(update={"time_scale": args.time_scale})})})
    spec_path = out / "spec.yaml"
    spec_path.write_text(spec_to_yaml(spec))
    scale = spec.target.sim.time_scale
    second = ("idle-2", 0) if args.idle_twice else ("hog", args.hogs)
    a, ta = run("idle", spec_path, out, 0)
    b, tb = run(second[0], spec_path, out, second[1])
    print(f"\nspec {spec.name}, time_scale {scale:g}; runs took {ta:.0f} s (idle) and {tb:.0f} s ({second[0]})\n")

    m = a.merge(b, on=KEYS + ["trial"], suffixes=("_a", "_b"))
    header = f"{'config':<11} {'cell':<22} " + " ".join(f"{x:>22}" for x in METRICS) + "  contaminated (idle/other)"
    print(header)
    print("-" * len(header))
    ok = total = explained = 0
    for _, r in m.iterrows():
        cells = []
        for metric in METRICS:
            va, vb = r[f"{metric}_a"], r[f"{metric}_b"]
            if pd.isna(va) or pd.isna(vb) or not va:
                cells.append(f"{'—':>22}")
                continue
            ratio = vb / va
            cells.append(f"{va:9.2f} {vb:9.2f} {ratio:4.2f}"[-22:].rjust(22))
            if metric in ("ttft_p50_ms", "itl_p99_ms"):
                total += 1
                good = abs(ratio - 1) <= WITHIN or bool(r["contaminated_b"])
                ok += good
                explained += good or not distinct(side(r, "_a"), side(r, "_b"), metric)
        cell = f"{r['suite']} {r['workload']} c={r['concurrency']}"
        print(f"{r['config']:<11} {cell:<22} " + " ".join(cells)
              + f"  {bool(r['contaminated_a'])}/{bool(r['contaminated_b'])}")
    lag = pd.concat([a.assign(run="idle"), b.assign(run=second[0])])
    for name, g in lag.groupby("run", sort=False):
        print(f"\n{name}: lag p99 (median / max over cells): emulation {g['emulation_lag_p99_ms'].median():.3f} / "
              f"{g['emulation_lag_p99_ms'].max():.3f} ms, client {g['loop_lag_p99_ms'].median():.3f} / "
              f"{g['loop_lag_p99_ms'].max():.3f} ms, token delivery {g['delivery_lag_p99_ms'].median():.3f} / "
              f"{g['delivery_lag_p99_ms'].max():.3f} ms; timing {', '.join(sorted(set(map(str, g['timing']))))}; "
              f"{int(g['contaminated'].sum())} of {len(g)} cells contaminated")
    clean = m[~m["contaminated_a"].astype(bool) & ~m["contaminated_b"].astype(bool)]
    for label, part in (("main cells", clean[clean["stream"] == "main"]),
                        ("streams of mixed suites", clean[clean["stream"] != "main"])):
        print(f"\nrun-to-run spread |b/a − 1| over {label} clean in both runs (median / p90 / max):")
        for metric in SPREAD_METRICS:
            r = (part[f"{metric}_b"] / part[f"{metric}_a"] - 1).abs().dropna()
            beyond = pd.Series([beyond_sample_cis(x, metric) for _, x in part.iterrows()], dtype=float).dropna()
            if len(r):
                print(f"  {metric:<22} {r.median():6.3f} / {r.quantile(0.9):6.3f} / {r.max():6.3f}; beyond the cells' "
                      f"sample CIs: max {beyond.max():6.3f}  ({len(r)} cells)")
    print(f"\nTTFT p50 and ITL p99 within {100 * WITHIN:.0f}% of the idle run or marked contaminated: {ok} of {total}; "
          f"also counting differences inside the two cells' noise bands (analysis.noise.distinct): {explained} of {total}")
    va, vb = verdicts(a), verdicts(b)
    differ = [(k, va[k], vb.get(k)) for k in va if va[k] != vb.get(k)]
    print(f"verdicts (winner / tie / contaminated) agreeing between the runs: {len(va) - len(differ)} of {len(va)}")
    for k, x, y in differ:
        print(f"  {' '.join(map(str, k))}: {x} vs {y}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
