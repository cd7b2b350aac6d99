"""Truth rows from a compare run on real engines: every configuration's cells of a results folder (`epdbench compare
--target local`, real vLLM engines) written as a truth table (benchmarks/data/README.md, analysis/truth.py), one row
per configuration × cell × stream, the client's figures from the run's summary and the engine's from its evidence:
the engine core's request histograms and its prefix- and multi-modal-cache counters over the cell's suite window
(the run snapshots every engine's /metrics before and after each suite). So the cells a truth benchmark on one
engine cannot hold — PD's and EPD's, mixed windows, one image seen again — join the table from the product's own run.

    python benchmarks/simulator/truth_from_run.py RUN_DIR --gpu "NVIDIA H100 80GB HBM3" --vllm-version 0.26.0
                                                  --out truth.csv

A mixed window's rows (their `stream` column) carry the whole window's engine figures. Bad input (no summary, no
evidence, a run on the simulator) is one line and exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from epdbench.analysis import truth
from epdbench.analysis.truth_rows import TRUTH_COLUMNS, run_rows


def read_run(run: Path) -> tuple[list[dict], dict[str, dict[str, dict]], str, str]:
    """(summary rows, config -> suite -> stages evidence, target kind, model name) of a results folder; ValueError
    (one line) where it cannot be read."""
    summary_csv, spec_yaml = run / "summary.csv", run / "spec.yaml"
    if not summary_csv.exists() or not spec_yaml.exists():
        raise ValueError(f"{run}: no summary.csv and spec.yaml (not a compare results folder)")
    spec = yaml.safe_load(spec_yaml.read_text()) or {}
    summary = pd.read_csv(summary_csv).to_dict("records")
    suites = {}
    for config in sorted({r["config"] for r in summary}):
        stages = run / "evidence" / config / "stages.json"
        if stages.exists():
            suites[config] = json.loads(stages.read_text()).get("suites") or {}
    if not suites:
        raise ValueError(f"{run}: no evidence/<config>/stages.json: the engines' figures cannot be read")
    return summary, suites, (spec.get("target") or {}).get("kind", "sim"), (spec.get("model") or {}).get("name", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run", type=Path, help="the results folder of a compare run on real engines")
    ap.add_argument("--gpu", required=True, help="the CUDA device name (nvidia-smi --query-gpu=name)")
    ap.add_argument("--vllm-version", required=True, help="the engines' vLLM version")
    ap.add_argument("--out", type=Path, required=True, help="the truth table CSV to write")
    args = ap.parse_args(argv)
    try:
        summary, suites, target, model = read_run(args.run)
        if target != "local":
            raise ValueError(f"{args.run}: a run on target {target}, not on real engines (--target local)")
        frame = pd.DataFrame(run_rows(summary, suites, gpu=args.gpu, vllm_version=args.vllm_version, model=model),
                             columns=TRUTH_COLUMNS)
        truth.check(frame)
    except (ValueError, OSError, json.JSONDecodeError, truth.TruthError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.parent.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out, index=False)
    print(f"{args.out}: {len(frame)} rows ({frame['config'].nunique()} configurations, "
          f"{frame[['suite', 'workload', 'stream', 'concurrency']].drop_duplicates().shape[0]} cells)")
    cols = ["config", "suite", "stream", "concurrency", "ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms",
            "engine_prefill_ms_mean", "engine_prefix_hit_pct", "engine_mm_hit_pct"]
    print(frame[cols].to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
