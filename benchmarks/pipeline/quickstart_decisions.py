"""Does the quick start answer? Runs `epdbench compare` as a new user's first run does (the default preset, or
another), optionally with busy-loop processes on the other cores, and prints how many of the Verdict's cell ×
metric decisions name a winner, how many cells host load contaminated, and the wall time, with the host's load
average before and after (the machine may be shared).

    python benchmarks/pipeline/quickstart_decisions.py                        # the quick start: `epdbench compare`
    python benchmarks/pipeline/quickstart_decisions.py --busy                 # the same with a CPU burner on one core
    python benchmarks/pipeline/quickstart_decisions.py --clock real           # the quick start on the process simulator
    python benchmarks/pipeline/quickstart_decisions.py --before c872c51       # smoke as it was at that commit

Each run gets its own results folder and MLflow store under --out (default: a temporary folder, removed).
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

from epdbench.analysis.compare import compare
from epdbench.analysis.headline import baseline_config, changes_vs_baseline, headline
from epdbench.analysis.trials import aggregate_trials
from epdbench.reports.verdict import verdict_lines, verdict_view
from epdbench.specs.models import load_spec

RUN_LIMIT_S = 1800


def burn(stop_at: float) -> None:
    while time.monotonic() < stop_at:
        pass


def loadavg() -> str:
    try:
        return " ".join(Path("/proc/loadavg").read_text().split()[:3])
    except OSError:
        return "?"


def old_preset(rev: str, into: Path) -> Path:
    """specs/smoke.yaml as it was at git revision `rev`, written under `into`."""
    text = subprocess.run(["git", "show", f"{rev}:specs/smoke.yaml"], capture_output=True, text=True, check=True,
                          cwd=Path(__file__).resolve().parents[2]).stdout
    path = into / f"smoke-{rev}.yaml"
    path.write_text(text)
    return path


def tally(summary: pd.DataFrame, configurations: list[dict]) -> dict:
    """Decisions named / total (the report's Verdict), contaminated cells (configuration × matched cell, over its
    trials), and headline findings standing on a matched cell the Verdict calls contaminated (must be none)."""
    comparisons = compare(summary)
    view = verdict_view(comparisons)
    agg = aggregate_trials(summary)
    spoilt = {tuple(r) for r in agg[agg["contaminated"]][["suite", "workload", "concurrency", "stream"]].to_numpy()}
    base = baseline_config(configurations)
    findings = headline(changes_vs_baseline(agg, base), comparisons) if base else []
    return {"named": view["decided"], "total": view["total"], "contaminated": int(agg["contaminated"].sum()),
            "cells": len(agg),
            "spoilt_findings": sum(f.change.cell in spoilt for f in findings), "findings": len(findings),
            "lines": verdict_lines(comparisons)}


def run_once(spec: str, clock: str | None, busy: int, out: Path, label: str) -> dict:
    env = {**os.environ, "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "MLFLOW_DISABLE_TELEMETRY": "true"}
    cmd = [sys.executable, "-m", "epdbench.cli", "compare", "--spec", spec, "--out", str(out / label),
           "--tracking-uri", f"sqlite:///{out / (label + '-mlflow.db')}"] + (["--clock", clock] if clock else [])
    burners = [multiprocessing.Process(target=burn, args=(time.monotonic() + RUN_LIMIT_S,), daemon=True)
               for _ in range(busy)]
    for b in burners:
        b.start()
    before = loadavg()
    start = time.monotonic()
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=RUN_LIMIT_S)
    finally:
        for b in burners:
            b.terminate()
            b.join(5)
    wall = time.monotonic() - start
    after = loadavg()
    if done.returncode not in (0, 3, 5):
        tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
        raise SystemExit(f"{label}: epdbench compare exited {done.returncode}: " + " | ".join(tail))
    summary = pd.read_csv(out / label / "summary.csv")
    configurations = [{"name": c.name, "topology": c.topology} for c in load_spec(spec).configurations]
    return {**tally(summary, configurations), "wall_s": wall, "exit": done.returncode, "load_before": before,
            "load_after": after}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--spec", default="smoke", help="preset or spec path (default: smoke, the quick start's)")
    ap.add_argument("--before", metavar="REV", help="run specs/smoke.yaml as it was at this git revision instead")
    ap.add_argument("--clock", choices=["real", "virtual"], default=None, help="override the spec's clock")
    ap.add_argument("--busy", type=int, nargs="?", const=1, default=0, metavar="N",
                    help="busy-loop processes during the run (--busy alone: 1, the other core of a 2-core host)")
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--verdict", action="store_true", help="also print the terminal's Verdict lines of each run")
    ap.add_argument("--out", default=None, help="keep the runs here (default: a temporary folder)")
    args = ap.parse_args()
    if args.rounds < 1 or args.busy < 0:
        ap.error("--rounds must be at least 1 and --busy at least 0")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(args.out).resolve() if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        spec = str(old_preset(args.before, out)) if args.before else args.spec
        name = f"smoke@{args.before}" if args.before else args.spec
        print(f"# {name}, clock {args.clock or 'of the spec'}, {args.busy} busy-loop process(es), "
              f"{os.cpu_count()} CPUs", flush=True)
        for i in range(args.rounds):
            r = run_once(spec, args.clock, args.busy, out, f"run{i}-busy{args.busy}")
            print(f"{name:<16} named {r['named']:>3} / {r['total']:<3} ({100 * r['named'] / max(1, r['total']):3.0f} %)"
                  f"  contaminated cells {r['contaminated']:>2} / {r['cells']:<3}  headline findings {r['findings']}"
                  f" (on contaminated cells: {r['spoilt_findings']})  wall {r['wall_s']:6.1f} s  exit {r['exit']}"
                  f"  loadavg {r['load_before']} -> {r['load_after']}", flush=True)
            if args.verdict:
                print("\n".join(r["lines"]), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
