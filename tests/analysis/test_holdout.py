"""The hold-out check of calibrate (analysis.holdout): the fitted constants against the spec's own on cells the
fit did not see, cell by cell, with a sign test."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis.fit import MATCH_KEYS
from epdbench.analysis.holdout import compare_on_held_out, fewest_cells, sign_test, summary_line


def test_the_sign_test_is_the_exact_binomial_tail_on_both_sides():
    assert sign_test(0, 0) == 1.0
    assert sign_test(6, 0) == sign_test(0, 6) == pytest.approx(2 / 64)
    assert sign_test(10, 2) == pytest.approx(2 * (1 + 12 + 66) / 4096)
    assert sign_test(5, 5) == 1.0
    brute = 2 * sum(math.comb(9, i) for i in range(3)) / 512          # 7 of 9, or 2 of 9, or more uneven
    assert sign_test(7, 2) == pytest.approx(brute)
    assert fewest_cells() == 6            # 5 of 5 happens by chance 1 time in 16: never beyond chance


def cells(observed: list[float], **metrics) -> pd.DataFrame:
    index = pd.MultiIndex.from_tuples([("pd-tcp", "fixed", f"{512 * (i + 1)}/64", 1, "main")
                                       for i in range(len(observed))], names=MATCH_KEYS)
    return pd.DataFrame({"ttft_p50_ms": observed, **metrics}, index=index)


def test_a_fit_closer_on_every_held_out_cell_is_better_and_one_farther_on_every_cell_is_worse():
    observed = cells([100.0] * 8)
    spec = cells([120.0] * 8)              # 20 % off everywhere
    fitted = cells([103.0, 97, 105, 95, 101, 110, 90, 104])
    check = compare_on_held_out(observed, spec, fitted)["ttft_p50_ms"]
    assert check["verdict"] == "better" and (check["closer"], check["farther"]) == (8, 0)
    assert check["spec_error"] == pytest.approx(0.20) and check["fitted_error"] == pytest.approx(0.045)
    assert check["p"] == pytest.approx(2 / 256)

    worse = compare_on_held_out(observed, fitted, spec)["ttft_p50_ms"]      # the roles swapped
    assert worse["verdict"] == "worse" and (worse["closer"], worse["farther"]) == (0, 8)


def test_a_split_within_chance_or_predictions_alike_are_no_clear_difference_and_too_few_cells_cannot_tell():
    observed = cells([100.0] * 8)
    spec = cells([110.0] * 8)
    fitted = cells([105.0, 105, 105, 105, 120, 120, 120, 120])    # medians 12.5 % against 10 %: 4 cells each way
    check = compare_on_held_out(observed, spec, fitted)["ttft_p50_ms"]
    assert check["verdict"] == "no clear difference" and (check["closer"], check["farther"]) == (4, 4)
    assert check["fitted_error"] > check["spec_error"]                 # the medians alone would call it worse

    alike = compare_on_held_out(observed, cells([100.0] * 8), cells([100.9] * 8))["ttft_p50_ms"]
    assert alike["verdict"] == "no clear difference" and (alike["closer"], alike["farther"]) == (0, 0)  # within 1 %

    few = compare_on_held_out(cells([100.0] * 5), cells([150.0] * 5), cells([100.0] * 5))["ttft_p50_ms"]
    assert few["verdict"] == "too few cells" and few["closer"] == 5


def test_cells_either_did_not_predict_or_predicted_alike_are_not_compared():
    observed = cells([100.0] * 9, req_s=[np.nan] * 9)
    spec = cells([120.0] * 6 + [np.nan, 100.0, 100.0], req_s=[1.0] * 9)
    fitted = cells([101.0] * 6 + [100.0, np.nan, 100.0], req_s=[1.0] * 9)
    got = compare_on_held_out(observed, spec, fitted)
    assert (got["ttft_p50_ms"]["closer"], got["ttft_p50_ms"]["farther"]) == (6, 0)   # 3 cells not counted
    assert got["ttft_p50_ms"]["verdict"] == "better"
    assert got["req_s"] == {"spec_error": None, "fitted_error": None, "closer": 0, "farther": 0, "p": 1.0,
                            "verdict": "too few cells"}


def test_the_summary_line_names_each_metric_under_its_verdict_with_the_cells_that_decided_it():
    observed = cells([100.0] * 8, tpot_p50_ms=[10.0] * 8)
    spec = cells([120.0] * 8, tpot_p50_ms=[10.1] * 8)
    fitted = cells([101.0] * 8, tpot_p50_ms=[10.5] * 8)
    line = summary_line(compare_on_held_out(observed, spec, fitted))
    assert line == ("the fitted constants against the spec's on the held-out cells: better for ttft_p50_ms (8 of 8 "
                    "cells that differ); WORSE for tpot_p50_ms (8 of 8 cells that differ)")


def test_holms_correction_holds_the_metrics_of_one_check_to_five_percent_together():
    from epdbench.analysis.holdout import holm

    assert holm({"a": 0.001, "b": 0.02, "c": 0.04}, 0.05) == []              # 0.001 < .05/3, .02 < .05/2, .04 < .05
    assert holm({"a": 0.001, "b": 0.03, "c": 0.04}, 0.05) == ["b", "c"]      # 0.03 ≥ .05/2: it and all after it
    assert holm({"a": 0.02}, 0.05) == [] and holm({}, 0.05) == []

    observed = cells([100.0] * 9)
    spec = cells([120.0] * 9)
    eight_of_nine = cells([101.0] * 8 + [150.0])                              # p = 0.039 alone
    assert compare_on_held_out(observed, spec, eight_of_nine)["ttft_p50_ms"]["verdict"] == "better"
    both = compare_on_held_out(cells([100.0] * 9, tpot_p50_ms=[10.0] * 9), cells([120.0] * 9, tpot_p50_ms=[12.0] * 9),
                               cells([101.0] * 8 + [150.0], tpot_p50_ms=[10.1] * 8 + [15.0]))
    assert {m: c["verdict"] for m, c in both.items()} == {"ttft_p50_ms": "no clear difference",   # 0.039 ≥ 0.05 / 2
                                                          "tpot_p50_ms": "no clear difference"}
    assert both["ttft_p50_ms"]["p"] == pytest.approx(2 * 10 / 512)
    strong = compare_on_held_out(cells([100.0] * 9, tpot_p50_ms=[10.0] * 9), cells([120.0] * 9, tpot_p50_ms=[12.0] * 9),
                                 cells([101.0] * 8 + [150.0], tpot_p50_ms=[10.1] * 9))
    assert {c["verdict"] for c in strong.values()} == {"better"}     # 0.004 < 0.05 / 2, then 0.039 < 0.05 / 1
