"""analysis/sim_vs_real.py: sim / real per cell and metric, the median error and the median ratio per metric and over
all figures, past the median the 90th percentile and the worst cell, cells whose prompts differ named, and the
tables printed (a table of several configurations naming each cell's)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis import sim_vs_real
from epdbench.specs.models import load_spec

KEYS = ["config", "suite", "workload", "concurrency", "stream"]


def cells(rows: list[tuple]) -> pd.DataFrame:
    """(workload, concurrency, ttft_p50_ms, engine_prefill_ms, prompt_tokens_mean) rows as cells."""
    frame = pd.DataFrame([{"config": "aggregated", "suite": "text", "workload": w, "concurrency": c, "stream": "main",
                           "ttft_p50_ms": t, "engine_prefill_ms": p, "prompt_tokens_mean": n}
                          for w, c, t, p, n in rows])
    return frame.set_index(KEYS)


REAL = cells([("1024/128", 1, 40.0, 20.0, 1024), ("1024/128", 8, 100.0, 50.0, 1024), ("4096/128", 1, 80.0, None, 4096)])
SIM = cells([("1024/128", 1, 20.0, 30.0, 1024), ("1024/128", 8, 100.0, 0.0, 1100), ("4096/128", 1, 120.0, 60.0, 4096),
             ("8192/128", 1, 1.0, 1.0, 8192)])


def test_ratios_are_sim_over_real_on_the_real_cells_where_both_are_positive():
    r = sim_vs_real.ratios(REAL, SIM, ["ttft_p50_ms", "engine_prefill_ms"])
    assert r.index.equals(REAL.index)
    assert r["ttft_p50_ms"].tolist() == [0.5, 1.0, 1.5]
    assert r["engine_prefill_ms"].tolist()[0] == 1.5 and r["engine_prefill_ms"][1:].isna().all()


def test_the_summary_gives_how_far_and_which_way_per_metric_and_over_all_figures():
    s = sim_vs_real.summary(sim_vs_real.ratios(REAL, SIM, ["ttft_p50_ms", "engine_prefill_ms"]))
    medians = ["cells", "median_error", "median_ratio"]
    assert s.loc["ttft_p50_ms", medians].tolist() == [3, 0.5, 1.0]   # |0.5−1|, 0, 0.5 → 0.5; ratios 0.5, 1, 1.5 → 1
    assert s.loc["engine_prefill_ms", medians].tolist() == [1, 0.5, 1.5]
    assert s.loc[sim_vs_real.OVERALL, medians].tolist() == [4, 0.5, 1.25]     # 0.5, 1, 1.5, 1.5 pooled
    empty = sim_vs_real.summary(pd.DataFrame({"m": [np.nan]}))
    assert empty.loc["m", "cells"] == 0 and math.isnan(empty.loc["m", "median_error"])
    assert empty.loc["m", "worst_cell"] is None and math.isnan(empty.loc["m", "p90_error"])


def test_past_the_median_the_p90_and_the_worst_cell_per_metric_and_over_all_figures():
    s = sim_vs_real.summary(sim_vs_real.ratios(REAL, SIM, ["ttft_p50_ms", "engine_prefill_ms"]))
    # errors 0.5, 0, 0.5 sorted 0, 0.5, 0.5: position 0.9 × 2 = 1.8 → 0.5; the first of the two worst
    assert s.loc["ttft_p50_ms", ["p90_error", "worst_ratio"]].tolist() == [0.5, 0.5]
    assert s.loc["ttft_p50_ms", "worst_cell"] == REAL.index[0]
    assert s.loc["ttft_p50_ms", "worst_metric"] == "ttft_p50_ms"
    overall = s.loc[sim_vs_real.OVERALL]                     # 0.5, 0, 0.5, 0.5 pooled: the first of the largest
    assert (overall["p90_error"], overall["worst_cell"], overall["worst_metric"]) == (0.5, REAL.index[0],
                                                                                       "ttft_p50_ms")
    lines = sim_vs_real.tail_lines(s)
    assert lines[0].split() == ["metric", "cells", "p90", "error", "worst", "cell", "(sim/real)"]
    assert lines[1].split() == ["ttft_p50_ms", "3", "50.0%", "text", "1024/128", "c=1", "(0.500)"]
    assert lines[-1].split() == ["overall", "4", "50.0%", "text", "1024/128", "c=1", "TTFT", "p50", "(0.500)"]
    after = sim_vs_real.summary(sim_vs_real.ratios(REAL, REAL, ["ttft_p50_ms", "engine_prefill_ms"]))
    both = sim_vs_real.tail_lines(s, after)
    assert both[0].split()[:6] == ["metric", "cells", "p90", "before", "p90", "after"]
    assert both[1].split() == ["ttft_p50_ms", "3", "50.0%", "0.0%", "text", "1024/128", "c=1", "(0.500)", "text",
                               "1024/128", "c=1", "(1.000)"]


def test_cells_whose_prompts_differ_are_named():
    assert sim_vs_real.prompt_mismatches(REAL, SIM) == ["text 1024/128 c=8: sim 1100, real 1024 tokens"]
    assert sim_vs_real.prompt_mismatches(REAL, SIM, tolerance=0.1) == []


def test_the_tables_show_each_figure_and_before_and_after_side_by_side():
    before = sim_vs_real.ratios(REAL, SIM, ["ttft_p50_ms", "engine_prefill_ms"])
    after = before.fillna(1.0) * 0 + 1
    lines = sim_vs_real.cell_lines(before)
    assert lines[0].split() == ["cell", "TTFT", "p50", "eng", "prefill"]
    assert lines[1].split() == ["text", "1024/128", "c=1", "0.500", "1.500"]
    assert lines[2].split()[-1] == "—"
    assert sim_vs_real.cell_lines(before, after)[1].split()[-2:] == ["0.500→1.000", "1.500→1.000"]
    table = sim_vs_real.summary_lines(sim_vs_real.summary(before), sim_vs_real.summary(after))
    assert table[0].split() == ["metric", "cells", "error", "before", "sim/real", "before", "error", "after",
                                "sim/real", "after"]
    assert table[-1].split() == ["overall", "4", "50.0%", "1.250", "0.0%", "1.000"]


def test_a_table_of_several_configurations_names_each_cells_configuration():
    real = pd.concat([REAL, REAL.rename(index={"aggregated": "epd"}, level="config")])
    sim = pd.concat([SIM, SIM.rename(index={"aggregated": "epd"}, level="config")])
    ratio = sim_vs_real.ratios(real, sim, ["ttft_p50_ms"])
    assert sim_vs_real.several_configs(real) and not sim_vs_real.several_configs(REAL)
    assert sim_vs_real.cell_lines(ratio)[4].split()[:4] == ["epd", "text", "1024/128", "c=1"]
    assert sim_vs_real.tail_lines(sim_vs_real.summary(ratio), configs=True)[1].split()[3:5] == ["aggregated",
                                                                                                 "text"]
    assert sim_vs_real.prompt_mismatches(real, sim)[1] == "epd text 1024/128 c=8: sim 1100, real 1024 tokens"


def test_cells_are_shown_in_the_order_the_spec_runs_them():
    spec = load_spec("vllm-truth")
    shuffled = pd.concat([REAL.iloc[[2]], REAL.iloc[[1]], REAL.iloc[[0]]])
    ordered = sim_vs_real.in_plan_order(shuffled, spec)
    assert [(k[2], k[3]) for k in ordered.index] == [("1024/128", 1), ("1024/128", 8), ("4096/128", 1)]


@pytest.mark.parametrize("value, shown", [(float("nan"), "—"), (0.98765, "0.988")])
def test_a_figure_is_shown_to_three_decimals_or_as_a_dash(value, shown):
    assert sim_vs_real.cell_lines(pd.DataFrame({"m": [value]}, index=REAL.index[:1]))[1].split()[-1] == shown
