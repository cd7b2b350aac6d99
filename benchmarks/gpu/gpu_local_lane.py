"""The local target on a GPU host without epdbench's orchestration stack: every configuration of a spec provisioned
by the local target (real vLLM engines, vllm-router or the EPD proxy in front, all on loopback), its cells measured
by the product's load generator, its transport and stage evidence collected and verified by the product's own
verifiers — what `epdbench compare --target local` does per configuration, minus Prefect and MLflow, so that a GPU
host that only has vLLM's environment (`epdbench engine-env --wheelhouse`) can run it.

    python benchmarks/gpu/gpu_local_lane.py --spec gpu-qwen25vl --vllm-python PY --out DIR [--configs a,b]

Writes, per configuration, `evidence/<config>/` (logs, metrics before/after, transport.json, stages.json), all
records in `records.parquet`, and `lane.json` (each configuration's verdicts and cell figures); prints a line per
cell and per verdict. Exit 0 when every configuration served every cell and its evidence is `verified`, 3
otherwise. Every process it starts ends with it.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import traceback
from pathlib import Path

from epdbench.analysis.metrics import summarize_cell
from epdbench.specs.models import load_spec, spec_to_yaml
from epdbench.specs.workload import Calibration, build_requests, calibration_keys, plan_cells
from epdbench.tasks import evidence
from epdbench.tasks.load.calibrate import calibrate
from epdbench.tasks.load.loadgen import LoadGenerator, records_as_dicts
from epdbench.tasks.local import target
from epdbench.tasks.rundir.results import append_records


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def fmt(v) -> str:
    return "-" if v is None else (f"{v:.1f}" if isinstance(v, float) else str(v))


async def run_cells(spec, config, url: str, cal: Calibration, cells, rows_out: list, telemetry=None) -> list[dict]:
    out = []
    async with LoadGenerator(url, spec.model.name, spec.request_timeout_s, run_tag=config.name[:8]) as lg:
        for cell in cells:
            recs = await lg.run_cell(build_requests(spec, cell, 0, calibration=cal), cell.concurrency)
            rows = [{**d, "run": "gpu-lane", "trial": 0, "config": config.name, "suite": cell.suite,
                     "cell": cell.cell_id, "workload": cell.workload, "stream": cell.stream,
                     "concurrency": cell.concurrency} for d in records_as_dicts(recs)]
            rows_out.extend(rows)
            import pandas as pd
            s = summarize_cell(pd.DataFrame(rows))
            figures = {k: s.get(k) for k in ("requests_ok", "requests_total", "prompt_tokens_mean", "ttft_p50_ms",
                                             "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s")}
            gpu = telemetry.cell(rows) if telemetry is not None else {}   # the GPU over the cell (NVML)
            out.append({"cell": cell.cell_id, **figures, **gpu})
            say(f"[{config.name}] {cell.suite} {cell.workload} c{cell.concurrency}: ok {s['requests_ok']}/"
                f"{s['requests_total']}, prompt {fmt(s['prompt_tokens_mean'])} tokens, TTFT p50 "
                f"{fmt(s['ttft_p50_ms'])} ms, TPOT p50 {fmt(s['tpot_p50_ms'])} ms, ITL p99 {fmt(s['itl_p99_ms'])} ms, "
                f"{fmt(s['output_tok_s'])} tok/s"
                + (f", GPU {fmt(gpu.get('gpu_util_pct_mean'))} % {fmt(gpu.get('gpu_power_w_mean'))} W, "
                   f"{fmt(gpu.get('energy_j_per_token'))} J/token" if gpu else ""))
    return out


def run_configuration(spec, config, rdir: Path) -> dict:
    ev_dir = rdir / "evidence" / config.name
    ev_dir.mkdir(parents=True, exist_ok=True)
    result: dict = {"config": config.name, "ok": False}
    dep = None
    started = time.monotonic()
    try:
        dep = target.start(spec, config, rdir / "spec.yaml", ev_dir)
        result["start_s"] = round(time.monotonic() - started, 1)
        say(f"[{config.name}] serving at {dep.endpoint} via {dep.router} after {result['start_s']} s"
            + (f"; {dep.telemetry_note}" if dep.telemetry_note else ""))
        engine = next(p for p in dep.engines if p.role in ("server", "prefill"))
        cal = calibrate(engine.url, spec.model.name, calibration_keys(spec))
        first = snap = evidence.snapshot(dep)
        suites, rows, cells = {}, [], []
        for suite in spec.suites:
            suite_rows: list[dict] = []
            cells += asyncio.run(run_cells(spec, config, dep.endpoint, cal,
                                           [c for c in plan_cells(spec) if c.suite == suite.name], suite_rows,
                                           dep.telemetry))
            after = evidence.snapshot(dep)
            suites[suite.name] = evidence.suite_evidence(dep, config, snap, after, suite_rows, False)
            rows += suite_rows
            snap = after
        append_records(rdir / "records.parquet", rows)
        transport, stages = evidence.collect(dep, spec, config, first, snap, rows, suites, ev_dir, False)
        result.update(ok=all(c["requests_ok"] == c["requests_total"] for c in cells), cells=cells,
                      transport=transport.get("verdict"), transport_reasons=transport.get("reasons"),
                      stages=stages.get("verdict"), stages_reasons=stages.get("reasons"))
        if "ec" in transport:
            result.update(ec=transport["ec"].get("verdict"), ec_reasons=transport["ec"].get("reasons"))
    except Exception as e:  # noqa: BLE001 - one configuration's failure must not stop the others
        result["error"] = f"{type(e).__name__}: {e}"
        traceback.print_exc()
    finally:
        if dep is not None:
            target.stop(dep)
    for key in ("transport", "ec", "stages"):
        if key in result:
            say(f"[{config.name}] {key}: {result[key]} — {'; '.join(result.get(key + '_reasons') or [])[:600]}")
    if "error" in result:
        say(f"[{config.name}] failed: {result['error'][:600]}")
    return result


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--spec", default="gpu-qwen25vl")
    ap.add_argument("--vllm-python", required=True)
    ap.add_argument("--configs", help="comma-separated configuration names (default: all)")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    spec = load_spec(args.spec)
    spec = spec.model_copy(update={"target": spec.target.model_copy(update={
        "local": spec.target.local.model_copy(update={"vllm_python": args.vllm_python})})})
    rdir = Path(args.out)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "spec.yaml").write_text(spec_to_yaml(spec))
    wanted = set(args.configs.split(",")) if args.configs else None
    results = [run_configuration(spec, c, rdir) for c in spec.configurations if wanted is None or c.name in wanted]
    (rdir / "lane.json").write_text(json.dumps(results, indent=2, default=str))
    good = all(r["ok"] and r.get("transport") in ("verified", "not-applicable") and r.get("stages") == "verified"
               and r.get("ec", "verified") in ("verified", "not-applicable") for r in results)
    return 0 if good and results else 3


if __name__ == "__main__":
    sys.exit(main())
