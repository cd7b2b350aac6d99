"""analysis/compare.py: matched comparison, best/worst/ratio, wins."""
from __future__ import annotations

import pandas as pd
import pytest

from epdbench.analysis.compare import compare, ratio_phrase, wins


def summary(rows: list[dict]) -> pd.DataFrame:
    base = {"suite": "fixed", "workload": "4096/64", "concurrency": 8, "stream": "main", "trial": 0}
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
