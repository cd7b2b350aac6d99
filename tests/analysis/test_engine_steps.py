"""analysis/engine_steps.py: per cell the mean of each phase an engine reports on its spans (vLLM's names), joined to
the measured records by trace id; and the compared figures, as a truth table's means give them."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from epdbench.analysis.engine_steps import ENGINE_MEANS, engine_figures, engine_means
from epdbench.otlp import ROLE_ATTR

CELL = {"config": "c", "suite": "s", "workload": "1024/128", "concurrency": 1, "stream": "main", "trial": 0}


def record(trace: str | None, phase: str = "measured", ok: bool = True, **cell) -> dict:
    return {**CELL, **cell, "phase": phase, "ok": ok, "trace": [trace, "span", 0, 1] if trace else None}


def span(trace: str, role: str, queue=0.001, prefill=0.02, decode=0.5, ttft=0.03, tokens=101) -> dict:
    return {"trace_id": trace, "name": "llm_request", "resource": {ROLE_ATTR: role},
            "attributes": {"gen_ai.latency.time_in_queue": queue, "gen_ai.latency.time_in_model_prefill": prefill,
                           "gen_ai.latency.time_in_model_decode": decode, "gen_ai.latency.time_to_first_token": ttft,
                           "gen_ai.usage.completion_tokens": tokens}}


def test_each_cell_gets_the_mean_of_its_measured_requests_phases_in_ms():
    records = pd.DataFrame([record("a"), record("b"), record("w", phase="warmup"), record("f", ok=False),
                            record(None), record("c", concurrency=4)])
    spans = [span("a", "aggregated"), span("b", "aggregated", queue=0.003, prefill=0.04, decode=0.7),
             span("w", "aggregated"), span("f", "aggregated"), span("c", "aggregated", tokens=1),
             {**span("a", "aggregated"), "name": "kv_transfer"}]
    out = engine_means(spans, records).set_index("concurrency")
    one = out.loc[1]
    assert (one["engine_requests"], one["engine_queue_ms_mean"], one["engine_prefill_ms_mean"]) == (2, 2.0, 30.0)
    assert one["engine_decode_ms_mean"] == pytest.approx(600.0)
    assert one["engine_tpot_ms_mean"] == pytest.approx((5.0 + 7.0) / 2)     # per request: decode / (tokens − 1)
    assert out.loc[4, "engine_requests"] == 1 and math.isnan(out.loc[4, "engine_tpot_ms_mean"])


def test_a_disaggregated_request_is_queued_and_prefilled_on_its_prefill_engine_and_decoded_on_its_decode_one():
    records = pd.DataFrame([record("a")])
    spans = [span("a", "encode", prefill=0.5), span("a", "prefill", queue=0.002, prefill=0.03, decode=0.0, tokens=1),
             span("a", "decode", queue=0.004, prefill=0.01, decode=0.9, ttft=0.2, tokens=101)]
    row = engine_means(spans, records).iloc[0]
    assert (row["engine_queue_ms_mean"], row["engine_prefill_ms_mean"]) == (2.0, 30.0)
    assert (row["engine_decode_ms_mean"], row["engine_ttft_ms_mean"]) == (900.0, 200.0)


def test_no_traced_request_gives_an_empty_frame_with_the_columns():
    out = engine_means([], pd.DataFrame([record(None)]))
    assert out.empty and set(ENGINE_MEANS) <= set(out.columns)


def test_the_compared_figures_are_the_prefill_and_the_decode_over_the_tokens_after_the_first():
    table = pd.DataFrame({"engine_prefill_ms_mean": [20.0, None, 5.0], "engine_decode_ms_mean": [1270.0, None, None],
                          "engine_tpot_ms_mean": [99.0, 9.5, None], "output_tokens": [128, 128, 1]})
    out = engine_figures(table)
    assert out["engine_prefill_ms"].tolist()[0] == 20.0 and math.isnan(out["engine_prefill_ms"][1])
    assert out["engine_decode_ms_per_token"].tolist()[:2] == [10.0, 9.5]    # without the decode: the tpot mean
    assert math.isnan(out["engine_decode_ms_per_token"][2])                   # one token: no decode
