"""A small open-loop rate suite for report tests: aggregated (1 GPU) and pd-rdma (2 GPUs) complete the same
tokens at every offered rate (so aggregated makes twice as many per GPU), while only pd-rdma meets the SLO."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.goodput import GOODPUT_COLUMNS
from epdbench.analysis.metrics import SUMMARY_COLUMNS
from epdbench.specs.models import Slo
from epdbench.specs.workload import rate_workload

SHAPE, RATES, CAP, TOKENS_PER_REQUEST = "4096/128", (2.0, 4.0, 8.0), 1024, 128
GPUS = {"aggregated": 1, "pd-rdma": 2}
SLOS = {"capacity": Slo(ttft_ms=2000, tpot_ms=100)}


def rate_summary() -> pd.DataFrame:
    rows = []
    for config, gpus in GPUS.items():
        for rate in RATES:
            row = {c: None for c in SUMMARY_COLUMNS}
            tok_s = rate * TOKENS_PER_REQUEST
            row.update(config=config, suite="capacity", workload=rate_workload(SHAPE, rate), concurrency=CAP,
                       stream="main", trial=0, requests_ok=48, requests_total=48, requests_failed=0,
                       ttft_p50_ms=300.0 * gpus, ttft_p95_ms=400.0 * gpus, itl_p99_ms=110.0 / gpus,
                       output_tok_s=tok_s, req_s=rate, gpus=gpus, output_tok_s_per_gpu=tok_s / gpus,
                       n_ttft_samples=48, n_itl_samples=48 * 127, contaminated=False)
            rows.append(row)
    return pd.DataFrame(rows)


def goodput_table(aggregated_sustains: float | None = None) -> pd.DataFrame:
    """pd-rdma sustains every swept rate; aggregated none (or up to `aggregated_sustains`)."""
    rows = [{"config": "pd-rdma", "suite": "capacity", "shape": SHAPE, "goodput_req_s": RATES[-1],
             "goodput_req_s_per_gpu": RATES[-1] / GPUS["pd-rdma"], "upper_req_s": None,
             "highest_rate_swept": RATES[-1], "target": 0.9, "note": ""},
            {"config": "aggregated", "suite": "capacity", "shape": SHAPE, "goodput_req_s": aggregated_sustains,
             "goodput_req_s_per_gpu": aggregated_sustains and aggregated_sustains / GPUS["aggregated"],
             "upper_req_s": None if aggregated_sustains else RATES[0], "highest_rate_swept": RATES[-1],
             "target": 0.9, "note": ""}]
    table = pd.DataFrame(rows, columns=GOODPUT_COLUMNS)
    return table.astype(object).where(table.notna(), None)


def rate_meta() -> dict:
    return {"title": "epdbench: rates", "run": "r1", "spec": "rates", "target": "sim", "model": "toy/vl",
            "hardware": "H100-SXM5-80GB figures", "seed": 0, "trials": 1, "created": "2026-01-01T00:00:00",
            "configurations": [{"name": name, "topology": "aggregated" if name == "aggregated" else "pd",
                                "roles": "…", "gpus": gpus, "transport": "none" if gpus == 1 else "rdma",
                                "router": "vllm-router"} for name, gpus in GPUS.items()],
            "failures": {}}


VERDICTS = {name: {"transport": "emulated", "transport_reasons": ["emulated"], "stages": "emulated",
                   "stage_reasons": ["all seen"], "fraction_seen": {}} for name in GPUS}
