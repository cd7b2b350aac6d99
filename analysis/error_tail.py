"""How far a model's figures are off over cells, past the median (pure): the median of |predicted / observed − 1|,
its 90th percentile and the worst cell.

A median says how far off a typical cell is; a user picks a configuration on the cells they run, where the model
may be much further off. The 90th percentile is numpy.quantile(errors, 0.9) with numpy's default linear
interpolation (method "linear", Hyndman and Fan's type 7): the n errors sorted e(0) ≤ … ≤ e(n − 1), the value at
position 0.9 × (n − 1), interpolated between its two neighbours — with 15 cells e(12) + 0.6 × (e(13) − e(12)), with
one cell that cell's error. The worst cell is the one of the largest |predicted / observed − 1| (the first in the
frame's order on a tie), given with its predicted / observed so that its direction shows. The median is
numpy.median, the same quantile at 0.5.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from epdbench.analysis.labels import cell_label

P90 = 0.9
MATCH_KEYS = ("config", "suite", "workload", "concurrency", "stream")    # analysis.engine_steps'


@dataclass(frozen=True)
class Tail:
    cells: int                 # figures compared
    median_error: float        # NaN without any
    p90_error: float
    worst: object | None       # the worst figure's index key (None without any)
    worst_ratio: float         # its predicted / observed


def tail(ratio: pd.Series) -> Tail:
    """The error figures of predicted / observed ratios (index: the cells; NaN ratios left out)."""
    r = ratio.dropna().astype(float)
    if r.empty:
        return Tail(0, np.nan, np.nan, None, np.nan)
    error = (r - 1).abs()
    worst = error.idxmax()
    return Tail(len(r), float(np.median(error)), float(np.quantile(error.to_numpy(), P90)), worst, float(r[worst]))


def cell_text(key, names, configs: bool = True) -> str:
    """A cell of an index with levels `names` (MATCH_KEYS) in words: 'pd-nixl-tcp text 1024/128 c=4' (without the
    configuration when `configs` is False); any other key as its parts joined."""
    parts = dict(zip(names, key if isinstance(key, tuple) else (key,)))
    if not set(MATCH_KEYS) <= parts.keys():
        return " ".join(map(str, key if isinstance(key, tuple) else (key,)))
    cell = f"{parts['suite']} {cell_label(parts['workload'], parts['concurrency'], parts['stream'], short=True)}"
    return f"{parts['config']} {cell}" if configs else cell


def holdout_tails(observed: pd.DataFrame, predicted: pd.DataFrame) -> dict[str, dict]:
    """Per metric of `observed` (cells × metrics, index MATCH_KEYS) where some cell has both figures: the 90th
    percentile of |predicted / observed − 1| (`p90_error`), the worst cell in words (`worst_cell`) and its
    predicted / observed (`worst_ratio`) — what a calibration profile keeps beside its median hold-out error
    (analysis.fit.relative_errors: the same cells, where both figures are known)."""
    p = predicted.reindex(index=observed.index, columns=observed.columns)
    out: dict[str, dict] = {}
    for m in observed.columns:
        both = observed[m].notna() & p[m].notna() & (observed[m] != 0)
        t = tail((p[m][both] / observed[m][both]).astype(float))
        if t.cells:
            out[m] = {"p90_error": t.p90_error, "worst_cell": cell_text(t.worst, observed.index.names),
                      "worst_ratio": t.worst_ratio}
    return out
