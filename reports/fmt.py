"""Number formatting and names shared by every report surface: null stays "—", never 0."""
from __future__ import annotations

import re

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


_NUMBER = re.compile(r"\d+(?:\.\d+)?")


def workload_key(workload: str) -> tuple:
    """Sort key of a workload label in numeric order: 512/64 before 4096/64, @4/s before @16/s."""
    text = str(workload)
    parts: list = []
    last = 0
    for m in _NUMBER.finditer(text):
        parts += [(0, text[last:m.start()]), (1, float(m.group()))]
        last = m.end()
    return tuple(parts + [(0, text[last:])])


def matched_order(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows of one matched cell together: streams and configurations in order of first appearance, workloads in
    numeric order, then concurrency."""
    if frame.empty:
        return frame
    streams = {s: i for i, s in enumerate(dict.fromkeys(frame["stream"]))}
    configs = {c: i for i, c in enumerate(dict.fromkeys(frame["config"]))}
    keys = [(streams[st], workload_key(w), int(c), configs[cfg])
            for st, w, c, cfg in zip(frame["stream"], frame["workload"], frame["concurrency"], frame["config"])]
    order = sorted(range(len(frame)), key=keys.__getitem__)
    return frame.iloc[order]
