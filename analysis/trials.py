"""Repeated trials: per-metric mean and 95% confidence interval across trials (Student's t)."""
from __future__ import annotations

import math

import pandas as pd

from epdbench.analysis.gpu_telemetry import COLUMNS as TELEMETRY_COLUMNS
from epdbench.analysis.noise import SAMPLE_CI_COLUMNS, timing_of

MATCH_KEYS = ["suite", "workload", "concurrency", "stream"]   # what makes two configurations' cells comparable

# Two-sided 95% Student-t critical values by degrees of freedom (1..30); 1.96 beyond.
T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145,
       2.131, 2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048,
       2.045, 2.042]
CI_METRICS = ["ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
              "output_tok_s", "req_s", "output_tok_s_per_gpu"]


def t95(df: int) -> float:
    return T95[df - 1] if 1 <= df <= len(T95) else 1.96


def mean_ci(values) -> tuple[float | None, float | None, int]:
    """(mean, half-width of the 95% CI, n) of the non-null values; half-width None below 2 values."""
    xs = [float(v) for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))]
    if not xs:
        return None, None, 0
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return mean, None, 1
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    return mean, t95(len(xs) - 1) * sd / math.sqrt(len(xs)), len(xs)


def aggregate_trials(summary: pd.DataFrame) -> pd.DataFrame:
    """One row per config × matched cell: `<metric>` (mean over trials), `<metric>_ci95` (half-width),
    `trials`, the largest lag p99s of its trials and whether any trial was contaminated (analysis.noise)."""
    if summary.empty:
        return pd.DataFrame()
    rows = []
    for key, g in summary.groupby(["config"] + MATCH_KEYS, sort=False):
        row = dict(zip(["config"] + MATCH_KEYS, key))
        row["trials"] = int(g["trial"].nunique())
        for m in CI_METRICS:
            if m in g:
                row[m], row[f"{m}_ci95"], _ = mean_ci(g[m].tolist())
        row["requests_ok"] = int(g["requests_ok"].sum())
        row["requests_total"] = int(g["requests_total"].sum())
        row["n_ttft_samples"] = int(pd.to_numeric(g["n_ttft_samples"]).sum())
        row["n_itl_samples"] = int(pd.to_numeric(g["n_itl_samples"]).sum())
        for col in ("emulation_lag_p99_ms", "loop_lag_p99_ms"):
            lags = pd.to_numeric(g[col], errors="coerce").dropna() if col in g else pd.Series(dtype=float)
            row[col] = float(lags.max()) if len(lags) else None
        for col in TELEMETRY_COLUMNS:   # the GPUs' figures: the mean over the trials that read them
            vals = pd.to_numeric(g[col], errors="coerce").dropna() if col in g else pd.Series(dtype=float)
            row[col] = float(vals.mean()) if len(vals) else None
        row["timing"] = timing_of(g["timing"]) if "timing" in g else None
        if row["trials"] == 1:   # one trial: the percentiles' CIs from the cell's own samples
            for col in SAMPLE_CI_COLUMNS:
                row[col] = float(g[col].iloc[0]) if col in g and g[col].notna().any() else None
        row["contaminated"] = bool(g["contaminated"].fillna(False).astype(bool).any()) if "contaminated" in g else False
        rows.append(row)
    return pd.DataFrame(rows)


def low_support(metric: str, n_ttft: int, n_itl: int) -> bool:
    """A tail percentile from too few samples to mean much (p95 needs ~20, p99 ~100)."""
    if metric == "ttft_p95_ms":
        return n_ttft < 20
    if metric in ("ttft_p99_ms",):
        return n_ttft < 100
    if metric == "itl_p99_ms":
        return n_itl < 100
    return False
