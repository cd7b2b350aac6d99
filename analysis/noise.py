"""How much of a cell's figures is noise (pure): the emulation lag of the simulator and the load generator's
event-loop lag per cell, the contamination rule, and the noise band every comparison must clear.

- Emulation lag: how late the simulator's engine steps ended against their modelled ends (Prometheus
  histogram `epdbench_sim_step_lag_seconds`, summed over the configuration's replicas, delta over the cell,
  p99 interpolated as Prometheus' histogram_quantile): how far host load set the simulated GPUs back.
- Client lag: how late the load generator's event loop woke against its timer (p99 of the cell's ticks).
- Delivery lag (diagnostic): how long after its modelled emission each token reached the load generator.
- A cell is contaminated when the larger of emulation and client lag p99 exceeds CONTAMINATION_FRACTION of
  the smallest latency figure host load can move: on the simulator, whose tokens are timed by their modelled
  emission (tasks/load/loadgen.py), only TTFT p50 (the request's way in runs in host time); timed by arrival,
  also TPOT p50 and ITL p99.
- Noise band of a value: with trials > 1, its 95% CI half-width over trials; with one trial, the
  distribution-free 95% CI of the percentile from the cell's own samples (order statistics, kept with its two
  bounds: wide on the side of a second cluster when a closed loop makes TTFT bimodal, short on the other),
  each side at least the run-to-run spread of that metric (RUN_TO_RUN_SPREAD); for latency figures host load
  can move, each side never less than the cell's lag p99. Two values differ only when their bands do not
  overlap.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from epdbench.analysis.chunks import Lists
from epdbench.analysis.prom import parse_prometheus

STEP_LAG = "epdbench_sim_step_lag_seconds"
EMIT_LAG = "epdbench_sim_emit_lag_seconds"      # kept in the ledger as a diagnostic
LATENCY_METRICS = ("ttft_p50_ms", "tpot_p50_ms", "itl_p99_ms")
ARRIVAL_ONLY = ("tpot_p50_ms", "itl_p99_ms")     # immune to host load when tokens carry modelled stamps
CONTAMINATION_FRACTION = 0.05
NOISE_COLUMNS = ["emulation_lag_p99_ms", "loop_lag_p99_ms"]

# Relative run-to-run spread of a single trial's value, per metric: what two identical smoke runs on the idle
# 2-core development machine differed by beyond what the cells' own sample CIs reach towards each other,
# the largest over the 28 cells (`python benchmarks/pipeline/noise.py --idle-twice`; 2026-12-01, half-widths: TTFT p50
# 0.000 — the sample CIs covered a raw spread of up to 38% —, p95 0.045, p99 0.090, TPOT p50 0.000, ITL p99
# 0.012, ITL max 0.059, throughput 0.079; 2026-12-02, CI bounds: 0.000, 0.011, 0.026, 0.000, 0.000, 9.55 — one
# prefill meeting a decode or not —, 0.022), the larger, rounded up, at least 1% (2% for TTFT p50, the raw
# median). A floor under each side of the sample CI, used only when a cell has one trial; repeated trials
# measure their own spread. ITL max is never judged (analysis.compare.NOT_JUDGED).
RUN_TO_RUN_SPREAD = {
    "ttft_p50_ms": 0.02, "ttft_p95_ms": 0.05, "ttft_p99_ms": 0.09, "tpot_p50_ms": 0.01, "itl_p99_ms": 0.02,
    "itl_max_ms": 0.06, "output_tok_s": 0.08, "req_s": 0.08, "output_tok_s_per_gpu": 0.08,
}
# The throughput of a stream of a mixed suite is its tokens over the window the streams share, which ends where
# the last requests of both meet the engine: that moved by up to 13.5% between idle smoke runs (epd, 2026-12-02:
# 59.0, 60.3 and 67.4 tok/s for the burst stream; main cells at most 1.3%), so streams have their own floor.
STREAM_RUN_TO_RUN_SPREAD = {"output_tok_s": 0.14, "req_s": 0.14, "output_tok_s_per_gpu": 0.14}
SAMPLE_CI_METRICS = {"ttft_p50_ms": 50, "ttft_p95_ms": 95, "ttft_p99_ms": 99, "tpot_p50_ms": 50, "itl_p99_ms": 99}
# Per SAMPLE_CI_METRICS percentile: the larger half-width of its sample CI, and the CI's bounds.
SAMPLE_CI_COLUMNS = [f"{m}_sample_ci95{side}" for m in SAMPLE_CI_METRICS for side in ("", "_lo", "_hi")]
Z95 = 1.959964


def finite(v) -> float | None:
    """A number as float; None for None, NaN or anything that is not a number."""
    if v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(f) else f


def finite_values(values) -> np.ndarray:
    """The numbers among `values` as a float array, without None and NaN."""
    if isinstance(values, pd.Series) and values.dtype.kind in "biuf":
        arr = values.to_numpy(dtype=float, na_value=np.nan)
    elif isinstance(values, np.ndarray) and values.dtype.kind in "biuf":
        arr = values.astype(float, copy=False)
    else:
        arr = np.asarray([v for v in values if v is not None and not (isinstance(v, float) and math.isnan(v))],
                         dtype=float)
    nan = np.isnan(arr)
    return arr[~nan] if nan.any() else arr


def _order_stats(xs: np.ndarray, ranks) -> list[float]:
    """The values of ranks (0-based) in sorted `xs`, without sorting it all."""
    part = np.partition(xs, sorted(set(ranks)))
    return [float(part[r]) for r in ranks]


def histogram_buckets(text: str, name: str) -> dict[float, float]:
    """Cumulative bucket counts (upper edge → count, +Inf as inf) of histogram `name`, summed over label sets."""
    out: dict[float, float] = {}
    for metric, labels, value in parse_prometheus(text):
        if metric != f"{name}_bucket" or "le" not in labels:
            continue
        try:
            edge = float(labels["le"])
        except ValueError:
            continue
        out[edge] = out.get(edge, 0.0) + value
    return out


def bucket_quantile(q: float, buckets: dict[float, float]) -> float | None:
    """Quantile q (0..1) of a cumulative histogram, linearly interpolated inside its bucket (as Prometheus'
    histogram_quantile); None without observations; the last finite edge when it falls in +Inf."""
    edges = sorted(buckets)
    if not edges or buckets[edges[-1]] <= 0:
        return None
    total = buckets[edges[-1]]
    rank = q * total
    prev_edge, prev_count = 0.0, 0.0
    for edge in edges:
        count = buckets[edge]
        if count >= rank:
            if math.isinf(edge):
                return prev_edge
            if count == prev_count:
                return edge
            return prev_edge + (edge - prev_edge) * (rank - prev_count) / (count - prev_count)
        prev_edge, prev_count = edge, count
    return prev_edge


def emulation_lag_p99_ms(before: dict[str, str], after: dict[str, str], name: str = STEP_LAG) -> float | None:
    """p99 (ms) over a window of a lag histogram summed over every process, from /metrics scrapes before and
    after it; None when nothing was observed."""
    b: dict[float, float] = {}
    a: dict[float, float] = {}
    for texts, into in ((before, b), (after, a)):
        for text in texts.values():
            for edge, n in histogram_buckets(text, name).items():
                into[edge] = into.get(edge, 0.0) + n
    p99 = bucket_quantile(0.99, {edge: max(0.0, n - b.get(edge, 0.0)) for edge, n in a.items()})
    return None if p99 is None else p99 * 1e3


def samples_p99_ms(samples_s) -> float | None:
    xs = np.asarray(samples_s if isinstance(samples_s, np.ndarray) else list(samples_s), dtype=float)
    if not xs.size:
        return None
    k = (len(xs) - 1) * 0.99
    lo = math.floor(k)
    a, b = _order_stats(xs, [lo, min(lo + 1, len(xs) - 1)])
    return 1e3 * (a + (b - a) * (k - lo))


def percentile_ci(values, q: float) -> tuple[float, float] | None:
    """The distribution-free 95% CI (low, high) of the q-th percentile of `values`: the order statistics at
    n·p ∓ z·√(n·p·(1−p)) (normal approximation of the binomial). Asymmetric where the samples are: a median
    at the top of a cluster has a short side towards it and a long one towards the next. None below 2 values."""
    xs = finite_values(values)
    n = len(xs)
    if n < 2:
        return None
    p = q / 100
    spread = Z95 * math.sqrt(n * p * (1 - p))
    lo, hi = _order_stats(xs, [max(0, math.floor(n * p - spread) - 1), min(n - 1, math.ceil(n * p + spread))])
    return lo, hi


def percentile_value(values, q: float) -> float | None:
    """The q-th percentile of `values` as numpy.percentile (linear), None without values."""
    xs = finite_values(values)
    if not len(xs):
        return None
    k = (len(xs) - 1) * q / 100
    f = math.floor(k)
    a, b = _order_stats(xs, [f, min(len(xs) - 1, f + 1)])
    return a + (b - a) * (k - f)


def percentile_ci_half(values, q: float) -> float | None:
    """Half-width (the larger side) of percentile_ci around the percentile; None below 2 values."""
    return percentile_ci_sides(values, q)[0]


def percentile_ci_sides(values, q: float) -> tuple[float | None, float | None, float | None]:
    """(larger half-width, low bound, high bound) of percentile_ci; Nones below 2 values."""
    xs = finite_values(values)
    ci = percentile_ci(xs, q)
    if ci is None:
        return None, None, None
    mid = percentile_value(xs, q)
    return max(ci[1] - mid, mid - ci[0]), ci[0], ci[1]


def lag_ms(row) -> float:
    """The cell's noise from lag: the larger p99 of emulation lag and client lag (0 when unmeasured)."""
    return max([x for x in (finite(row.get(c)) for c in NOISE_COLUMNS) if x is not None], default=0.0)


def is_contaminated(row) -> bool:
    """Lag p99 above CONTAMINATION_FRACTION of the smallest latency figure of the cell host load can move,
    or more than that share of its tokens arriving in the same read as the token before (the client, or
    something between it and the engine, fell behind: those gaps are unknown, not zero)."""
    coalesced = finite(row.get("coalesced_share"))
    if coalesced is not None and coalesced > CONTAMINATION_FRACTION and row.get("timing") != "modelled":
        return True
    lag = lag_ms(row)
    movable = [m for m in LATENCY_METRICS if not (row.get("timing") == "modelled" and m in ARRIVAL_ONLY)]
    figures = [x for x in (finite(row.get(m)) for m in movable) if x is not None and x > 0]
    return bool(lag and figures and lag > CONTAMINATION_FRACTION * min(figures))


def cell_noise(noise: dict | None, config: str, cell_id, trial) -> dict:
    """The lag figures of one cell attempt from `noise` ((config, cell id, trial) → {column: value})."""
    found = (noise or {}).get((config, cell_id, int(trial))) or {}
    return {col: finite(found.get(col)) for col in NOISE_COLUMNS}


def timing_of(values) -> str | None:
    """A cell's timing from its requests': "modelled", "arrival", "mixed", or None without any."""
    kinds = {v for v in values if v}
    return None if not kinds else kinds.pop() if len(kinds) == 1 else "mixed"


def delivery_lag_p99_ms(modelled_offsets, arrival_offsets) -> float | None:
    """p99 over every token of (arrival − modelled emission), ms, from requests timed by modelled stamps."""
    lags = delivery_lags_ns(Lists(modelled_offsets), Lists(arrival_offsets))
    return samples_p99_ms(lags / 1e9) if len(lags) else None


def delivery_lags_ns(modelled: Lists, arrival: Lists, rows: np.ndarray | None = None) -> np.ndarray:
    """Arrival − modelled emission of every chunk of `rows` (None: all) that has both, end to end."""
    n_mod = modelled.lengths if rows is None else modelled.lengths[rows]
    n_arr = arrival.lengths if rows is None else arrival.lengths[rows]
    both = np.flatnonzero((n_mod == n_arr) & (n_mod > 0))
    pick = both if rows is None else rows[both]
    return arrival.flat(pick) - modelled.flat(pick)


def run_to_run_spread(row, metric: str) -> float:
    """The relative run-to-run spread of a single trial's `metric` in the cell of `row` (a stream of a mixed
    suite has its own for throughput)."""
    stream = row.get("stream")
    if stream not in (None, "main") and metric in STREAM_RUN_TO_RUN_SPREAD:
        return STREAM_RUN_TO_RUN_SPREAD[metric]
    return RUN_TO_RUN_SPREAD.get(metric, 0.05)


def band_sides(row, metric: str) -> tuple[float, float]:
    """How far below and above `row[metric]` its noise band reaches (row from analysis.trials.aggregate_trials):
    with trials > 1 the 95% CI over trials on both sides; with one trial the percentile's own CI bounds
    (`<metric>_sample_ci95_lo`/`_hi`, else the larger half-width `<metric>_sample_ci95` on both sides), each side
    at least the run-to-run spread (run_to_run_spread); for a latency host load can move, each side at least the cell's lag p99."""
    value = finite(row.get(metric))
    if value is None:
        return 0.0, 0.0
    ci = finite(row.get(f"{metric}_ci95"))
    if int(row.get("trials") or 1) > 1 and ci is not None:
        below = above = ci
    else:
        half = finite(row.get(f"{metric}_sample_ci95")) or 0.0
        lo, hi = finite(row.get(f"{metric}_sample_ci95_lo")), finite(row.get(f"{metric}_sample_ci95_hi"))
        below = value - lo if lo is not None else half
        above = hi - value if hi is not None else half
        floor = run_to_run_spread(row, metric) * abs(value)
        below, above = max(below, floor), max(above, floor)
    if metric.endswith("_ms") and not (row.get("timing") == "modelled" and metric in ARRIVAL_ONLY):
        lag = lag_ms(row)
        below, above = max(below, lag), max(above, lag)
    return below, above


def band(row, metric: str) -> float:
    """Half-width of the noise band around `row[metric]`: the larger of its two sides (band_sides)."""
    return max(band_sides(row, metric))


def distinct(a, b, metric: str) -> bool:
    """True when the values of `metric` in rows a and b lie apart by more than their noise bands reach towards
    each other: the lower value's band above it and the higher value's band below it (band_sides)."""
    va, vb = finite(a.get(metric)), finite(b.get(metric))
    if va is None or vb is None:
        return False
    (low_row, low), (high_row, high) = sorted(((a, va), (b, vb)), key=lambda x: x[1])
    return high - low > band_sides(low_row, metric)[1] + band_sides(high_row, metric)[0]
