"""Goodput (pure): for each open-loop rate cell the share of its measured requests that met the suite's SLO,
and for each configuration the highest offered rate whose attainment stayed at or above the target —
DistServe's goodput — in requests/s and per GPU.

A request meets the SLO when it succeeded and every bound set holds: TTFT counted from its *scheduled*
arrival (a request the client could not send on time waited as a user would), TPOT = (last − first token)
/ (output tokens − 1), and its largest inter-token gap. Failed requests are misses. Trials are pooled per
rate; each attainment carries its 95% Wilson interval, and a rate whose interval straddles the target is
`uncertain`: the goodput is then given as a range, never as a finding sharper than the sweep and its noise.
An `itl_p99_ms` bound is on the rate, not the request: the p99 of every inter-token gap of its measured
requests must not exceed it, and a bound inside that p99's 95% order-statistic interval makes the rate
uncertain too — unless the other bound fails beyond its noise (`surely`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from epdbench.analysis.chunks import Lists, gaps, largest_gap
from epdbench.analysis.noise import percentile_ci
from epdbench.specs.models import ExperimentSpec, RateSuite, Slo
from epdbench.specs.workload import plan_cells, split_rate

Z95 = 1.959964
ATTAINMENT_COLUMNS = ["config", "suite", "shape", "rate", "requests", "met", "attainment", "attainment_low",
                      "attainment_high", "target", "itl_p99_ms", "sustained", "uncertain", "send_lag_p99_ms"]
GOODPUT_COLUMNS = ["config", "suite", "shape", "goodput_req_s", "goodput_req_s_per_gpu", "upper_req_s",
                   "highest_rate_swept", "target", "note"]


@dataclass(frozen=True)
class RateCell:
    suite: str
    shape: str          # e.g. 1024/128
    rate: float
    slo: Slo


def rate_cells(spec: ExperimentSpec) -> dict[tuple[str, str], RateCell]:
    """(suite, workload) → its rate cell, for the rate suites of `spec` that have an SLO."""
    slos = {s.name: s.slo for s in spec.suites if isinstance(s, RateSuite) and s.slo is not None}
    return {(c.suite, c.workload): RateCell(c.suite, split_rate(c.workload)[0], c.rate, slos[c.suite])
            for c in plan_cells(spec) if c.rate is not None and c.suite in slos}


def wilson(met: int, n: int) -> tuple[float, float]:
    """95% Wilson score interval of a proportion."""
    if n == 0:
        return 0.0, 1.0
    p = met / n
    centre = (p + Z95 ** 2 / (2 * n)) / (1 + Z95 ** 2 / n)
    half = Z95 * math.sqrt(p * (1 - p) / n + Z95 ** 2 / (4 * n * n)) / (1 + Z95 ** 2 / n)
    return (0.0 if met == 0 else max(0.0, min(p, centre - half)),
            1.0 if met == n else min(1.0, max(p, centre + half)))


def requests_meeting(rows: pd.DataFrame, slo: Slo) -> np.ndarray:
    """Per measured request: did it meet every bound of `slo`?"""
    ok = rows["ok"].astype(bool).to_numpy()
    met = ok.copy()
    lag_ms = (rows["send_ns"].astype("int64") - rows["scheduled_ns"].astype("int64")).to_numpy() / 1e6
    ttft = pd.to_numeric(rows["ttft_ms"], errors="coerce").to_numpy(dtype=float)
    if slo.ttft_ms is not None:
        met &= np.nan_to_num(ttft + np.maximum(lag_ms, 0), nan=np.inf) <= slo.ttft_ms
    if slo.tpot_ms is not None:
        e2e = pd.to_numeric(rows["e2e_ms"], errors="coerce").to_numpy(dtype=float)
        out = pd.to_numeric(rows["output_tokens"], errors="coerce").to_numpy(dtype=float)
        with np.errstate(divide="ignore", invalid="ignore"):
            tpot = np.where(out >= 2, (e2e - ttft) / (out - 1), 0.0)
        met &= np.nan_to_num(tpot, nan=np.inf) <= slo.tpot_ms
    if slo.itl_ms is not None:
        offsets = Lists(rows["chunk_offsets_ns"])
        worst = largest_gap(offsets.flat(), offsets.lengths) / 1e6
        met &= worst <= slo.itl_ms
    return met


@dataclass(frozen=True)
class ItlP99:
    """A rate's ITL p99 against the SLO's itl_p99_ms: the pooled gaps' p99 (None: no gap, or no bound asked)."""
    p99_ms: float | None
    holds: bool
    uncertain: bool


def itl_p99(rows: pd.DataFrame, slo: Slo) -> ItlP99:
    """The p99 of every gap between consecutive tokens of the succeeded `rows`, pooled, and whether it keeps
    within slo.itl_p99_ms (a rate without a gap keeps within it); uncertain when the bound lies inside the
    p99's 95% order-statistic interval."""
    if slo.itl_p99_ms is None:
        return ItlP99(None, True, False)
    offsets = Lists(rows.loc[rows["ok"].astype(bool), "chunk_offsets_ns"])
    gaps_ms = gaps(offsets.flat(), offsets.lengths) / 1e6
    if not len(gaps_ms):
        return ItlP99(None, True, False)
    p99 = float(np.percentile(gaps_ms, 99))
    ci = percentile_ci(gaps_ms, 99)
    uncertain = ci is not None and ci[0] < ci[1] and ci[0] <= slo.itl_p99_ms <= ci[1]
    return ItlP99(p99, p99 <= slo.itl_p99_ms, uncertain)


def surely(met: int, n: int, target: float, itl_holds: bool = True, itl_uncertain: bool = False) -> bool | None:
    """A rate's verdict beyond the noise: True when it surely holds (the attainment's Wilson interval at or
    above the target, the ITL p99 within its bound beyond its interval), False when it surely fails (the
    interval wholly below the target, the ITL p99 over its bound beyond its interval, or nothing measured), None
    when it is within the noise."""
    if n == 0:
        return False
    low, high = wilson(met, n)
    if high < target or (not itl_holds and not itl_uncertain):
        return False
    if low >= target and itl_holds and not itl_uncertain:
        return True
    return None


def straddles(low, target, high):
    """Whether an attainment's Wilson interval straddles the target (scalars, or columns element-wise)."""
    return (low < target) & (target <= high)


def attainment(records: pd.DataFrame, cells: dict[tuple[str, str], RateCell]) -> pd.DataFrame:
    """One row per configuration × rate cell: requests, met, attainment with its interval, sustained."""
    if records.empty or not cells:
        return pd.DataFrame(columns=ATTAINMENT_COLUMNS)
    measured = records[records["phase"] == "measured"]
    rows = []
    for (config, suite, workload), g in measured.groupby(["config", "suite", "workload"], sort=False):
        cell = cells.get((suite, workload))
        if cell is None:
            continue
        met = int(requests_meeting(g, cell.slo).sum())
        n = len(g)
        low, high = wilson(met, n)
        lag = (g["send_ns"].astype("int64") - g["scheduled_ns"].astype("int64")).to_numpy() / 1e6
        share = met / n if n else 0.0
        itl = itl_p99(g, cell.slo)
        rows.append({"config": config, "suite": suite, "shape": cell.shape, "rate": cell.rate, "requests": n,
                     "met": met, "attainment": share, "attainment_low": low, "attainment_high": high,
                     "target": cell.slo.attainment, "itl_p99_ms": itl.p99_ms,
                     "sustained": share >= cell.slo.attainment and itl.holds,
                     "uncertain": surely(met, n, cell.slo.attainment, itl.holds, itl.uncertain) is None,
                     "send_lag_p99_ms": float(np.percentile(lag, 99)) if n else None})
    out = pd.DataFrame(rows, columns=ATTAINMENT_COLUMNS)
    return out.sort_values(["suite", "shape", "config", "rate"], kind="stable").reset_index(drop=True)


def goodput(att: pd.DataFrame, gpus: dict[str, int] | None = None) -> pd.DataFrame:
    """Per configuration, suite and shape: the highest rate such that it and every lower swept rate were
    sustained (None when the lowest was not); `upper_req_s` the lowest rate that was not sustained (None:
    all were, the goodput is at least the highest swept). A note says when noise blurs the answer."""
    rows = []
    for (config, suite, shape), g in att.groupby(["config", "suite", "shape"], sort=False):
        g = g.sort_values("rate")
        best, upper, note = None, None, ""
        for _, r in g.iterrows():
            if not r["sustained"]:
                upper = float(r["rate"])
                break
            best = float(r["rate"])
        if upper is None:
            note = "all swept rates sustained: at least the highest"
        elif best is None:
            note = "below the lowest swept rate"
        blurred = g[g["uncertain"].astype(bool)]
        by_attainment = straddles(blurred["attainment_low"], blurred["target"], blurred["attainment_high"])
        for what, rates in (("attainment within noise of the target", blurred[by_attainment]["rate"]),
                            ("ITL p99 within noise of its bound", blurred[~by_attainment]["rate"])):
            if len(rates):
                note = (note + "; " if note else "") + f"{what} at " + ", ".join(f"{x:g}" for x in rates) + " req/s"
        n_gpus = (gpus or {}).get(config)
        rows.append({"config": config, "suite": suite, "shape": shape, "goodput_req_s": best,
                     "goodput_req_s_per_gpu": (best / n_gpus) if (best is not None and n_gpus) else None,
                     "upper_req_s": upper, "highest_rate_swept": float(g["rate"].max()),
                     "target": float(g["target"].iloc[0]), "note": note})
    out = pd.DataFrame(rows, columns=GOODPUT_COLUMNS)
    return out.astype(object).where(out.notna(), None)


def slo_text(slo: Slo) -> str:
    """The SLO in words, as the report and `whatif` say it."""
    bounds = [f"{name} ≤ {value:g} ms" for name, value in (("TTFT from arrival", slo.ttft_ms), ("TPOT", slo.tpot_ms),
                                                            ("every ITL", slo.itl_ms)) if value is not None]
    parts = [f"{' and '.join(bounds)} for at least {slo.attainment:.0%} of requests"] if bounds else []
    if slo.itl_p99_ms is not None:
        parts.append(f"ITL p99 over all their tokens ≤ {slo.itl_p99_ms:g} ms")
    return "; ".join(parts)


def goodput_lines(table: pd.DataFrame) -> list[str]:
    """One line per configuration and shape, for the terminal and the report."""
    lines = []
    for _, r in table.iterrows():
        if r["goodput_req_s"] is None or pd.isna(r["goodput_req_s"]):
            value = f"< {r['upper_req_s']:g} req/s"
        else:
            value = f"{r['goodput_req_s']:g} req/s"
            if r["goodput_req_s_per_gpu"] is not None and not pd.isna(r["goodput_req_s_per_gpu"]):
                value += f" ({r['goodput_req_s_per_gpu']:.3g} per GPU)"
            if r["upper_req_s"] is not None and not pd.isna(r["upper_req_s"]):
                value += f", fails at {r['upper_req_s']:g}"
        lines.append(f"goodput of {r['config']}, suite {r['suite']} {r['shape']}: {value}"
                     + (f" — {r['note']}" if r["note"] else ""))
    return lines
