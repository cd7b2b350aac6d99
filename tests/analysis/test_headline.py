"""analysis/headline.py: changes against the baseline, headline picks with their trade-offs, tallies."""
from __future__ import annotations

import pandas as pd
import pytest

from epdbench.analysis.compare import compare
from epdbench.analysis.headline import (MIN_HEADLINE_FACTOR, baseline_config, changes_vs_baseline, headline, stands,
                                        tallies)
from epdbench.analysis.trials import aggregate_trials
from epdbench.reports.findings import headline_sentence

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


def picks_of(summary: pd.DataFrame = SUMMARY, baseline: str = "aggregated"):
    return headline(changes_vs_baseline(aggregate_trials(summary), baseline), compare(summary))


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
    picks = picks_of()
    top = picks[0].change
    assert (top.config, top.concurrency, top.metric) == ("pd-tcp", 16, "itl_p99_ms")
    assert top.better and top.factor == pytest.approx(509.2 / 18.3)
    trade = picks[0].counterpart
    assert (trade.metric, trade.better) == ("output_tok_s_per_gpu", False)       # 2.0× worse beats TTFT's 1.5×
    assert trade.factor == pytest.approx(2.0)


def test_regressions_follow_with_what_they_bought():
    picks = picks_of()
    regressions = [p for p in picks if not p.change.better]
    assert regressions[0].change.metric == "output_tok_s_per_gpu" and regressions[0].change.factor == 2.0
    ttft = next(p for p in regressions if p.change.metric == "ttft_p50_ms")
    assert (ttft.change.config, ttft.change.concurrency) == ("epd", 1)              # 1.8× beats pd-tcp's 1.5×
    assert (ttft.counterpart.metric, ttft.counterpart.better) == ("tpot_p50_ms", True)


def test_one_headline_per_metric_and_small_changes_are_not_headlines():
    picks = picks_of()
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


def test_a_cell_contaminated_in_any_configuration_makes_no_change_as_the_verdict_names_no_winner_there():
    spoilt = SUMMARY.assign(contaminated=[False, False, False, False, True, False])   # pd-tcp at c=16
    found = {(c.config, c.concurrency) for c in changes_vs_baseline(aggregate_trials(spoilt), "aggregated")}
    assert ("epd", 1) in found and not [k for k in found if k[1] == 16]   # nor epd's clean row there
    assert {c.verdict for c in compare(spoilt) if c.concurrency == 16} - {None} == {"contaminated"}
    assert not [p for p in picks_of(spoilt) if p.change.concurrency == 16]
    base_spoilt = SUMMARY.assign(contaminated=[False, False, False, True, False, False])
    assert not [c for c in changes_vs_baseline(aggregate_trials(base_spoilt), "aggregated") if c.concurrency == 16]


def test_a_pd_rdma_vs_pd_tcp_difference_inside_the_noise_is_a_tie_and_never_a_headline():
    from epdbench.analysis.compare import compare
    pd_only = pd.DataFrame([row("pd-tcp", 8, ttft_p50_ms=69.0, ttft_p50_ms_sample_ci95=12.0),
                            row("pd-rdma", 8, ttft_p50_ms=75.0, ttft_p50_ms_sample_ci95=14.0)])
    assert baseline_config(CONFIGS[1:2] + [{"name": "pd-rdma", "topology": "pd"}]) == "pd-tcp"
    assert not changes_vs_baseline(aggregate_trials(pd_only), "pd-tcp")
    assert not picks_of(pd_only, "pd-tcp")
    ttft = next(c for c in compare(pd_only) if c.metric == "ttft_p50_ms")
    assert ttft.verdict == "tie" and ttft.best is None


# c=16: pd-tcp and epd both far below aggregated's TTFT; epd 2 % lower than pd-tcp, inside one trial's 2 % floor
TIED = pd.DataFrame([row("aggregated", 16, ttft_p50_ms=300.0), row("pd-tcp", 16, ttft_p50_ms=100.0),
                     row("epd", 16, ttft_p50_ms=98.0)])


def test_an_improvement_others_beat_inside_the_noise_is_no_headline_and_the_leader_names_the_tie():
    ttft = next(c for c in compare(TIED) if c.metric == "ttft_p50_ms")
    assert ttft.verdict == "tie" and ttft.leaders == ("epd", "pd-tcp")
    found = {c.config for c in changes_vs_baseline(aggregate_trials(TIED), "aggregated") if c.metric == "ttft_p50_ms"}
    assert found == {"pd-tcp", "epd"}                 # both beat the baseline beyond the noise
    picks = [p for p in picks_of(TIED) if p.change.metric == "ttft_p50_ms"]
    assert [(p.change.config, p.tied) for p in picks] == [("epd", (("pd-tcp", 100.0),))]
    sentence = headline_sentence(picks[0])
    assert "to 98.0 ms on epd, a 3.1× reduction, tied within the noise with pd-tcp (100.0 ms)" in sentence, sentence


def test_a_sole_winner_is_a_headline_without_a_tie_and_an_improvement_beaten_beyond_the_noise_is_none():
    apart = TIED.assign(ttft_p50_ms=[300.0, 150.0, 98.0])
    ttft = next(c for c in compare(apart) if c.metric == "ttft_p50_ms")
    assert ttft.verdict == "epd"
    picks = [p for p in picks_of(apart) if p.change.metric == "ttft_p50_ms"]
    assert [(p.change.config, p.tied) for p in picks] == [("epd", ())]
    assert "tied" not in headline_sentence(picks[0])
    pd_tcp = next(c for c in changes_vs_baseline(aggregate_trials(apart), "aggregated")
                  if c.config == "pd-tcp" and c.metric == "ttft_p50_ms")
    assert pd_tcp.better and not stands(pd_tcp, ttft)          # 2× better than aggregated, yet not the best


def test_an_improvement_the_verdict_ties_with_the_baseline_is_no_headline():
    """A configuration beyond the baseline's noise, but the leader tied with the baseline: the Verdict names no
    winner, and the headline does not name one either."""
    ttft = next(c for c in compare(TIED) if c.metric == "ttft_p50_ms")
    change = next(c for c in changes_vs_baseline(aggregate_trials(TIED), "aggregated")
                  if c.config == "epd" and c.metric == "ttft_p50_ms")
    assert stands(change, ttft)
    tied_with_baseline = ttft.__class__(**{**ttft.__dict__, "leaders": ("epd", "aggregated")})
    assert not stands(change, tied_with_baseline) and not stands(change, None)
    regression = next(c for c in changes_vs_baseline(aggregate_trials(SUMMARY), "aggregated") if not c.better)
    assert stands(regression, ttft) and not stands(regression, ttft.__class__(**{**ttft.__dict__,
                                                                                  "verdict": "contaminated"}))
