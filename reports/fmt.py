"""Number formatting and names shared by every report surface: null stays "—", never 0."""
from __future__ import annotations

import pandas as pd

THROUGHPUT_METRICS = ("output_tok_s", "output_tok_s_per_gpu")


def fmt(value, metric: str = "") -> str:
    if value is None or (isinstance(value, float) and pd.isna(value)):
        return "—"
    if metric in THROUGHPUT_METRICS:
        return f"{value:,.1f}"
    if metric == "req_s":
        return f"{value:.2f}"
    return f"{value:,.1f}" if abs(value) >= 10 else f"{value:.2f}"


METRIC_NAMES = {
    "ttft_p50_ms": ("TTFT p50", "ms"), "ttft_p95_ms": ("TTFT p95", "ms"), "ttft_p99_ms": ("TTFT p99", "ms"),
    "tpot_p50_ms": ("TPOT p50", "ms"), "itl_p99_ms": ("ITL p99", "ms"), "itl_max_ms": ("ITL max", "ms"),
    "output_tok_s": ("output throughput", "tok/s"), "req_s": ("request throughput", "req/s"),
    "output_tok_s_per_gpu": ("output throughput per GPU", "tok/s"),
}


def cell_text(workload: str, concurrency: int, stream: str) -> str:
    return f"{workload}{'' if stream == 'main' else f' ({stream})'}, concurrency {concurrency}"
