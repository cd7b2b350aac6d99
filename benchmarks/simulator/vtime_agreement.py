"""Do the virtual-time core and the HTTP simulator agree, and how much faster is it? Runs a spec (default
smoke) with `epdbench compare` on the HTTP simulator — or takes the summary of such a run (--from) — and the
same spec in virtual time (tasks.sim.vrun), and prints per cell and metric both figures, their ratio, the
allowance (analysis.agreement) and whether they agree, then the counts and both run times.

    python benchmarks/simulator/vtime_agreement.py [--spec smoke] [--out /tmp/vtime-agreement]
    python benchmarks/simulator/vtime_agreement.py --from results/<run>        # a finished HTTP-simulator run
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

from epdbench.analysis.agreement import INFORMATIVE, METRICS, agreement
from epdbench.specs.models import load_spec
from epdbench.tasks.sim.vrun import simulate_summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="smoke")
    ap.add_argument("--from", dest="source", default=None, help="results folder of an HTTP-simulator run")
    ap.add_argument("--out", default="/tmp/vtime-agreement")
    args = ap.parse_args()
    http_s = None
    if args.source:
        rdir = Path(args.source)
    else:
        rdir = Path(args.out) / "http"
        t0 = time.monotonic()
        done = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", args.spec, "--out", str(rdir),
                               "--tracking-uri", f"sqlite:///{Path(args.out).resolve() / 'mlflow.db'}"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        if done.returncode not in (0, 5):
            print(done.stderr[-3000:], file=sys.stderr)
            return 1
        http_s = time.monotonic() - t0
    spec = load_spec(str(rdir / "spec.yaml"))
    t0 = time.perf_counter()
    virtual = simulate_summary(spec)
    virtual_s = time.perf_counter() - t0
    http = pd.read_csv(rdir / "summary.csv")
    table = agreement(http, virtual, METRICS + INFORMATIVE)
    pd.set_option("display.width", 220)
    pd.set_option("display.max_rows", 500)
    print(table.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    judged = table[table["metric"].isin(METRICS) & table["judged"]]
    print(f"\nspec {spec.name}: {int(judged['agrees'].sum())} of {len(judged)} judged figures agree "
          f"({int((table['metric'].isin(METRICS) & ~table['judged']).sum())} not judged: HTTP cell contaminated by "
          "host load) "
          f"({', '.join(METRICS)}); informative only: "
          + ", ".join(f"{m} {int(g['agrees'].sum())} of {len(g)}" for m, g in table[table['metric'].isin(INFORMATIVE)]
                      .groupby('metric')))
    for m, g in table.groupby("metric", sort=False):
        print(f"  {m:<14} virtual/HTTP ratio min {g['ratio'].min():.3f}, median {g['ratio'].median():.3f}, "
              f"max {g['ratio'].max():.3f}")
    print(f"virtual time: {virtual_s:.1f} s" + (f"; HTTP simulator: {http_s:.0f} s (×{http_s / virtual_s:.0f})"
                                                 if http_s else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
