"""analysis/regression.py on synthetic histories with known answers: pure noise flags nothing, a
planted 30% shift flags exactly that metric, with the right direction and method."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from pydantic import ValidationError

from epdbench.analysis.regression import (REGRESSION_METRICS, RegressionSettings, check_result, detect, prediction_sigma,
                                 relative_sigma, verdict_of)

CONFIGS = ["aggregated", "pd-tcp", "pd-rdma", "epd"]
CELLS = [("fixed", "512/256", 1), ("fixed", "512/256", 8), ("fixed", "8192/128", 1), ("fixed", "8192/128", 8)]
# night-to-night relative noise per metric: medians steadier than tails; a 30% shift is far beyond each
NOISE = {"ttft_p50_ms": 0.02, "ttft_p95_ms": 0.03, "tpot_p50_ms": 0.015, "itl_p99_ms": 0.03, "itl_max_ms": 0.03,
         "output_tok_s": 0.02, "req_s": 0.02}


def level(config: str, cell: tuple, metric: str) -> float:
    """A fixed, cell-specific true value (deterministic)."""
    seed = sum(map(ord, f"{config}{cell}{metric}"))
    return 10.0 + seed % 500


def night(rng, run: int, trials: int = 1, shift: dict | None = None) -> list[dict]:
    rows = []
    for config in CONFIGS:
        for suite, workload, conc in CELLS:
            for trial in range(trials):
                row = {"run_id": f"run{run:03d}", "run_name": f"nightly-{run:03d}", "started": f"2026-01-{run + 1:02d}",
                       "config": config, "suite": suite, "workload": workload, "concurrency": conc,
                       "stream": "main", "trial": trial}
                for m, cv in NOISE.items():
                    factor = (shift or {}).get((config, suite, workload, conc, m), 1.0)
                    row[m] = level(config, (suite, workload, conc), m) * factor * (1 + cv * rng.standard_normal())
                rows.append(row)
    return rows


def history(rng, nights: int, trials: int = 1) -> pd.DataFrame:
    return pd.DataFrame([r for n in range(nights) for r in night(rng, n, trials)])


def tonight(rng, trials: int = 1, shift: dict | None = None) -> pd.DataFrame:
    return pd.DataFrame(night(rng, 99, trials, shift)).drop(columns=["run_id", "run_name", "started"])


def flagged(judgements) -> list[tuple]:
    return [(j.config, j.suite, j.workload, j.concurrency, j.metric, j.status) for j in judgements
            if j.status in ("regression", "improvement")]


@pytest.mark.parametrize("seed", range(10))
def test_pure_noise_flags_nothing(seed):
    rng = np.random.default_rng(seed)
    judgements = detect(tonight(rng), history(rng, 10))
    assert len(judgements) == len(CONFIGS) * len(CELLS) * len(REGRESSION_METRICS)
    assert flagged(judgements) == []
    assert {j.method for j in judgements} == {"band"}


@pytest.mark.parametrize("seed", [100, 101, 103])   # examples; the rate over many nights is tested below
def test_a_planted_30_percent_shift_flags_exactly_that_metric(seed):
    rng = np.random.default_rng(seed)
    past = history(rng, 10)
    planted = ("pd-tcp", "fixed", "8192/128", 8, "itl_p99_ms")
    judgements = detect(tonight(rng, shift={planted: 1.3}), past)
    assert flagged(judgements) == [(*planted[:4], "itl_p99_ms", "regression")]


def test_direction_follows_the_metric():
    rng = np.random.default_rng(7)
    past = history(rng, 8)
    shift = {("epd", "fixed", "512/256", 1, "output_tok_s"): 0.7,     # throughput down: regression
             ("aggregated", "fixed", "8192/128", 8, "ttft_p50_ms"): 0.7,   # latency down: improvement
             ("pd-rdma", "fixed", "512/256", 8, "req_s"): 1.3}        # throughput up: improvement
    found = set(flagged(detect(tonight(rng, shift=shift), past)))
    assert found == {("epd", "fixed", "512/256", 1, "output_tok_s", "regression"),
                     ("aggregated", "fixed", "8192/128", 8, "ttft_p50_ms", "improvement"),
                     ("pd-rdma", "fixed", "512/256", 8, "req_s", "improvement")}


def test_a_planted_30_percent_shift_is_caught_almost_every_night():
    exact = 0
    planted = ("epd", "fixed", "512/256", 8, "ttft_p95_ms")
    for seed in range(60):
        rng = np.random.default_rng(2000 + seed)
        found = flagged(detect(tonight(rng, shift={planted: 1.3}), history(rng, 10)))
        exact += found == [(*planted[:4], "ttft_p95_ms", "regression")]
    assert exact >= 57      # >= 95% of nights flag exactly the planted metric, nothing else


def test_false_flag_rate_on_noise_is_far_below_one_per_night():
    flags = tests = 0
    for seed in range(30):
        rng = np.random.default_rng(1000 + seed)
        judgements = detect(tonight(rng), history(rng, 10))
        flags += len(flagged(judgements))
        tests += len(judgements)
    assert tests == 30 * 96
    assert flags / tests < 0.002          # < 0.2 false flags per night of 96 metric-cells


def test_only_the_last_n_runs_count():
    rng = np.random.default_rng(3)
    old = history(rng, 10)
    old[REGRESSION_METRICS] *= 2.0                  # a level long gone
    recent = history(rng, 20)
    recent = recent[recent["run_id"] >= "run010"]  # ten newer nights at the current level
    both = pd.concat([old, recent], ignore_index=True)
    last10 = detect(tonight(rng), both, RegressionSettings(last_n=10))
    assert flagged(last10) == [] and {j.n_history for j in last10} == {10}
    for j in last10:
        assert j.baseline == pytest.approx(level(j.config, (j.suite, j.workload, j.concurrency), j.metric), rel=0.05)
    assert {j.n_history for j in detect(tonight(rng), both, RegressionSettings(last_n=20))} == {20}


def test_too_little_history_is_never_a_flag():
    rng = np.random.default_rng(4)
    shift = {("pd-tcp", "fixed", "8192/128", 8, "itl_p99_ms"): 2.0}
    judgements = detect(tonight(rng, shift=shift), history(rng, 2))
    assert flagged(judgements) == []
    assert {j.status for j in judgements} == {"insufficient-history"}
    assert detect(tonight(rng), pd.DataFrame()) and all(j.n_history == 0 for j in detect(tonight(rng), pd.DataFrame()))


def test_repeated_trials_use_a_ci_test_when_history_is_short():
    rng = np.random.default_rng(5)
    past = history(rng, 2, trials=3)
    planted = ("pd-rdma", "fixed", "512/256", 1, "tpot_p50_ms")
    judgements = detect(tonight(rng, trials=3, shift={planted: 1.3}), past)
    assert flagged(judgements) == [(*planted[:4], "tpot_p50_ms", "regression")]
    assert {j.method for j in judgements} == {"ci"}


def test_repeated_trials_need_the_whole_ci_outside_the_band():
    rng = np.random.default_rng(6)
    past = history(rng, 10)
    planted = ("pd-tcp", "fixed", "512/256", 8, "itl_p99_ms")
    now = tonight(rng, trials=5, shift={planted: 1.3})
    j = next(j for j in detect(now, past) if (j.config, j.workload, j.concurrency, j.metric) ==
             ("pd-tcp", "512/256", 8, "itl_p99_ms"))
    assert j.method == "band+ci" and j.status == "regression" and j.value_ci95 > 0
    wide = now.copy()       # the same mean, a CI reaching back into the band
    rows = (wide["config"] == "pd-tcp") & (wide["workload"] == "512/256") & (wide["concurrency"] == 8)
    mean = wide.loc[rows, "itl_p99_ms"].mean()
    wide.loc[rows, "itl_p99_ms"] = [mean * 0.6, mean * 0.8, mean, mean * 1.2, mean * 1.4]
    j = next(j for j in detect(wide, past) if (j.config, j.workload, j.concurrency, j.metric) ==
             ("pd-tcp", "512/256", 8, "itl_p99_ms"))
    assert j.status == "within-noise"


def test_a_flat_history_still_tolerates_small_changes():
    rng = np.random.default_rng(8)
    past = history(rng, 6)
    for m in REGRESSION_METRICS:
        past[m] = 100.0
    now = tonight(rng)
    for m in REGRESSION_METRICS:
        now[m] = 101.0                                   # +1%: below min_change
    assert flagged(detect(now, past)) == []
    now.loc[0, "itl_p99_ms"] = 130.0
    assert len(flagged(detect(now, past))) == 1


def test_previous_run_and_delta_are_reported():
    rng = np.random.default_rng(9)
    past = history(rng, 6)
    j = detect(tonight(rng), past)[0]
    last = past[(past["run_id"] == "run005") & (past["config"] == j.config) & (past["workload"] == j.workload)
                & (past["concurrency"] == j.concurrency)]
    assert j.previous == pytest.approx(float(last[j.metric].iloc[0]))
    assert j.previous_run == "nightly-005" and j.n_history == 6
    assert j.delta_pct == pytest.approx(100 * (j.value / j.previous - 1))
    assert j.band_low < j.baseline < j.band_high
    assert j.as_dict()["delta_pct"] == j.delta_pct


def test_verdicts_per_configuration_and_overall():
    rng = np.random.default_rng(10)
    past = history(rng, 10)
    planted = ("epd", "fixed", "512/256", 1, "itl_p99_ms")
    judgements = detect(tonight(rng, shift={planted: 1.3}), past)
    result = check_result(RegressionSettings(), past, judgements)
    assert result["status"] == "regression" and result["overall"]["regressions"] == 1
    assert result["per_config"]["epd"]["status"] == "regression"
    assert result["per_config"]["epd"]["flagged"][0].startswith("epd fixed 512/256 c=1 itl_p99_ms regression +")
    assert result["per_config"]["pd-tcp"] == {"status": "within-noise", "regressions": 0, "improvements": 0,
                                              "flagged": []}
    assert [r["run_name"] for r in result["runs"]][:2] == ["nightly-009", "nightly-008"]
    assert len(result["judgements"]) == len(judgements)
    assert verdict_of([])["status"] == "insufficient-history"
    assert check_result(RegressionSettings(), pd.DataFrame(), detect(tonight(rng), pd.DataFrame()))["status"] == \
        "no-history"


def test_robust_sigma_ignores_one_outlier():
    values = [100.0, 101.0, 99.0, 100.0, 100.5, 99.5, 500.0]
    assert relative_sigma(values) < 0.02
    assert prediction_sigma([values, [10.0, 10.1, 9.9]]) < 0.02
    assert prediction_sigma([[5.0, 5.0]]) == 0.0


def test_settings_are_validated():
    with pytest.raises(ValidationError):
        RegressionSettings(k=0)
    with pytest.raises(ValidationError):
        RegressionSettings(last_n=3, min_history=5)
    with pytest.raises(ValidationError):
        RegressionSettings(window=3)


def test_pure_noise_with_repeated_trials_flags_nothing():
    for seed in range(5):
        rng = np.random.default_rng(500 + seed)
        judgements = detect(tonight(rng, trials=3), history(rng, 10, trials=3))
        assert {j.method for j in judgements} == {"band+ci"} and flagged(judgements) == []


def test_short_history_ci_test_rarely_flags_noise():
    flags = tests = 0
    for seed in range(20):
        rng = np.random.default_rng(600 + seed)
        judgements = detect(tonight(rng, trials=3), history(rng, 2, trials=3))
        assert {j.method for j in judgements} == {"ci"}
        flags += len(flagged(judgements))
        tests += len(judgements)
    assert flags / tests < 0.002


def test_itl_max_is_reported_but_never_judged():
    rng = np.random.default_rng(8)
    shift = {("epd", "fixed", "512/256", 1, "itl_max_ms"): 3.0}      # one extreme sample, tripled
    judgements = detect(tonight(rng, shift=shift), history(rng, 10))
    assert "itl_max_ms" not in {j.metric for j in judgements} and flagged(judgements) == []


def run_level_history(rng, nights: int, trials: int, run_cv: float, trial_cv: float) -> pd.DataFrame:
    """Nights whose trials share one run-level factor (the host, the node, the build) plus a little noise
    of their own: the trials of one night say nothing about night-to-night noise."""
    rows = []
    for n in range(nights + 1):
        factor = 1 + run_cv * rng.standard_normal()
        for row in night(rng, n if n < nights else 99, trials):
            for m in NOISE:
                base = level(row["config"], (row["suite"], row["workload"], row["concurrency"]), m)
                row[m] = base * factor * (1 + trial_cv * rng.standard_normal())
            rows.append(row)
    df = pd.DataFrame(rows)
    return df[df["run_id"] != "run099"], df[df["run_id"] == "run099"].drop(columns=["run_id", "run_name", "started"])


def test_short_history_with_run_level_noise_does_not_take_trials_for_independent_runs():
    flags = tests = 0
    for seed in range(20):
        rng = np.random.default_rng(500 + seed)
        past, now = run_level_history(rng, nights=3, trials=5, run_cv=0.04, trial_cv=0.005)
        judgements = detect(now, past)
        assert {j.method for j in judgements} == {"ci"}
        flags += len(flagged(judgements))
        tests += len(judgements)
    # trials pooled as samples would make a CI of ~0.2% around a night that moves 4%: most cells would flag
    assert flags / tests < 0.01
