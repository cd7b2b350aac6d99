"""analysis/breakdown.py: a traced request's TTFT split into parts from its spans (aggregated, PD, EPD), missing
spans counted, disagreeing ones flagged, per-cell percentiles and the adds-up check."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis.breakdown import (CLOCK_TOLERANCE_MS, ENGINE_PARTS, PARTS, breakdown_metrics, cell_breakdown,
                                         cell_metrics, middle_band, request_parts)
from epdbench.reports.mlflow_names import is_valid_name
from tests.spanrows import engine, frames, record, trace

AGG = {"config": "agg"}
EPD = {"config": "epd", "workload": "1k:560px+624/64"}
TOPOLOGY = {"agg": "aggregated", "pd": "pd", "epd": "epd"}


def parts_row(traces, records, topology=TOPOLOGY) -> pd.Series:
    spans, recs = frames(traces, records)
    out = request_parts(spans, recs, topology)
    assert len(out) == 1
    return out.iloc[0]


def test_aggregated_parts_are_queue_and_prefill_and_sum_to_ttft():
    r = parts_row([trace("a", [engine("aggregated", 0.004, 0.030)], cell=AGG)], [record("a", 50.0, cell=AGG)])
    assert r["status"] == "ok"
    assert r["queue_ms"] == pytest.approx(4.0) and r["prefill_ms"] == pytest.approx(30.0)
    assert r["encode_ms"] == r["kv_transfer_ms"] == r["first_decode_ms"] == 0.0     # not on this path
    assert r["rest_ms"] == pytest.approx(16.0)
    assert sum(r[f"{p}_ms"] for p in PARTS) == pytest.approx(r["ttft_ms"], abs=1e-9)


def test_pd_with_kv_span_counts_decode_queue_as_queue():
    r = parts_row([trace("p", [engine("prefill", 0.002, 0.040), engine("decode", 0.003, 0.008)], kv_s=0.025)],
                  [record("p", 100.0)])
    assert r["status"] == "ok" and r["kv_source"] == "span"
    assert r["queue_ms"] == pytest.approx(5.0)
    assert (r["prefill_ms"], r["kv_transfer_ms"], r["first_decode_ms"]) == pytest.approx((40.0, 25.0, 8.0))
    assert r["rest_ms"] == pytest.approx(100.0 - 5 - 40 - 25 - 8)
    assert sum(r[f"{p}_ms"] for p in PARTS) == pytest.approx(100.0, abs=1e-9)


def test_pd_without_kv_span_takes_the_decode_wait_as_kv_transfer():
    """vLLM with NIXL: the decode is SCHEDULED only once the remote KV arrived, so its queue is the KV wait."""
    r = parts_row([trace("p", [engine("prefill", 0.002, 0.040), engine("decode", 0.030, 0.008)])],
                  [record("p", 100.0)])
    assert r["kv_source"] == "decode-queue"
    assert (r["queue_ms"], r["kv_transfer_ms"]) == pytest.approx((2.0, 30.0))


def test_epd_image_request_has_encode_and_text_request_skips_it():
    legs = [engine("encode", 0.001, 0.012), engine("prefill", 0.002, 0.040), engine("decode", 0.001, 0.008)]
    r = parts_row([trace("e", legs, kv_s=0.010, cell=EPD)], [record("e", 120.0, cell=EPD, image_px=560)])
    assert r["status"] == "ok" and r["encode_source"] == "model"
    assert r["encode_ms"] == pytest.approx(12.0) and r["queue_ms"] == pytest.approx(4.0)
    assert sum(r[f"{p}_ms"] for p in PARTS) == pytest.approx(120.0, abs=1e-9)
    text = parts_row([trace("t", legs[1:], kv_s=0.010, cell=EPD)], [record("t", 90.0, cell=EPD, image_px=0)])
    assert text["status"] == "ok" and text["encode_ms"] == 0.0


def test_encode_span_without_model_time_gives_its_whole_leg_and_says_so():
    legs = [engine("encode", None, None, **{"gen_ai.latency.e2e": 0.020}), engine("prefill", 0.0, 0.040),
            engine("decode", 0.0, 0.008)]
    r = parts_row([trace("e", legs, kv_s=0.010, cell=EPD)], [record("e", 120.0, cell=EPD, image_px=560)])
    assert r["encode_source"] == "span" and r["encode_ms"] == pytest.approx(20.0)


@pytest.mark.parametrize("legs, why", [
    ([engine("decode", 0.001, 0.008)], "no prefill span"),
    ([engine("prefill", 0.001, None), engine("decode", 0.001, 0.008)], "span lacks prefill model"),
])
def test_a_missing_span_or_attribute_is_incomplete_never_zero(legs, why):
    r = parts_row([trace("m", legs)], [record("m", 100.0)])
    assert r["status"] == "incomplete" and r["reason"] == why
    assert all(math.isnan(r[f"{p}_ms"]) for p in PARTS)


def test_epd_image_request_without_encode_span_is_incomplete():
    legs = [engine("prefill", 0.002, 0.040), engine("decode", 0.001, 0.008)]
    r = parts_row([trace("e", legs, cell=EPD)], [record("e", 120.0, cell=EPD, image_px=560)])
    assert r["status"] == "incomplete" and r["reason"] == "no encode span"


def test_engine_parts_beyond_ttft_disagree_and_within_clock_tolerance_are_kept():
    legs = [engine("aggregated", 0.010, 0.040)]                                  # 50 ms in the engine
    within = 50.0 - CLOCK_TOLERANCE_MS / 2
    spans, recs = frames([trace("c", legs, cell=AGG), trace("d", legs, cell=AGG)],
                         [record("c", within, cell=AGG), record("d", 40.0, cell=AGG)])
    out = request_parts(spans, recs, TOPOLOGY).set_index("request_id")
    assert out.loc["c", "status"] == "clock" and out.loc["c", "rest_ms"] == 0.0
    assert out.loc["d", "status"] == "disagree" and "> TTFT 40.000 ms" in out.loc["d", "reason"]
    assert math.isnan(out.loc["d", "rest_ms"])


def test_failed_and_unmatched_requests_are_counted_apart():
    legs = [engine("aggregated", 0.001, 0.010)]
    spans, recs = frames([trace("f", legs, cell=AGG), trace("u", legs, cell=AGG)],
                         [record("f", None, ok=False, cell=AGG)])
    out = request_parts(spans, recs, TOPOLOGY).set_index("request_id")
    assert out.loc["f", "status"] == "failed" and out.loc["u", "status"] == "unmatched"


def _cell(n: int, config: str = "agg"):
    """n aggregated requests: queue i ms, prefill 20 ms, rest 5 ms, plus one untraced record."""
    cell = {"config": config}
    traces = [trace(f"r{i}", [engine("aggregated", i / 1e3, 0.020)], cell=cell) for i in range(n)]
    records = [record(f"r{i}", i + 25.0, cell=cell) for i in range(n)] + [record("untraced", 30.0, cell=cell)]
    traces.append(trace("x", [], cell=cell))                                     # no engine span arrived
    records.append(record("x", 40.0, cell=cell))
    return frames(traces, records)


def test_cell_percentiles_counts_and_adds_up():
    spans, recs = _cell(21)
    row = cell_breakdown(spans, recs, TOPOLOGY).iloc[0]
    queue = np.arange(21.0)
    assert (row["traced"], row["complete"], row["incomplete"], row["untraced"]) == (22, 21, 1, 1)
    assert row["missing"] == "no aggregated span ×1"
    assert row["queue_p50_ms"] == pytest.approx(np.percentile(queue, 50))
    assert row["queue_p95_ms"] == pytest.approx(np.percentile(queue, 95))
    assert row["prefill_p95_ms"] == pytest.approx(20.0) and row["rest_p50_ms"] == pytest.approx(5.0)
    assert row["ttft_p50_ms"] == pytest.approx(np.percentile(queue + 25, 50))
    typical = sum(row[f"typical_{p}_ms"] for p in PARTS)
    assert typical == pytest.approx(row["typical_ttft_ms"], abs=1e-9)            # the bar adds up exactly ...
    assert abs(typical - row["ttft_p50_ms"]) <= row["tolerance_ms"] and row["adds_up"]   # ... to the median


def test_medians_that_do_not_add_are_reported_and_the_typical_request_still_adds_up():
    """Queue and prefill varying against each other: Σ medians misses the median TTFT; the middle band does not."""
    cell = {"config": "agg"}
    traces, records = [], []
    kinds = [(0.060, 0.010), (0.0, 0.070), (0.0, 0.010)]                        # long queue, long prefill, neither
    for i in range(21):
        q, m = kinds[i % 3]
        traces.append(trace(f"r{i}", [engine("aggregated", q, m)], cell=cell))
        records.append(record(f"r{i}", (q + m) * 1e3 + 10.0 + i * 1e-3, cell=cell))
    row = cell_breakdown(*frames(traces, records), TOPOLOGY).iloc[0]
    assert (row["queue_p50_ms"], row["prefill_p50_ms"]) == pytest.approx((0.0, 10.0))
    assert row["medians_gap_ms"] == pytest.approx(-60.0, abs=0.1)             # Σ medians 20 ms, TTFT p50 80 ms
    assert row["adds_up"] and row["typical_queue_ms"] + row["typical_prefill_ms"] == pytest.approx(70.0)


def test_middle_band_is_symmetric_about_the_median():
    kept = pd.DataFrame({"ttft_ms": [5.0, 1.0, 4.0, 2.0, 3.0, 6.0]})
    band = middle_band(kept)
    assert sorted(band["ttft_ms"]) == [3.0, 4.0]
    assert band["ttft_ms"].mean() == np.percentile(kept["ttft_ms"], 50)


def test_ttfts_spread_about_the_median_do_not_add_up():
    """24 requests: the middle six by TTFT are 10, 10, 100, 100, 400, 400 ms: their mean (170) is not the median
    (100), so no one bar stands for the cell, and the cell says so."""
    cell = {"config": "agg"}
    ttfts = [10.0] * 11 + [100.0, 100.0] + [400.0] * 11
    traces = [trace(f"r{i}", [engine("aggregated", 0.0, 0.005)], cell=cell) for i in range(len(ttfts))]
    row = cell_breakdown(*frames(traces, [record(f"r{i}", t, cell=cell) for i, t in enumerate(ttfts)]),
                         TOPOLOGY).iloc[0]
    assert row["typical_n"] == 6 and row["ttft_p50_ms"] == pytest.approx(100.0)
    assert row["typical_ttft_ms"] == pytest.approx(170.0) and not row["adds_up"]


def test_mlflow_keys_valid_and_untraced_cell_logs_none():
    spans, recs = _cell(5)
    metrics = cell_metrics(spans, recs, "aggregated")
    assert {f"ttft_breakdown.{p}.{q}_ms" for p in PARTS for q in ("p50", "p95", "typical")} <= set(metrics)
    assert all(is_valid_name(k) for k in metrics)
    assert metrics["ttft_breakdown.requests"] == 5 and metrics["ttft_breakdown.incomplete"] == 1
    assert metrics["ttft_breakdown.adds_up"] == 1.0
    assert cell_metrics(spans.iloc[:0], recs, "aggregated") == {} and breakdown_metrics(None) == {}


def test_no_spans_no_rows():
    spans, recs = _cell(3)
    assert cell_breakdown(spans.iloc[:0], recs).empty
    assert list(ENGINE_PARTS) == [p for p in PARTS if p != "rest"]
