"""Per-cell statistics from raw request records (pure pandas and NumPy; no I/O).

Definitions (DESIGN.md): measured requests only; TTFT = send → first content chunk; ITL = every gap
between consecutive content chunks, pooled over the cell; TPOT = (E2E − TTFT)/(output − 1) per
request; throughput over the cell window (first send → last completion). No data → null, never 0.
Computed on arrays: the records' figures read once, each cell's chunk lists laid end to end
(analysis.chunks), no Python loop over requests or chunks.
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from epdbench.analysis.chunks import Lists, gaps
from epdbench.analysis.gpu_telemetry import COLUMNS as TELEMETRY_COLUMNS
from epdbench.analysis.noise import (SAMPLE_CI_METRICS, cell_noise, delivery_lags_ns, finite, finite_values,
                                     is_contaminated, SAMPLE_CI_COLUMNS, percentile_ci_sides, samples_p99_ms,
                                     timing_of)

CELL_KEYS = ["config", "suite", "workload", "concurrency", "stream", "trial"]
METRIC_KEYS = ["ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
               "output_tok_s", "req_s", "requests_ok", "requests_failed", "emulation_lag_p99_ms", "loop_lag_p99_ms",
               "delivery_lag_p99_ms", "contaminated", *TELEMETRY_COLUMNS]
SUMMARY_COLUMNS = CELL_KEYS + ["requests_ok", "requests_total", "requests_failed", "ttft_p50_ms", "ttft_p95_ms",
                               "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms", "output_tok_s", "req_s",
                               "window_s", "output_tokens", "chunks_multi_token", "client_lag_p99_ms",
                               "prompt_tokens_mean", "target_prompt_tokens", "n_ttft_samples", "n_itl_samples",
                               "gpus", "output_tok_s_per_gpu", "timing", "emulation_lag_p99_ms", "loop_lag_p99_ms",
                               "delivery_lag_p99_ms", "coalesced_share", "contaminated"] + [
                                   *SAMPLE_CI_COLUMNS, *TELEMETRY_COLUMNS]
# The record columns summarize reads (tasks.rundir.results.read_records(path, RECORD_COLUMNS) leaves the others
# on disk).
RECORD_COLUMNS = CELL_KEYS + ["cell", "phase", "ok", "ttft_ms", "e2e_ms", "output_tokens", "prompt_tokens",
                              "target_prompt_tokens", "done_ms", "send_ns", "scheduled_ns", "chunk_offsets_ns",
                              "chunk_tokens", "chunk_arrival_ns", "timing"]
# Direction of "better" for the comparison.
LOWER_IS_BETTER = {"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
                   "requests_failed"}
HIGHER_IS_BETTER = {"output_tok_s", "req_s", "requests_ok", "output_tok_s_per_gpu"}


def percentile(values, q: float) -> float | None:
    arr = finite_values(values)
    if arr.size == 0:
        return None
    return float(np.percentile(arr, q))


def pooled_itl_ms(chunk_offsets) -> list[float]:
    offsets = Lists(chunk_offsets)
    return (gaps(offsets.flat(), offsets.lengths) / 1e6).tolist()


class Requests:
    """The per-request figures of a frame of records as arrays over its rows (positions), read once."""

    def __init__(self, df: pd.DataFrame):
        self.measured = (df["phase"] == "measured").to_numpy(dtype=bool, na_value=False)
        self.ok = self.measured & df["ok"].astype(bool).to_numpy(dtype=bool)
        self.ttft, self.e2e, self.output, self.prompt, self.target = (
            _floats(df[c]) for c in ("ttft_ms", "e2e_ms", "output_tokens", "prompt_tokens", "target_prompt_tokens"))
        self.done_ns = np.nan_to_num(_floats(df["done_ms"]), nan=0.0) * 1e6
        self.send, self.scheduled = _ints(df["send_ns"]), _ints(df["scheduled_ns"])
        self.offsets, self.tokens = Lists(df["chunk_offsets_ns"]), Lists(df["chunk_tokens"])
        self.arrival = Lists(df["chunk_arrival_ns"]) if "chunk_arrival_ns" in df else None
        self.timing = df["timing"].to_numpy(dtype=object) if "timing" in df else None

    def window_ns(self, measured: np.ndarray) -> tuple[int, int] | None:
        """(first send, last completion) of the `measured` rows."""
        if not len(measured):
            return None
        send = self.send[measured]
        return int(send.min()), int((send.astype(float) + self.done_ns[measured]).max())


def _floats(col: pd.Series) -> np.ndarray:
    return pd.to_numeric(col, errors="coerce").to_numpy(dtype=float, na_value=np.nan)


def _ints(col: pd.Series) -> np.ndarray:
    """Integers stay exact (ns stamps); anything missing makes the column float."""
    num = pd.to_numeric(col, errors="coerce")
    return num.to_numpy(dtype=np.int64) if num.dtype.kind in "iub" else num.to_numpy(dtype=float, na_value=np.nan)


def measured_window_ns(df: pd.DataFrame) -> tuple[int, int] | None:
    """(first send, last completion) of the measured requests of `df`."""
    req = Requests(df)
    return req.window_ns(np.flatnonzero(req.measured))


def summarize_cell(df: pd.DataFrame, window_ns: tuple[int, int] | None = None) -> dict:
    """Statistics of one cell's records (any phases; only measured ones count). `window_ns` overrides
    the cell's own window (streams of a mixed suite share the whole mixed window)."""
    return cell_stats(Requests(df), np.arange(len(df)), window_ns)


def cell_stats(req: Requests, rows: np.ndarray, window_ns: tuple[int, int] | None = None) -> dict:
    """summarize_cell of the records at positions `rows` (ascending) of the frame `req` was read from."""
    m = rows[req.measured[rows]]
    ok = rows[req.ok[rows]]
    total, n_ok = len(m), len(ok)
    itls = gaps(req.offsets.flat(ok), req.offsets.lengths[ok]) / 1e6
    with np.errstate(invalid="ignore", divide="ignore"):
        out = req.output[ok]
        tpots = finite_values(np.where(out >= 2, (req.e2e[ok] - req.ttft[ok]) / (out - 1), np.nan))
    ttfts = finite_values(req.ttft[ok])
    window = window_ns or req.window_ns(m)
    window_s = (window[1] - window[0]) / 1e9 if window and window[1] > window[0] else None
    out_tokens = finite_values(out)
    out_sum = int(out_tokens.sum()) if len(out_tokens) else None
    multi = int((req.tokens.flat(ok) > 1).sum()) if n_ok else None
    lag = (req.send[m] - req.scheduled[m]) / 1e6
    prompt, target = finite_values(req.prompt[ok]), finite_values(req.target[m])
    lags = delivery_lags_ns(req.offsets, req.arrival, ok) if req.arrival is not None and n_ok else None
    arrived = arrival_gaps(req, ok)
    return {
        "n_ttft_samples": n_ok,
        "n_itl_samples": len(itls),
        "requests_ok": n_ok,
        "requests_total": total,
        "requests_failed": total - n_ok,
        "ttft_p50_ms": percentile(ttfts, 50),
        "ttft_p95_ms": percentile(ttfts, 95),
        "ttft_p99_ms": percentile(ttfts, 99),
        "tpot_p50_ms": percentile(tpots, 50),
        "itl_p99_ms": percentile(itls, 99),
        "itl_max_ms": float(itls.max()) if len(itls) else None,
        "output_tok_s": (out_sum / window_s) if (out_sum is not None and window_s) else None,
        "req_s": (n_ok / window_s) if (window_s and n_ok) else None,
        "window_s": window_s,
        "output_tokens": out_sum,
        "chunks_multi_token": multi,
        "client_lag_p99_ms": percentile(lag, 99),
        "prompt_tokens_mean": float(prompt.mean()) if len(prompt) else None,
        "target_prompt_tokens": float(target.mean()) if len(target) else None,
        "timing": timing_of(pd.unique(req.timing[ok])) if req.timing is not None else None,
        **sample_cis({"ttft": ttfts, "tpot": tpots, "itl": itls}),
        "delivery_lag_p99_ms": samples_p99_ms(lags / 1e9) if lags is not None and len(lags) else None,
        "coalesced_share": float((arrived == 0).mean()) if len(arrived) else None,
    }


def sample_cis(samples: dict[str, np.ndarray]) -> dict[str, float | None]:
    """`<metric>_sample_ci95` (the larger half-width) and its bounds `_lo`/`_hi` for every SAMPLE_CI_METRICS
    percentile, from the cell's samples by kind (ttft, tpot, itl)."""
    out: dict[str, float | None] = {}
    for m, q in SAMPLE_CI_METRICS.items():
        out[f"{m}_sample_ci95"], out[f"{m}_sample_ci95_lo"], out[f"{m}_sample_ci95_hi"] = percentile_ci_sides(
            samples[m.split("_")[0]], q)
    return out


def arrival_gaps(req: Requests, rows: np.ndarray) -> np.ndarray:
    """Gaps (ns) between consecutive content chunks as the client read them: a modelled request's arrival
    stamps, another's offsets. A zero gap is a token read together with the one before it."""
    if req.arrival is None:
        return gaps(req.offsets.flat(rows), req.offsets.lengths[rows])
    has = req.arrival.lengths[rows] > 0
    return np.concatenate([gaps(req.arrival.flat(rows[has]), req.arrival.lengths[rows[has]]),
                           gaps(req.offsets.flat(rows[~has]), req.offsets.lengths[rows[~has]])])


def summarize(records: pd.DataFrame, gpus: dict[str, int] | None = None, noise: dict | None = None) -> pd.DataFrame:
    """One row per config × suite × workload × concurrency × stream × trial. Streams of a mixed suite
    (stream != "main") share the suite's whole window as throughput denominator. With `gpus`
    (config → GPUs), output tok/s per GPU is added for the equal-budget view. `noise` ((config, cell id,
    trial) → lag p99s, from the ledger) adds each cell's emulation and client lag and whether host load
    contaminated it (analysis.noise)."""
    if records.empty:
        return pd.DataFrame(columns=SUMMARY_COLUMNS)
    req = Requests(records)
    mixed = np.flatnonzero((records["stream"] != "main").to_numpy(dtype=bool))
    shared = {key: req.window_ns(rows[req.measured[rows]])
              for key, rows in _groups(records, ["config", "suite", "trial"], mixed)}
    cells = records["cell"] if "cell" in records.columns else None
    rows_out = []
    for key, rows in _groups(records, CELL_KEYS):
        k = dict(zip(CELL_KEYS, key))
        window = shared.get((k["config"], k["suite"], k["trial"])) if k["stream"] != "main" else None
        cell_id = cells.iloc[rows[0]] if cells is not None else None
        rows_out.append({**k, **cell_stats(req, rows, window), **cell_noise(noise, k["config"], cell_id, k["trial"]),
                         **cell_gpu(noise, k["config"], cell_id, k["trial"])})
    out = pd.DataFrame(rows_out)
    out["gpus"] = out["config"].map(gpus) if gpus else None
    out["output_tok_s_per_gpu"] = [(t / g) if (t is not None and g and not pd.isna(t)) else None
                                   for t, g in zip(out["output_tok_s"], out["gpus"])]
    out["contaminated"] = [is_contaminated(r) for r in out.to_dict("records")]
    out = out[SUMMARY_COLUMNS]
    return out.astype(object).where(out.notna(), None)


def cell_gpu(noise: dict | None, config: str, cell_id, trial) -> dict:
    """The GPU telemetry of one cell attempt (analysis.gpu_telemetry.COLUMNS) its ledger entry holds, where the
    target read the GPUs; None each otherwise."""
    found = (noise or {}).get((config, cell_id, int(trial))) or {}
    return {col: finite(found.get(col)) for col in TELEMETRY_COLUMNS}


def _groups(df: pd.DataFrame, keys: list[str], rows: np.ndarray | None = None):
    """(key, ascending positions) of each group of `df`'s `rows` (None: all) by `keys`, in order of first
    appearance, rows with a missing key left out: what df.groupby(keys, sort=False) iterates over."""
    frame = df[keys] if rows is None else df[keys].iloc[rows]
    if frame.empty:
        return
    positions = np.arange(len(df)) if rows is None else rows
    codes = frame.groupby(keys, sort=False).ngroup().fillna(-1).to_numpy(dtype=np.int64)
    order = np.argsort(codes, kind="stable")
    parts = np.split(order, np.flatnonzero(np.diff(codes[order])) + 1)
    firsts = [part[0] for part in parts]
    for part, key in zip(parts, frame.iloc[firsts].to_numpy(dtype=object)):
        if codes[part[0]] >= 0:
            yield tuple(key), positions[part]
