"""Does calibrating help on cells it was not fitted to? The hold-out check of `epdbench calibrate` (pure).

A fit always lowers the error on the cells it is fitted to; what a profile is for is predicting others. So on the
held-out cells, the constants fitted to the other half are set against the spec's own constants, cell by cell and
metric by metric: which of the two predictions lies closer to the observed figure (|log ratio|), the two counted
alike within ALIKE (1 %, the smallest move analysis.fit counts as an effect). A two-sided sign test over the
cells where they differ says whether one is closer beyond chance (ALPHA for the check's metrics together: Holm's
correction, as several metrics are tested at once): `better` (the fit predicts the held-out cells better than the
spec's constants), `worse` (it was fitted to the noise or to a trade of constants that does not carry over: the
spec's constants predict this run better), otherwise `no clear difference` (alike on most cells, or closer on
some and farther on others), and `too few cells` when fewer than 6 cells are compared: even all of them on one
side could be chance. Medians alone cannot say this: 6 % against 2 % over a dozen cells may be two or three
cells, and 0.1 % against 0.0 % on every cell is no difference.
"""
from __future__ import annotations

import math

import numpy as np
import pandas as pd

from epdbench.analysis.fit import MIN_EFFECT, relative_errors
from epdbench.specs.profile import HOLDOUT_VERDICTS as VERDICTS

ALPHA = 0.05
ALIKE = math.log1p(MIN_EFFECT)   # predictions this close (1 %) on a cell are alike: the fit's own smallest effect


def sign_test(wins: int, losses: int) -> float:
    """Two-sided exact sign test: the chance of a split at least this uneven between `wins` and `losses`
    when either side is equally likely (ties left out before)."""
    n = wins + losses
    if n == 0:
        return 1.0
    tail = sum(math.comb(n, i) for i in range(min(wins, losses) + 1)) / 2 ** n
    return min(1.0, 2 * tail)


def fewest_cells(alpha: float = ALPHA) -> int:
    """The fewest differing cells with which a sign test can reach `alpha` at all (all on one side)."""
    n = 1
    while sign_test(n, 0) >= alpha:
        n += 1
    return n


def _abs_log_ratio(predicted: pd.Series, observed: pd.Series) -> pd.Series:
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.abs(np.log(predicted.astype(float) / observed.astype(float)))
    return r.where(np.isfinite(r))


def compare_on_held_out(observed: pd.DataFrame, spec_predicted: pd.DataFrame,
                        fitted_predicted: pd.DataFrame) -> dict[str, dict]:
    """Per metric of `observed` (held-out cells × metrics, as analysis.fit.observed_cells), the spec's constants'
    prediction against the fitted one: {spec_error, fitted_error (median |predicted/observed − 1| over the cells
    both predict), closer, farther (cells where the fitted prediction is closer / farther; equal ones left out),
    p (sign test), verdict (one of VERDICTS)}. A cell one of them did not predict is not compared."""
    out: dict[str, dict] = {}
    spec_p = spec_predicted.reindex(index=observed.index, columns=observed.columns)
    fit_p = fitted_predicted.reindex(index=observed.index, columns=observed.columns)
    least = fewest_cells()
    for m in observed.columns:
        a, b = _abs_log_ratio(spec_p[m], observed[m]), _abs_log_ratio(fit_p[m], observed[m])
        both = a.notna() & b.notna()
        a, b = a[both], b[both]
        closer, farther = int((b < a - ALIKE).sum()), int((b > a + ALIKE).sum())
        if closer + farther < least:
            verdict = "no clear difference" if int(both.sum()) >= least else "too few cells"
        else:
            verdict = "better" if closer > farther else "worse"      # if beyond chance: holm() decides
        compared = observed.loc[both, [m]]
        out[m] = {"spec_error": relative_errors(compared, spec_p)[m],
                  "fitted_error": relative_errors(compared, fit_p)[m],
                  "closer": closer, "farther": farther, "p": sign_test(closer, farther), "verdict": verdict}
    for m in holm({m: c["p"] for m, c in out.items() if c["verdict"] in ("better", "worse")}, ALPHA):
        out[m]["verdict"] = "no clear difference"
    return out


def holm(p_values: dict[str, float], alpha: float) -> list[str]:
    """The tests Holm's step-down procedure does not reject at family-wise level `alpha`: the smallest p is held
    to alpha/m, the next to alpha/(m−1), and so on, until one is not below its bound (it and all after it)."""
    ranked = sorted(p_values, key=lambda k: (p_values[k], k))
    for i, name in enumerate(ranked):
        if p_values[name] >= alpha / (len(ranked) - i):
            return ranked[i:]
    return []


_WORDS = {"better": "better for", "worse": "WORSE for", "no clear difference": "no clear difference for",
          "too few cells": "too few cells to tell for"}


def summary_line(checks: dict[str, dict]) -> str:
    """The check in one sentence: which metrics the fit predicts better, worse, or no differently on held-out
    cells than the spec's constants, with the counts of cells."""
    def part(verdict: str) -> str:
        names = [f"{m} ({c['closer'] if verdict == 'better' else c['farther']} of {c['closer'] + c['farther']} "
                 "cells that differ)" if verdict in ("better", "worse") else m
                 for m, c in checks.items() if c["verdict"] == verdict]
        return ", ".join(names)
    said = []
    for verdict in VERDICTS:
        if text := part(verdict):
            said.append(f"{_WORDS[verdict]} {text}")
    return "the fitted constants against the spec's on the held-out cells: " + "; ".join(said)
