"""Where a cell's ITL p99 comes from: the token gaps that are stalls apart from the decode rhythm.

A decoding stream's gaps are one engine step each, unless a step also ran another request's prefill (and its image's
encoding): then every decode in it waited the whole step. The pooled ITL p99 of a cell (analysis.metrics) is the gap
that 1 % of the gaps exceed, so it is a decode step when under 1 % of the gaps are stalls and a stall when over: near
1 % it jumps between the two, and what decides it is how many stalls there are and how long each is — the count of
steps a prefill is spread over, not the total time the prefills took. This module counts them per cell so the
simulator can be held to the real engine on each (benchmarks/simulator/itl_stalls.py), not only on the p99 figure.

A stall is a gap longer than STALL_FACTOR times the cell's median gap (the decode rhythm).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from epdbench.analysis.chunks import Lists, gaps
from epdbench.analysis.noise import percentile_ci

STALL_FACTOR = 3.0          # a gap this many times the cell's median gap is a stall, not a decode step
P99_SHARE_PCT = 1.0         # the share of stalls above which the pooled p99 is a stall
CELL = ["config", "suite", "workload", "concurrency"]


@dataclass(frozen=True)
class Stalls:
    """One cell's token gaps: how many, how many of them stalls and how long, and the pooled p99 with its 95 %
    distribution-free interval (analysis.noise.percentile_ci)."""
    requests: int
    gaps: int
    median_gap_ms: float
    stalls: int
    stall_ms_p50: float | None
    stall_ms_max: float | None
    stall_ms_per_request: float      # the stalls' total over the cell, per request
    p99_ms: float
    p99_ci: tuple[float, float] | None

    @property
    def share_pct(self) -> float:
        return 100.0 * self.stalls / self.gaps if self.gaps else 0.0

    @property
    def p99_is_stall(self) -> bool:
        return self.share_pct > P99_SHARE_PCT


def stalls(chunk_offsets_ns, factor: float = STALL_FACTOR) -> Stalls | None:
    """The stalls among the gaps of these requests' content chunks (each a list of offsets in ns from the send);
    None when the requests have fewer than two gaps in all."""
    offsets = Lists(chunk_offsets_ns)
    ms = gaps(offsets.flat(), offsets.lengths) / 1e6
    ms = ms[np.isfinite(ms)]
    if len(ms) < 2:
        return None
    median = float(np.median(ms))
    stall = ms[ms > factor * median]
    return Stalls(requests=len(offsets.lengths), gaps=len(ms), median_gap_ms=median, stalls=len(stall),
                  stall_ms_p50=float(np.median(stall)) if len(stall) else None,
                  stall_ms_max=float(stall.max()) if len(stall) else None,
                  stall_ms_per_request=float(stall.sum()) / max(1, len(offsets.lengths)),
                  p99_ms=float(np.percentile(ms, 99)), p99_ci=percentile_ci(ms, 99))


def cell_stalls(records: pd.DataFrame, min_concurrency: int = 1) -> dict[tuple, Stalls]:
    """Per cell (config, suite, workload, concurrency) of the measured, answered requests of a run's records, at
    `min_concurrency` or more: its Stalls (cells with under two gaps left out)."""
    rows = records[(records["phase"] == "measured") & records["ok"].astype(bool)
                   & (records["concurrency"] >= min_concurrency)]
    out: dict[tuple, Stalls] = {}
    for key, cell in rows.groupby(CELL, sort=False):
        found = stalls(cell["chunk_offsets_ns"].tolist())
        if found is not None:
            out[tuple(key)] = found
    return out


def _ms(v: float | None) -> str:
    return "—" if v is None else f"{v:.0f}" if v >= 10 else f"{v:.1f}"


def cell_label(key: tuple) -> str:
    config, suite, workload, concurrency = key
    return f"{config} {suite} {workload} c={concurrency}"


def lines(real: dict[tuple, Stalls], sim: dict[tuple, Stalls]) -> list[str]:
    """Per cell both have: the real engine's stalls beside the simulator's — the share of gaps that are stalls (the
    p99 is a stall above 1 %), their count, median and longest, their total per request, and the p99 with the real
    one's 95 % interval."""
    out = [f"{'cell':34} {'':4} {'gaps':>5} {'stalls':>6} {'share':>6} {'stall p50':>9} {'max':>5} "
           f"{'per req':>7} {'ITL p99 ms':>10}  95 % interval"]
    for key, r in real.items():
        s = sim.get(key)
        if s is None:
            continue
        for who, x in (("real", r), ("sim", s)):
            ci = f"{_ms(x.p99_ci[0])}–{_ms(x.p99_ci[1])}" if who == "real" and x.p99_ci else ""
            out.append(f"{cell_label(key) if who == 'real' else '':34} {who:4} {x.gaps:5d} {x.stalls:6d} "
                       f"{x.share_pct:5.1f}% {_ms(x.stall_ms_p50):>9} {_ms(x.stall_ms_max):>5} "
                       f"{_ms(x.stall_ms_per_request):>7} {_ms(x.p99_ms):>10}  {ci}")
    return out


def verdicts(real: dict[tuple, Stalls], sim: dict[tuple, Stalls]) -> list[str]:
    """The cells whose ITL p99 the simulator puts in the other regime (a decode step where the real engine's is a
    stall, or the reverse), with what differs: the stall count or their length."""
    out = []
    for key, r in real.items():
        s = sim.get(key)
        if s is None or r.p99_is_stall == s.p99_is_stall:
            continue
        where = "a stall" if r.p99_is_stall else "a decode step"
        count = f"{s.stalls} stalls against {r.stalls}"
        length = f"median stall {_ms(s.stall_ms_p50)} ms against {_ms(r.stall_ms_p50)} ms"
        out.append(f"{cell_label(key)}: the real p99 is {where} ({r.share_pct:.1f}% of gaps stall), the simulator's "
                   f"not ({s.share_pct:.1f}%): {count}, {length}, "
                   f"{_ms(s.stall_ms_per_request)} ms stalled per request against {_ms(r.stall_ms_per_request)}")
    return out
