"""analysis/config_order.py: per cell and metric the configuration that wins on the real engines and on the
simulator, and the order of every pair; a real difference inside the tie band is a tie, never counted."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis import config_order

KEYS = ["config", "suite", "workload", "concurrency", "stream"]
BANDS = {"ttft_p50_ms": 0.05, "output_tok_s": 0.03}
METRICS = list(BANDS)


def cells(figures: dict[str, tuple], workload: str = "1024/128") -> pd.DataFrame:
    """{config: (ttft_p50_ms, output_tok_s)} as one cell of each configuration."""
    rows = [{"config": c, "suite": "text", "workload": workload, "concurrency": 4, "stream": "main",
             "ttft_p50_ms": t, "output_tok_s": o} for c, (t, o) in figures.items()]
    return pd.DataFrame(rows).set_index(KEYS)


# TTFT: aggregated and pd 3 % apart (a tie, inside 5 %), epd 50 % behind; the simulator orders aggregated and pd
# the other way, which is not counted. Throughput: pd wins by 10 % (outside 3 %), the simulator picks aggregated.
REAL = cells({"aggregated": (100.0, 100.0), "pd": (103.0, 110.0), "epd": (150.0, 90.0)})
SIM = cells({"aggregated": (90.0, 105.0), "pd": (80.0, 100.0), "epd": (120.0, 95.0)})


def test_a_winner_inside_the_band_is_a_tie_and_not_counted():
    winners, pairs = config_order.judgements(REAL, SIM, METRICS, BANDS)
    ttft = winners[winners["metric"] == "ttft_p50_ms"].iloc[0]
    assert (ttft["real_best"], ttft["real_next"], ttft["judged"]) == ("aggregated", "pd", False)
    assert ttft["real_apart"] == pytest.approx(0.03)
    assert ttft["sim_best"] == "pd"                               # the simulator disagrees, inside the band
    tok = winners[winners["metric"] == "output_tok_s"].iloc[0]
    assert (tok["real_best"], tok["sim_best"], tok["judged"], tok["agrees"]) == ("pd", "aggregated", True, False)
    assert tok["sim_over_real_best"] == pytest.approx(0.05)
    assert config_order.agreement(winners) == (0, 1, 1)


def test_each_pair_is_judged_only_outside_the_band():
    _, pairs = config_order.judgements(REAL, SIM, METRICS, BANDS)
    judged = {(r["metric"], r["a"], r["b"]): r["agrees"] for r in pairs.to_dict("records") if r["judged"]}
    assert judged == {("ttft_p50_ms", "aggregated", "epd"): True, ("ttft_p50_ms", "pd", "epd"): True,
                      ("output_tok_s", "aggregated", "pd"): False, ("output_tok_s", "aggregated", "epd"): True,
                      ("output_tok_s", "pd", "epd"): True}
    assert config_order.agreement(pairs) == (4, 5, 1)                 # ttft aggregated–pd: a tie


def test_the_printed_lines_give_k_of_n_and_name_every_disagreement():
    lines = config_order.lines(*config_order.judgements(REAL, SIM, METRICS, BANDS))
    assert lines[0] == ("winner agreement: 0 of 1 judgements (0.0%); 1 cell-metrics a tie on the real engines, "
                        "not counted")
    assert lines[1] == ("pairwise-order agreement: 4 of 5 judgements (80.0%); 1 pairs a tie on the real engines, "
                        "not counted")
    assert lines[2] == "per metric: TTFT p50 0/0 winners, 2/2 pairs; out tok/s 0/1 winners, 2/3 pairs"
    assert lines[3:] == [
        "winner disagreements (1):",
        "  text 1024/128 c=4 out tok/s: real pd 10.0% ahead of aggregated; sim aggregated first, 5.0% ahead of pd",
        "pairwise disagreements (1):",
        "  text 1024/128 c=4 out tok/s: real pd 10.0% ahead of aggregated; sim aggregated 5.0% ahead of pd"]


def test_simulated_figures_under_0_1_percent_apart_order_nothing_and_a_lone_configuration_is_not_judged():
    real = pd.concat([cells({"a": (100.0, np.nan), "b": (120.0, np.nan)}), cells({"a": (1.0, 1.0)}, "4096/128")])
    sim = pd.concat([cells({"a": (90.0, 1.0), "b": (90.05, 1.0)}), cells({"a": (1.0, 1.0)}, "4096/128")])
    winners, pairs = config_order.judgements(real, sim, METRICS, BANDS)
    assert len(winners) == len(pairs) == 1                           # no throughput on the real side, one 4k config
    assert (winners.iloc[0]["judged"], winners.iloc[0]["agrees"]) == (True, False)
    assert pd.isna(pairs.iloc[0]["sim_better"]) and not pairs.iloc[0]["agrees"]
    lines = config_order.lines(winners, pairs)
    assert lines[4] == "  text 1024/128 c=4 TTFT p50: real a 20.0% ahead of b; sim a and b even"
    assert lines[6] == "  text 1024/128 c=4 TTFT p50: real a 20.0% ahead of b; sim a and b even"


def test_the_bands_are_the_documented_machine_to_machine_spread():
    assert config_order.band_text() == "TTFT p50 5%, TTFT p99 5%, TPOT p50 5%, ITL p99 6%, out tok/s 3%"
