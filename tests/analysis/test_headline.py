"""analysis/headline.py: changes against the baseline, headline picks with their trade-offs, tallies."""
from __future__ import annotations

import pandas as pd
import pytest

from epdbench.analysis.headline import MIN_HEADLINE_FACTOR, baseline_config, changes_vs_baseline, headline, tallies
from epdbench.analysis.trials import aggregate_trials

CONFIGS = [{"name": "aggregated", "topology": "aggregated"}, {"name": "pd-tcp", "topology": "pd"},
           {"name": "epd", "topology": "epd"}]


def row(config: str, concurrency: int, **metrics) -> dict:
    base = {"config": config, "suite": "fixed", "workload": "8192/128", "concurrency": concurrency, "stream": "main",
            "trial": 0, "requests_ok": 64, "requests_total": 64, "n_ttft_samples": 64, "n_itl_samples": 64 * 127,
            "ttft_p50_ms": 100.0, "tpot_p50_ms": 10.0, "itl_p99_ms": 50.0, "output_tok_s": 1000.0,
            "output_tok_s_per_gpu": 170.0}
    return {**base, **metrics}


SUMMARY = pd.DataFrame([
    row("aggregated", 1), row("pd-tcp", 1, ttft_p50_ms=101.5),
    row("epd", 1, ttft_p50_ms=180.0, tpot_p50_ms=8.0),
    row("aggregated", 16, itl_p99_ms=509.2, ttft_p50_ms=300.0),
    row("pd-tcp", 16, itl_p99_ms=18.3, ttft_p50_ms=450.0, output_tok_s_per_gpu=85.0),
    row("epd", 16, itl_p99_ms=25.0, ttft_p50_ms=300.0),
])


def changes():
    return changes_vs_baseline(aggregate_trials(SUMMARY), "aggregated")


def test_baseline_is_the_aggregated_configuration_else_the_first():
    assert baseline_config(CONFIGS) == "aggregated"
    assert baseline_config(CONFIGS[1:]) == "pd-tcp"
    assert baseline_config([]) is None


def test_changes_keep_only_values_that_differ_by_more_than_the_noise():
    found = {(c.config, c.concurrency, c.metric) for c in changes()}
    assert ("pd-tcp", 1, "tpot_p50_ms") not in found          # equal to the baseline
    assert ("pd-tcp", 1, "ttft_p50_ms") not in found          # 1.5% apart: inside the run-to-run spread of one trial
    assert ("pd-tcp", 16, "itl_p99_ms") in found and ("epd", 1, "tpot_p50_ms") in found


def test_largest_improvement_leads_with_its_trade_off():
    picks = headline(changes())
    top = picks[0].change
    assert (top.config, top.concurrency, top.metric) == ("pd-tcp", 16, "itl_p99_ms")
    assert top.better and top.factor == pytest.approx(509.2 / 18.3)
    trade = picks[0].counterpart
    assert (trade.metric, trade.better) == ("output_tok_s_per_gpu", False)       # 2.0× worse beats TTFT's 1.5×
    assert trade.factor == pytest.approx(2.0)


def test_regressions_follow_with_what_they_bought():
    picks = headline(changes())
    regressions = [p for p in picks if not p.change.better]
    assert regressions[0].change.metric == "output_tok_s_per_gpu" and regressions[0].change.factor == 2.0
    ttft = next(p for p in regressions if p.change.metric == "ttft_p50_ms")
    assert (ttft.change.config, ttft.change.concurrency) == ("epd", 1)              # 1.8× beats pd-tcp's 1.5×
    assert (ttft.counterpart.metric, ttft.counterpart.better) == ("tpot_p50_ms", True)


def test_one_headline_per_metric_and_small_changes_are_not_headlines():
    picks = headline(changes())
    metrics = [(p.change.metric, p.change.better) for p in picks]
    assert len(metrics) == len(set(metrics))
    assert all(p.change.factor >= MIN_HEADLINE_FACTOR for p in picks)
    assert not any(p.change.config == "pd-tcp" and p.change.concurrency == 1 for p in picks)   # 1.015× TTFT


def test_low_support_tails_are_never_headlines():
    few = SUMMARY.assign(n_itl_samples=50)        # ITL p99 from < 100 gaps, one trial
    assert not [c for c in changes_vs_baseline(aggregate_trials(few), "aggregated") if c.metric == "itl_p99_ms"]


def test_tallies_count_cells_and_median_factors():
    t = {(x.config, x.metric): x for x in tallies(changes())}
    ttft = t[("pd-tcp", "ttft_p50_ms")]
    assert (ttft.better, ttft.worse, ttft.cells) == (0, 1, 1)     # 1.015× at c=1 lies inside the noise
    assert ttft.median_worse == pytest.approx(1.5)
    assert t[("epd", "itl_p99_ms")].median_better == pytest.approx(509.2 / 25.0)


def test_contaminated_cells_make_no_change():
    spoilt = SUMMARY.assign(contaminated=[False, False, False, False, True, False])   # pd-tcp at c=16
    found = {(c.config, c.concurrency) for c in changes_vs_baseline(aggregate_trials(spoilt), "aggregated")}
    assert ("pd-tcp", 16) not in found and ("epd", 16) in found
    base_spoilt = SUMMARY.assign(contaminated=[False, False, False, True, False, False])
    assert not [c for c in changes_vs_baseline(aggregate_trials(base_spoilt), "aggregated") if c.concurrency == 16]


def test_a_pd_rdma_vs_pd_tcp_difference_inside_the_noise_is_a_tie_and_never_a_headline():
    from epdbench.analysis.compare import compare
    pd_only = pd.DataFrame([row("pd-tcp", 8, ttft_p50_ms=69.0, ttft_p50_ms_sample_ci95=12.0),
                            row("pd-rdma", 8, ttft_p50_ms=75.0, ttft_p50_ms_sample_ci95=14.0)])
    assert baseline_config(CONFIGS[1:2] + [{"name": "pd-rdma", "topology": "pd"}]) == "pd-tcp"
    assert not changes_vs_baseline(aggregate_trials(pd_only), "pd-tcp")
    assert not headline(changes_vs_baseline(aggregate_trials(pd_only), "pd-tcp"))
    ttft = next(c for c in compare(pd_only) if c.metric == "ttft_p50_ms")
    assert ttft.verdict == "tie" and ttft.best is None
