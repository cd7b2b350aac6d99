"""analysis/error_tail.py: past the median, the 90th percentile of |predicted / observed − 1| (numpy's linear
interpolation) and the worst cell with its ratio, on a hand-made table of 15 ratios; and what a profile keeps."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis import error_tail

KEYS = ["config", "suite", "workload", "concurrency", "stream"]
# errors 0, .01, .02, … .12, then .20 and .50: sorted, e(12) = .12 and e(13) = .20
RATIOS = [1.0, 1.01, 0.98, 1.03, 0.96, 1.05, 1.06, 0.93, 1.08, 1.09, 0.9, 1.11, 1.12, 0.8, 1.5]


def index(n: int) -> pd.MultiIndex:
    return pd.MultiIndex.from_tuples([("aggregated", "text", f"{1024 * (i + 1)}/128", 1, "main") for i in range(n)],
                                     names=KEYS)


def test_the_p90_interpolates_linearly_between_the_two_order_statistics_around_it():
    t = error_tail.tail(pd.Series(RATIOS, index=index(15)))
    assert t.cells == 15
    assert t.median_error == pytest.approx(0.07)                       # e(7)
    assert t.p90_error == pytest.approx(0.12 + 0.6 * (0.20 - 0.12))    # position 0.9 × 14 = 12.6
    assert t.p90_error == pytest.approx(np.quantile(np.abs(np.array(RATIOS) - 1), 0.9, method="linear"))
    assert t.worst == index(15)[14] and t.worst_ratio == 1.5


def test_the_worst_cell_keeps_its_direction_and_missing_figures_are_left_out():
    ratios = pd.Series([1.1, 0.5, np.nan, 1.5], index=index(4))      # errors .1, .5, —, .5: the first of the two
    t = error_tail.tail(ratios)
    assert (t.cells, t.worst, t.worst_ratio) == (3, index(4)[1], 0.5)
    assert t.p90_error == pytest.approx(0.5)
    none = error_tail.tail(pd.Series([np.nan], index=index(1)))
    assert none.cells == 0 and none.worst is None and math.isnan(none.p90_error)


def test_a_cell_in_words_names_its_configuration_unless_told_not_to():
    key = ("pd-nixl-tcp", "mixed", "1024/256", 4, "text")
    assert error_tail.cell_text(key, KEYS) == "pd-nixl-tcp mixed 1024/256 (text) c=4"
    assert error_tail.cell_text(key, KEYS, configs=False) == "mixed 1024/256 (text) c=4"
    assert error_tail.cell_text(("a", 3), ["x", "y"]) == "a 3"


def test_a_profile_keeps_per_metric_the_p90_and_the_worst_cell_in_words():
    observed = pd.DataFrame({"ttft_p50_ms": [100.0] * 15, "output_tok_s": [np.nan] * 15}, index=index(15))
    predicted = pd.DataFrame({"ttft_p50_ms": [100.0 * r for r in RATIOS], "output_tok_s": 1.0}, index=index(15))
    tails = error_tail.holdout_tails(observed, predicted)
    assert list(tails) == ["ttft_p50_ms"]                               # no cell has both throughput figures
    assert tails["ttft_p50_ms"]["p90_error"] == pytest.approx(0.168)
    assert tails["ttft_p50_ms"]["worst_cell"] == "aggregated text 15360/128 c=1"
    assert tails["ttft_p50_ms"]["worst_ratio"] == pytest.approx(1.5)
