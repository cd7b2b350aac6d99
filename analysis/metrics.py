"""Per-cell statistics from raw request records (pure pandas; no I/O).

Definitions (DESIGN.md): measured requests only; TTFT = send → first content chunk; ITL = every gap
between consecutive content chunks, pooled over the cell; TPOT = (E2E − TTFT)/(output − 1) per
request; throughput over the cell window (first send → last completion). No data → null, never 0.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from epdbench.analysis.noise import (SAMPLE_CI_METRICS, cell_noise, delivery_lag_p99_ms, is_contaminated,
                                     percentile_ci_half, timing_of)

CELL_KEYS = ["config", "suite", "workload", "concurrency", "stream", "trial"]
METRIC_KEYS = ["ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
               "output_tok_s", "req_s", "requests_ok", "requests_failed", "emulation_lag_p99_ms", "loop_lag_p99_ms",
               "delivery_lag_p99_ms", "contaminated"]
SUMMARY_COLUMNS = CELL_KEYS + ["requests_ok", "requests_total", "requests_failed", "ttft_p50_ms", "ttft_p95_ms",
                               "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms", "output_tok_s", "req_s",
                               "window_s", "output_tokens", "chunks_multi_token", "client_lag_p99_ms",
                               "prompt_tokens_mean", "target_prompt_tokens", "n_ttft_samples", "n_itl_samples",
                               "gpus", "output_tok_s_per_gpu", "timing", "emulation_lag_p99_ms", "loop_lag_p99_ms",
                               "delivery_lag_p99_ms", "contaminated"] + [f"{m}_sample_ci95" for m in SAMPLE_CI_METRICS]
# Direction of "better" for the comparison.
LOWER_IS_BETTER = {"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
                   "requests_failed"}
HIGHER_IS_BETTER = {"output_tok_s", "req_s", "requests_ok", "output_tok_s_per_gpu"}


def percentile(values, q: float) -> float | None:
    arr = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))],
                     dtype=float)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q))


def _max(values) -> float | None:
    arr = [v for v in values if v is not None]
    return float(max(arr)) if arr else None


def pooled_itl_ms(chunk_offsets: pd.Series) -> list[float]:
    out: list[float] = []
    for offs in chunk_offsets:
        if offs is None:
            continue
        offs = list(offs)
        out.extend((b - a) / 1e6 for a, b in zip(offs, offs[1:]))
    return out


def tpot_ms(row) -> float | None:
    out = row["output_tokens"]
    if row["ttft_ms"] is None or row["e2e_ms"] is None or out is None or pd.isna(out) or out < 2:
        return None
    return (row["e2e_ms"] - row["ttft_ms"]) / (out - 1)


def measured_window_ns(df: pd.DataFrame) -> tuple[int, int] | None:
    """(first send, last completion) of the measured requests of `df`."""
    m = df[df["phase"] == "measured"]
    if m.empty:
        return None
    done = pd.to_numeric(m["done_ms"], errors="coerce").fillna(0) * 1e6
    return int(m["send_ns"].min()), int((m["send_ns"] + done).max())


def summarize_cell(df: pd.DataFrame, window_ns: tuple[int, int] | None = None) -> dict:
    """Statistics of one cell's records (any phases; only measured ones count). `window_ns` overrides
    the cell's own window (streams of a mixed suite share the whole mixed window)."""
    m = df[df["phase"] == "measured"]
    ok = m[m["ok"].astype(bool)]
    total = int(len(m))
    n_ok = int(len(ok))
    itls = pooled_itl_ms(ok["chunk_offsets_ns"])
    tpots = [tpot_ms(r) for _, r in ok.iterrows()]
    window = window_ns or measured_window_ns(df)
    window_s = (window[1] - window[0]) / 1e9 if window and window[1] > window[0] else None
    out_tokens = ok["output_tokens"].dropna()
    out_sum = int(out_tokens.sum()) if len(out_tokens) else None
    multi = None
    if n_ok:
        multi = int(sum(sum(1 for t in (tk if tk is not None else []) if t > 1) for tk in ok["chunk_tokens"]))
    lag = ((m["send_ns"] - m["scheduled_ns"]) / 1e6).tolist() if total else []
    prompt = ok["prompt_tokens"].dropna()
    return {
        "n_ttft_samples": n_ok,
        "n_itl_samples": len(itls),
        "requests_ok": n_ok,
        "requests_total": total,
        "requests_failed": total - n_ok,
        "ttft_p50_ms": percentile(ok["ttft_ms"], 50),
        "ttft_p95_ms": percentile(ok["ttft_ms"], 95),
        "ttft_p99_ms": percentile(ok["ttft_ms"], 99),
        "tpot_p50_ms": percentile(tpots, 50),
        "itl_p99_ms": percentile(itls, 99),
        "itl_max_ms": _max(itls),
        "output_tok_s": (out_sum / window_s) if (out_sum is not None and window_s) else None,
        "req_s": (n_ok / window_s) if (window_s and n_ok) else None,
        "window_s": window_s,
        "output_tokens": out_sum,
        "chunks_multi_token": multi,
        "client_lag_p99_ms": percentile(lag, 99),
        "prompt_tokens_mean": float(prompt.mean()) if len(prompt) else None,
        "target_prompt_tokens": float(m["target_prompt_tokens"].mean()) if total else None,
        "timing": timing_of(ok["timing"]) if "timing" in ok else None,
        **{f"{m}_sample_ci95": percentile_ci_half(ok["ttft_ms"] if m.startswith("ttft") else
                                                  tpots if m.startswith("tpot") else itls, q)
           for m, q in SAMPLE_CI_METRICS.items()},
        "delivery_lag_p99_ms": (delivery_lag_p99_ms(ok["chunk_offsets_ns"], ok["chunk_arrival_ns"])
                                if "chunk_arrival_ns" in ok and n_ok else None),
    }


def summarize(records: pd.DataFrame, gpus: dict[str, int] | None = None, noise: dict | None = None) -> pd.DataFrame:
    """One row per config × suite × workload × concurrency × stream × trial. Streams of a mixed suite
    (stream != "main") share the suite's whole window as throughput denominator. With `gpus`
    (config → GPUs), output tok/s per GPU is added for the equal-budget view. `noise` ((config, cell id,
    trial) → lag p99s, from the ledger) adds each cell's emulation and client lag and whether host load
    contaminated it (analysis.noise)."""
    if records.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    mixed = records[records["stream"] != "main"]
    shared = {key: measured_window_ns(g) for key, g in mixed.groupby(["config", "suite", "trial"], sort=False)}
    rows = []
    for key, group in records.groupby(CELL_KEYS, sort=False):
        k = dict(zip(CELL_KEYS, key))
        window = shared.get((k["config"], k["suite"], k["trial"])) if k["stream"] != "main" else None
        cell_id = group["cell"].iloc[0] if "cell" in group.columns else None
        rows.append({**k, **summarize_cell(group, window), **cell_noise(noise, k["config"], cell_id, k["trial"])})
    out = pd.DataFrame(rows)
    out["gpus"] = out["config"].map(gpus) if gpus else None
    out["output_tok_s_per_gpu"] = [(t / g) if (t is not None and g and not pd.isna(t)) else None
                                   for t, g in zip(out["output_tok_s"], out["gpus"])]
    out["contaminated"] = [is_contaminated(r) for _, r in out.iterrows()]
    out = out[SUMMARY_COLUMNS]
    return out.astype(object).where(out.notna(), None)
