"""Matched comparison of configurations: per cell and metric, the best configuration and ratios."""
from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from epdbench.analysis.metrics import HIGHER_IS_BETTER, LOWER_IS_BETTER

MATCH_KEYS = ["suite", "workload", "concurrency", "stream"]
REPORT_METRICS = ["ttft_p50_ms", "ttft_p95_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms", "output_tok_s", "req_s",
                  "output_tok_s_per_gpu"]


@dataclass(frozen=True)
class Comparison:
    suite: str
    workload: str
    concurrency: int
    stream: str
    metric: str
    values: dict            # config -> value (None when no data)
    best: str | None        # the one config with the best value (None on a tie for first place)
    worst: str | None       # a config with the worst value (None when all are equal)
    ratio: float | None     # worst/best for lower-is-better, best/worst for higher-is-better (>= 1)


def ratio_phrase(metric: str, ratio: float | None) -> str:
    if ratio is None:
        return ""
    return f"{ratio:.1f}× {'lower' if metric in LOWER_IS_BETTER else 'higher'}"


def compare(summary: pd.DataFrame, metrics: list[str] = REPORT_METRICS) -> list[Comparison]:
    """Compare every matched cell (same suite, workload, concurrency, stream) across configurations.
    Trials are averaged first."""
    if summary.empty:
        return []
    agg = (summary.groupby(MATCH_KEYS + ["config"], sort=False)[metrics]
           .agg(lambda s: s.dropna().astype(float).mean() if s.notna().any() else None).reset_index())
    out: list[Comparison] = []
    for key, cell in agg.groupby(MATCH_KEYS, sort=False):
        for metric in metrics:
            values = {r["config"]: (None if pd.isna(r[metric]) else float(r[metric])) for _, r in cell.iterrows()}
            present = {c: v for c, v in values.items() if v is not None}
            best = worst = None
            ratio = None
            if len(present) >= 2:
                ordered = sorted(present, key=lambda c: present[c], reverse=metric in HIGHER_IS_BETTER)
                b, w = present[ordered[0]], present[ordered[-1]]
                if b != present[ordered[1]]:          # a tie for first place is no one's win
                    best = ordered[0]
                if b != w:
                    worst = ordered[-1]
                    if metric in LOWER_IS_BETTER:
                        ratio = (w / b) if b > 0 else None
                    else:
                        ratio = (b / w) if w > 0 else None
            out.append(Comparison(*key, metric=metric, values=values, best=best, worst=worst, ratio=ratio))
    return out


def wins(comparisons: list[Comparison]) -> dict[str, dict[str, int]]:
    """metric -> config -> number of matched cells it wins."""
    table: dict[str, dict[str, int]] = {}
    for c in comparisons:
        if c.best is None or c.worst is None:
            continue
        table.setdefault(c.metric, {})
        table[c.metric][c.best] = table[c.metric].get(c.best, 0) + 1
    return table
