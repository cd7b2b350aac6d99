"""analysis/compare.py: matched comparison, best/worst/ratio, wins, and winners only outside the noise."""
from __future__ import annotations

import pandas as pd
import pytest

from epdbench.analysis.compare import compare, ratio_phrase, verdict_table, wins
from epdbench.analysis.noise import RUN_TO_RUN_SPREAD, is_contaminated


def summary(rows: list[dict]) -> pd.DataFrame:
    base = {"suite": "fixed", "workload": "4096/64", "concurrency": 8, "stream": "main", "trial": 0,
            "requests_ok": 100, "requests_total": 100, "n_ttft_samples": 100, "n_itl_samples": 6300}
    return pd.DataFrame([{**base, **r} for r in rows])


def one(comparisons, metric, **where):
    found = [c for c in comparisons if c.metric == metric and all(getattr(c, k) == v for k, v in where.items())]
    assert len(found) == 1
    return found[0]


THREE = summary([
    {"config": "aggregated", "ttft_p50_ms": 154.0, "output_tok_s": 100.0},
    {"config": "pd-rdma", "ttft_p50_ms": 10.0, "output_tok_s": 300.0},
    {"config": "epd", "ttft_p50_ms": 20.0, "output_tok_s": 200.0},
])


def test_lower_is_better_metric():
    c = one(compare(THREE, ["ttft_p50_ms"]), "ttft_p50_ms")
    assert (c.best, c.worst) == ("pd-rdma", "aggregated")
    assert c.ratio == pytest.approx(15.4)
    assert c.values == {"aggregated": 154.0, "pd-rdma": 10.0, "epd": 20.0}
    assert (c.suite, c.workload, c.concurrency, c.stream) == ("fixed", "4096/64", 8, "main")


def test_higher_is_better_metric():
    c = one(compare(THREE, ["output_tok_s"]), "output_tok_s")
    assert (c.best, c.worst) == ("pd-rdma", "aggregated")
    assert c.ratio == pytest.approx(3.0)


def test_ratio_phrase():
    assert ratio_phrase("ttft_p50_ms", 15.4) == "15.4× lower"
    assert ratio_phrase("itl_p99_ms", 3.333) == "3.3× lower"
    assert ratio_phrase("output_tok_s", 3.0) == "3.0× higher"
    assert ratio_phrase("ttft_p50_ms", None) == ""


def test_missing_value_is_compared_among_the_others():
    s = summary([
        {"config": "aggregated", "ttft_p50_ms": 154.0},
        {"config": "pd-rdma", "ttft_p50_ms": None},
        {"config": "epd", "ttft_p50_ms": 20.0},
    ])
    c = one(compare(s, ["ttft_p50_ms"]), "ttft_p50_ms")
    assert c.values["pd-rdma"] is None
    assert (c.best, c.worst) == ("epd", "aggregated")
    assert c.ratio == pytest.approx(154.0 / 20.0)


def test_single_value_has_no_ratio_and_no_win():
    s = summary([{"config": "aggregated", "ttft_p50_ms": 154.0}, {"config": "pd-rdma", "ttft_p50_ms": None}])
    comps = compare(s, ["ttft_p50_ms"])
    c = one(comps, "ttft_p50_ms")
    assert c.worst is None and c.ratio is None
    assert wins(comps) == {}


def test_cells_are_matched_by_workload_and_concurrency():
    s = pd.concat([THREE, THREE.assign(concurrency=1, ttft_p50_ms=[10.0, 30.0, 20.0])], ignore_index=True)
    comps = compare(s, ["ttft_p50_ms"])
    assert len(comps) == 2
    assert one(comps, "ttft_p50_ms", concurrency=8).best == "pd-rdma"
    assert one(comps, "ttft_p50_ms", concurrency=1).best == "aggregated"


def test_trials_are_averaged_before_comparing():
    s = pd.concat([THREE, THREE.assign(trial=1, ttft_p50_ms=[54.0, 30.0, 20.0])], ignore_index=True)
    c = one(compare(s, ["ttft_p50_ms"]), "ttft_p50_ms")
    assert c.values == {"aggregated": 104.0, "pd-rdma": 20.0, "epd": 20.0}
    assert c.worst == "aggregated" and c.ratio == pytest.approx(104.0 / 20.0)


def test_wins_count_matched_cells_per_metric():
    s = pd.concat([THREE, THREE.assign(concurrency=1, ttft_p50_ms=[10.0, 30.0, 20.0])], ignore_index=True)
    assert wins(compare(s, ["ttft_p50_ms", "output_tok_s"])) == {
        "ttft_p50_ms": {"pd-rdma": 1, "aggregated": 1},
        "output_tok_s": {"pd-rdma": 2},
    }


def test_empty_summary_gives_no_comparisons():
    assert compare(pd.DataFrame()) == []


def test_exact_tie_is_not_a_win():
    s = summary([{"config": "aggregated", "tpot_p50_ms": 5.0}, {"config": "pd-rdma", "tpot_p50_ms": 5.0}])
    assert wins(compare(s, ["tpot_p50_ms"])) == {}


def test_a_single_trial_difference_inside_the_run_to_run_spread_is_a_tie():
    spread = RUN_TO_RUN_SPREAD["ttft_p50_ms"]
    inside = 100.0 * (1 + spread)            # |a − b| = spread·100 < spread·(100 + 100(1+spread))
    s = summary([{"config": "pd-tcp", "ttft_p50_ms": inside}, {"config": "pd-rdma", "ttft_p50_ms": 100.0}])
    c = one(compare(s, ["ttft_p50_ms"]), "ttft_p50_ms")
    assert (c.best, c.verdict) == (None, "tie") and c.worst == "pd-tcp"
    assert wins([c]) == {}
    outside = 100.0 * (1 + 3 * spread)
    s = summary([{"config": "pd-tcp", "ttft_p50_ms": outside}, {"config": "pd-rdma", "ttft_p50_ms": 100.0}])
    assert one(compare(s, ["ttft_p50_ms"]), "ttft_p50_ms").verdict == "pd-rdma"


def test_the_lag_of_a_cell_is_a_floor_of_its_latency_noise():
    rows = [{"config": "pd-tcp", "tpot_p50_ms": 10.8}, {"config": "pd-rdma", "tpot_p50_ms": 10.0}]
    # 0.8 ms apart, spread bands 0.324 + 0.3: a win; with 0.45 ms of lag in both cells (4.5% of TPOT, not
    # contaminated) the bands are 0.45 + 0.45: a tie.
    assert one(compare(summary(rows), ["tpot_p50_ms"]), "tpot_p50_ms").verdict == "pd-rdma"
    for r in rows:
        r.update(loop_lag_p99_ms=0.1, emulation_lag_p99_ms=0.45)
        assert not is_contaminated(r)
    assert one(compare(summary(rows), ["tpot_p50_ms"]), "tpot_p50_ms").verdict == "tie"


def test_with_repeated_trials_a_winner_needs_disjoint_confidence_intervals():
    def trials(config, values):
        return [{"config": config, "trial": t, "output_tok_s": v} for t, v in enumerate(values)]
    overlapping = summary(trials("pd-tcp", [100.0, 120.0, 80.0]) + trials("pd-rdma", [110.0, 125.0, 95.0]))
    assert one(compare(overlapping, ["output_tok_s"]), "output_tok_s").verdict == "tie"
    apart = summary(trials("pd-tcp", [100.0, 101.0, 99.0]) + trials("pd-rdma", [110.0, 111.0, 109.0]))
    assert one(compare(apart, ["output_tok_s"]), "output_tok_s").verdict == "pd-rdma"


def test_a_contaminated_cell_names_no_winner():
    s = summary([{"config": "aggregated", "ttft_p50_ms": 154.0, "contaminated": True},
                 {"config": "pd-rdma", "ttft_p50_ms": 10.0, "contaminated": False}])
    c = one(compare(s, ["ttft_p50_ms"]), "ttft_p50_ms")
    assert (c.best, c.verdict) == (None, "contaminated")
    assert wins([c]) == {}


def test_verdict_table_has_one_row_per_matched_cell_with_the_three_deployment_metrics():
    s = pd.concat([THREE.assign(output_tok_s_per_gpu=[100.0, 100.0, 102.0]),
                   THREE.assign(concurrency=1, output_tok_s_per_gpu=[50.0, 80.0, 60.0])], ignore_index=True)
    table = verdict_table(compare(s))
    assert [(r["concurrency"], r["verdicts"]) for r in table] == [
        (8, {"ttft_p50_ms": "pd-rdma", "itl_p99_ms": None, "output_tok_s_per_gpu": "tie"}),
        (1, {"ttft_p50_ms": "pd-rdma", "itl_p99_ms": None, "output_tok_s_per_gpu": "pd-rdma"}),
    ]


def test_itl_max_is_shown_but_never_judged():
    """One extreme sample per cell: even a 10× difference names no winner, bolds nothing and counts no win."""
    s = summary([{"config": "aggregated", "itl_max_ms": 71.7}, {"config": "pd-rdma", "itl_max_ms": 6.8}])
    c = one(compare(s), "itl_max_ms")
    assert c.values == {"aggregated": 71.7, "pd-rdma": 6.8}
    assert (c.best, c.verdict, c.leaders, c.separated) == (None, None, (), False)
    assert c.worst == "aggregated" and c.ratio == pytest.approx(71.7 / 6.8)
    assert "itl_max_ms" not in wins(compare(s))


def test_one_trial_bands_reach_towards_the_other_value_from_the_sample_ci_bounds():
    """Medians 23 ms and 33.2 ms, the higher one's CI [33.0, 46.7]: apart although its larger half-width
    (13.5 ms) alone would cover the gap."""
    s = summary([{"config": "aggregated", "ttft_p50_ms": 23.0, "ttft_p50_ms_sample_ci95": 5.5,
                  "ttft_p50_ms_sample_ci95_lo": 22.6, "ttft_p50_ms_sample_ci95_hi": 28.5},
                 {"config": "pd-rdma", "ttft_p50_ms": 33.2, "ttft_p50_ms_sample_ci95": 13.5,
                  "ttft_p50_ms_sample_ci95_lo": 33.0, "ttft_p50_ms_sample_ci95_hi": 46.7}])
    assert one(compare(s, ["ttft_p50_ms"]), "ttft_p50_ms").verdict == "aggregated"
    halves = s.drop(columns=["ttft_p50_ms_sample_ci95_lo", "ttft_p50_ms_sample_ci95_hi"])
    assert one(compare(halves, ["ttft_p50_ms"]), "ttft_p50_ms").verdict == "tie"
