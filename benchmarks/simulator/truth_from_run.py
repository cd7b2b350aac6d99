"""Truth rows from runs on real engines: every configuration's cells of a results folder (`epdbench compare
--target local`, real vLLM engines) or of a GPU lane's folder (`benchmarks/gpu/gpu_local_lane.py`: the same
provisioning, load generator and verifiers, without Prefect or MLflow) written as one truth table
(benchmarks/data/README.md, analysis/truth.py), one row per configuration × cell × stream, the client's figures from
the run's summary and the engine's from its evidence: the engine core's request histograms and its prefix- and
multi-modal-cache counters over the cell's suite window (the run snapshots every engine's /metrics before and after
each suite). So the cells a truth benchmark on one engine cannot hold — PD's and EPD's, mixed windows, one image seen
again — join the table from the product's own run.

    python benchmarks/simulator/truth_from_run.py RUN_DIR --gpu "NVIDIA H100 80GB HBM3" --vllm-version 0.26.0
                                                  --out truth.csv
    python benchmarks/simulator/truth_from_run.py LANE_DIR [LANE_DIR ...] --gpu NAME --vllm-version V --out truth.csv

A lane folder is told by its lane.json. It has no summary.csv: its summary is computed from its records.parquet by
the product's own summary (analysis.metrics.summarize, what compare writes as summary.csv), each cell's GPU telemetry
taken from lane.json. Several folders (configurations measured one by one, on one GPU) make one table; a
configuration in two of them is an error. A mixed window's rows (their `stream` column) carry the whole window's
engine figures. Bad input (no summary or records, no evidence, a run on the simulator) is one line and exit 2.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import yaml

from epdbench.analysis import truth
from epdbench.analysis.metrics import RECORD_COLUMNS, summarize
from epdbench.analysis.truth_rows import TRUTH_COLUMNS, run_rows
from epdbench.tasks.rundir.results import read_records

Run = tuple[list[dict], dict[str, dict[str, dict]], str, str]


def read_run(run: Path) -> Run:
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


def read_lane(lane: Path) -> Run:
    """read_run's figures of a folder benchmarks/gpu/gpu_local_lane.py wrote (lane.json beside records.parquet and
    spec.yaml): the summary of its records by analysis.metrics.summarize, each cell's GPU telemetry from lane.json (the
    lane's own record of the cell, as a compare run's ledger holds it); each configuration's stages evidence from
    evidence/<config>/stages.json, or, a folder kept with one configuration's files laid flat
    (benchmarks/data/h100-*/lane-*), its stages.json. ValueError (one line) where it cannot be read."""
    for name in ("records.parquet", "spec.yaml"):
        if not (lane / name).is_file():
            raise ValueError(f"{lane}: lane.json but no {name} (a gpu_local_lane.py folder has lane.json, "
                             "records.parquet and spec.yaml)")
    results = json.loads((lane / "lane.json").read_text())
    if not isinstance(results, list) or not all(isinstance(r, dict) for r in results):
        raise ValueError(f"{lane}/lane.json: not a list of configurations' results (gpu_local_lane.py writes one)")
    records = read_records(lane / "records.parquet", RECORD_COLUMNS)
    if records.empty:
        raise ValueError(f"{lane}/records.parquet: no records")
    cells = {(r.get("config"), c.get("cell"), 0): c for r in results for c in r.get("cells") or []
             if isinstance(c, dict)}
    summary = summarize(records, noise=cells).to_dict("records")
    configs = sorted({r["config"] for r in summary})
    suites = {}
    for config in configs:
        stages = lane / "evidence" / config / "stages.json"
        if not stages.is_file() and len(configs) == 1:
            stages = lane / "stages.json"
        if stages.is_file():
            suites[config] = json.loads(stages.read_text()).get("suites") or {}
    if not suites:
        raise ValueError(f"{lane}: no evidence/<config>/stages.json nor stages.json: the engines' figures cannot be "
                         "read")
    spec = yaml.safe_load((lane / "spec.yaml").read_text()) or {}
    return summary, suites, (spec.get("target") or {}).get("kind", "sim"), (spec.get("model") or {}).get("name", "")


def read_folders(folders: list[Path]) -> tuple[list[dict], dict[str, dict[str, dict]], str]:
    """(summary rows, config -> suite -> stages evidence, model) of one or more results or lane folders (a lane
    folder told by its lane.json), each of a run on real engines; ValueError (one line) for a folder that is not,
    a configuration two folders hold, or folders of different models."""
    summary, suites, models = [], {}, {}
    for folder in folders:
        rows, evidence, target, model = (read_lane if (folder / "lane.json").is_file() else read_run)(folder)
        if target != "local":
            raise ValueError(f"{folder}: a run on target {target}, not on real engines (--target local)")
        configs = {r["config"] for r in rows}
        if twice := sorted(configs & {r["config"] for r in summary}):
            raise ValueError(f"{folder}: configuration {', '.join(twice)} is in an earlier folder too: one "
                             "measurement per configuration")
        models[folder] = model
        summary += rows
        suites.update(evidence)
    if len(set(models.values())) > 1:
        raise ValueError("folders of different models: " + ", ".join(f"{f} {m or '(none)'}" for f, m in models.items()))
    return summary, suites, next(iter(models.values()))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", type=Path, nargs="+", metavar="RUN",
                    help="the results folder of a compare run on real engines, or one or more folders of "
                         "benchmarks/gpu/gpu_local_lane.py")
    ap.add_argument("--gpu", required=True, help="the CUDA device name (nvidia-smi --query-gpu=name)")
    ap.add_argument("--vllm-version", required=True, help="the engines' vLLM version")
    ap.add_argument("--out", type=Path, required=True, help="the truth table CSV to write")
    args = ap.parse_args(argv)
    try:
        summary, suites, model = read_folders(args.runs)
        frame = pd.DataFrame(run_rows(summary, suites, gpu=args.gpu, vllm_version=args.vllm_version, model=model),
                             columns=TRUTH_COLUMNS)
        truth.check(frame)
    except (ValueError, OSError, json.JSONDecodeError, yaml.YAMLError, truth.TruthError) as e:
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
