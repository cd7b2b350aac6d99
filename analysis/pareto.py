"""Throughput per GPU against interactivity, cost and energy per token (pure pandas; no I/O).

Per suite and request shape (a suite's workload without its rate, and its stream), every configuration's cells are
points: x the output tokens per second one user sees, **interactivity** = 1000 / TPOT p50 (ms) — the
"tok/s/user" axis of AIPerf and InferenceMAX, the decode speed of the median request —, y the output tokens per
second per GPU (output tok/s over the configuration's GPUs). Points of different shapes are other work, so each
shape has its own frontier; its points come from every configuration and load (concurrency, or offered rate).

A point is **dominated** when another point of the same shape is better beyond the noise on one axis and not
worse beyond the noise on the other (analysis.noise.distinct: TPOT p50 for x, which moves with it, throughput per
GPU for y; with one trial each percentile's sample CI floored by the metric's run-to-run spread, with several the
95% CI over trials) — the Verdict's rule, on two axes at once. Otherwise it is on the **frontier**: a point behind
another only within the noise, or tied with it, stays on it; a lead within the noise on one axis does not keep a
point on it that is behind beyond the noise on the other. A contaminated cell (host load moved its figures) takes
no part: it neither joins the frontier nor pushes another point off it. A cell without a TPOT (every output a
single token) or a GPU count is not placed.

Cost per million output tokens = gpu_hour_usd × GPUs / 3600 / output tok/s × 1e6 (the same as
gpu_hour_usd / 3600 / tok/s per GPU × 1e6), per cell; absent without a price. Energy per token (joules) is the
energy the configuration's GPUs drew over the cell's measured window per output token, where the target read them
(analysis.gpu_telemetry: NVML on the local GPU target, the DCGM exporter on Kubernetes; the mean over trials); null
where nothing read GPU power, as on the simulator: never estimated.
"""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.labels import load_label
from epdbench.analysis.noise import band_sides, distinct, finite
from epdbench.analysis.trials import aggregate_trials
from epdbench.specs.workload import split_rate

FRONTIER, DOMINATED, CONTAMINATED, UNPLACED = "frontier", "dominated", "contaminated", "not placed"
PER_USER, PER_GPU = "tok_s_per_user", "output_tok_s_per_gpu"
POINT_COLUMNS = ["suite", "shape", "stream", "workload", "concurrency", "config", "trials", PER_USER,
                 f"{PER_USER}_lo", f"{PER_USER}_hi", PER_GPU, f"{PER_GPU}_lo", f"{PER_GPU}_hi", "contaminated",
                 "status", "dominated_by", "cost_usd_per_mtok", "energy_j_per_token",
                 # the GPUs over the cell where the target read them (analysis.gpu_telemetry; means over trials)
                 "gpu_samples", "gpu_util_pct_mean", "gpu_mem_used_mib_max", "gpu_power_w_mean", "gpu_sm_clock_mhz_mean"]


def interactivity(tpot_ms) -> float | None:
    """Output tokens per second one user sees at a TPOT (ms): 1000 / TPOT; None without a positive TPOT."""
    tpot = finite(tpot_ms)
    return 1000.0 / tpot if tpot is not None and tpot > 0 else None


def cost_usd_per_mtok(gpu_hour_usd, output_tok_s_per_gpu) -> float | None:
    """USD per million output tokens at a price per GPU-hour and an output throughput per GPU; None without
    either (or without throughput)."""
    price, rate = finite(gpu_hour_usd), finite(output_tok_s_per_gpu)
    if price is None or rate is None or rate <= 0:
        return None
    return price / 3600.0 / rate * 1e6


def _bands(row: dict) -> dict:
    """The noise band of each axis as bounds: x from TPOT p50's band (x falls as TPOT rises), y its own."""
    tpot = finite(row.get("tpot_p50_ms"))
    x_lo = x_hi = None
    if tpot is not None and tpot > 0:
        below, above = band_sides(row, "tpot_p50_ms")
        x_lo = interactivity(tpot + above)
        x_hi = interactivity(tpot - below) if tpot - below > 0 else None
    y = finite(row.get(PER_GPU))
    y_lo = y_hi = None
    if y is not None:
        below, above = band_sides(row, PER_GPU)
        y_lo, y_hi = max(0.0, y - below), y + above
    return {f"{PER_USER}_lo": x_lo, f"{PER_USER}_hi": x_hi, f"{PER_GPU}_lo": y_lo, f"{PER_GPU}_hi": y_hi}


def dominates(b: dict, a: dict) -> bool:
    """Point `b` dominates `a` (rows of aggregate_trials with PER_USER added): better beyond the noise on one axis,
    not worse beyond it on the other (a tie, or a lead within the noise, dominates nothing)."""
    xb, xa, yb, ya = b[PER_USER], a[PER_USER], finite(b[PER_GPU]), finite(a[PER_GPU])
    if None in (xb, xa, yb, ya):
        return False
    apart_x, apart_y = distinct(a, b, "tpot_p50_ms"), distinct(a, b, PER_GPU)
    ahead = (apart_x and xb > xa) or (apart_y and yb > ya)
    behind = (apart_x and xb < xa) or (apart_y and yb < ya)
    return ahead and not behind


def _label(row: dict) -> str:
    return f"{row['config']} {load_label(row['workload'], row['concurrency'], short=True)}"


def pareto_points(summary: pd.DataFrame, gpu_hour_usd: float | None = None) -> pd.DataFrame:
    """One row per configuration × matched cell (trials aggregated, analysis.trials): shape, interactivity and
    throughput per GPU with their noise bounds, whether the cell is on its shape's frontier (`status`: frontier,
    dominated, contaminated or not placed; `dominated_by`: the point with the largest lead, e.g. 'epd c=8'), its
    cost per million output tokens at `gpu_hour_usd` and its energy per token (null where no GPU power was read)."""
    agg = aggregate_trials(summary)
    if agg.empty:
        return pd.DataFrame(columns=POINT_COLUMNS)
    rows = []
    for r in agg.to_dict("records"):
        r[PER_USER] = interactivity(r.get("tpot_p50_ms"))
        r["shape"] = split_rate(r["workload"])[0]
        r["contaminated"] = bool(r.get("contaminated"))
        placed = r[PER_USER] is not None and (finite(r.get(PER_GPU)) or 0) > 0
        r["status"] = UNPLACED if not placed else CONTAMINATED if r["contaminated"] else FRONTIER
        r["dominated_by"] = None
        rows.append(r)
    shapes: dict[tuple, list[dict]] = {}
    for r in rows:
        shapes.setdefault((r["suite"], r["shape"], r["stream"]), []).append(r)
    for points in shapes.values():
        judged = [p for p in points if p["status"] == FRONTIER]
        for p in judged:
            over = [q for q in judged if q is not p and dominates(q, p)]
            if over:
                lead = max(over, key=lambda q: q[PER_USER] / p[PER_USER] * finite(q[PER_GPU]) / finite(p[PER_GPU]))
                p["status"], p["dominated_by"] = DOMINATED, _label(lead)
    out = []
    for r in rows:
        out.append({**{c: r.get(c) for c in POINT_COLUMNS}, **_bands(r),
                    "concurrency": int(r["concurrency"]), "trials": int(r["trials"]), PER_GPU: finite(r.get(PER_GPU)),
                    "cost_usd_per_mtok": cost_usd_per_mtok(gpu_hour_usd, r.get(PER_GPU)),
                    "energy_j_per_token": finite(r.get("energy_j_per_token"))})
    frame = pd.DataFrame(out, columns=POINT_COLUMNS)
    return frame.astype(object).where(frame.notna(), None)


def frontier_configs(points: pd.DataFrame) -> dict[str, dict[tuple[str, str], list[str]]]:
    """suite → (shape, stream) → the configurations with a point on that frontier, in order of first appearance
    (every shape of the suite listed, an empty list when no point could be judged)."""
    out: dict[str, dict[tuple[str, str], list[str]]] = {}
    for r in points.to_dict("records"):
        names = out.setdefault(r["suite"], {}).setdefault((r["shape"], r["stream"]), [])
        if r["status"] == FRONTIER and r["config"] not in names:
            names.append(r["config"])
    return out
