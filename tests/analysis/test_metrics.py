"""analysis/metrics.py: per-cell statistics from hand-built request records (DESIGN.md definitions)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis.metrics import SUMMARY_COLUMNS, percentile, summarize, summarize_cell

MS = 1_000_000  # ns


def rec(offsets_ms=(10, 20, 30), *, phase="measured", ok=True, send_ms=0.0, output_tokens=None, done_ms=None,
        chunk_tokens=None, config="agg", concurrency=1, lag_ms=0.0, prompt_tokens=100):
    """One request record as tasks/loadgen writes it: chunk offsets relative to send."""
    offs = [int(o * MS) for o in offsets_ms]
    n_out = output_tokens if output_tokens is not None else (len(offs) if ok else None)
    send_ns = int(send_ms * MS)
    return {
        "config": config, "suite": "fixed", "workload": "512/64", "concurrency": concurrency, "stream": "main",
        "trial": 0, "phase": phase, "ok": ok,
        "ttft_ms": offsets_ms[0] if offs else None, "e2e_ms": offsets_ms[-1] if offs else None,
        "done_ms": done_ms if done_ms is not None else (offsets_ms[-1] + 1 if offs else 5.0),
        "output_tokens": n_out, "send_ns": send_ns, "scheduled_ns": send_ns - int(lag_ms * MS),
        "chunk_offsets_ns": offs, "chunk_tokens": chunk_tokens if chunk_tokens is not None else [1] * len(offs),
        "prompt_tokens": prompt_tokens if ok else None, "target_prompt_tokens": 100,
    }


def cell(*records) -> dict:
    return summarize_cell(pd.DataFrame(list(records)))


def test_warmup_rows_are_excluded():
    s = cell(rec((1000, 1010), phase="warmup"), rec((10, 20)), rec((30, 40), send_ms=1))
    assert s["requests_total"] == 2 and s["requests_ok"] == 2
    assert s["ttft_p99_ms"] == pytest.approx(np.percentile([10, 30], 99))
    assert s["itl_max_ms"] == pytest.approx(10.0)


def test_ttft_percentiles():
    ttfts = [10.0 * (i + 1) for i in range(10)]                      # 10 … 100 ms
    s = cell(*(rec((t, t + 5)) for t in ttfts))
    assert s["ttft_p50_ms"] == pytest.approx(55.0)
    assert s["ttft_p95_ms"] == pytest.approx(95.5)
    assert s["ttft_p99_ms"] == pytest.approx(99.1)


def test_itl_is_pooled_over_requests_not_averaged_per_request():
    # request 1 gaps: 10, 10, 10, 70 (mean 25); request 2 gap: 20
    s = cell(rec((10, 20, 30, 40, 110)), rec((5, 25)))
    pooled = [10, 10, 10, 70, 20]
    assert s["itl_max_ms"] == pytest.approx(70.0)
    assert s["itl_p99_ms"] == pytest.approx(np.percentile(pooled, 99))


def test_itl_of_single_chunk_requests_is_none():
    s = cell(rec((10,)), rec((12,)))
    assert s["requests_ok"] == 2
    assert s["itl_p99_ms"] is None and s["itl_max_ms"] is None


def test_tpot_is_decode_time_per_output_token_after_the_first():
    # (100 − 20) / (5 − 1) = 20 ms ; (150 − 30) / (4 − 1) = 40 ms → p50 30 ms
    s = cell(rec((20, 100), output_tokens=5), rec((30, 150), output_tokens=4))
    assert s["tpot_p50_ms"] == pytest.approx(30.0)


def test_tpot_undefined_for_one_token_outputs():
    s = cell(rec((20,), output_tokens=1))
    assert s["tpot_p50_ms"] is None
    assert s["ttft_p50_ms"] == pytest.approx(20.0)


def test_throughput_over_first_send_to_last_completion():
    # sends at 0 s and 1 s; completions at 2 s and 1.5 s → window 2 s; 10 + 30 output tokens
    s = cell(rec((100, 200), output_tokens=10, done_ms=2000), rec((100, 400), send_ms=1000, output_tokens=30,
                                                                 done_ms=500))
    assert s["window_s"] == pytest.approx(2.0)
    assert s["output_tokens"] == 40
    assert s["output_tok_s"] == pytest.approx(20.0)
    assert s["req_s"] == pytest.approx(1.0)


def test_failed_requests_are_counted_and_excluded_from_statistics():
    good = [rec((10, 20, 30), send_ms=i) for i in range(3)]
    # a stream cut after a slow first chunk: it has timing data, which must not leak into the stats
    cut = rec((999, 2999), ok=False, output_tokens=50, send_ms=1)
    refused = rec((), ok=False, send_ms=2)
    s = cell(*good, cut, refused)
    assert (s["requests_total"], s["requests_ok"], s["requests_failed"]) == (5, 3, 2)
    assert s["ttft_p99_ms"] == pytest.approx(10.0)
    assert s["itl_max_ms"] == pytest.approx(10.0)
    assert s["output_tokens"] == 9
    assert s["prompt_tokens_mean"] == pytest.approx(100.0)


def test_cell_without_successful_request_gives_none_not_zero():
    s = cell(rec((), ok=False), rec((), ok=False, send_ms=3))
    assert (s["requests_ok"], s["requests_failed"]) == (0, 2)
    for key in ("ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "itl_max_ms",
                "output_tok_s", "req_s", "output_tokens", "prompt_tokens_mean"):
        assert s[key] is None, key


def test_multi_token_chunks_and_client_lag_are_visible():
    s = cell(rec((10, 20, 30), chunk_tokens=[1, 3, 1], output_tokens=5, lag_ms=2.0),
             rec((10, 20), chunk_tokens=[2, 2], output_tokens=4, send_ms=1, lag_ms=0.0))
    assert s["chunks_multi_token"] == 3
    assert s["client_lag_p99_ms"] == pytest.approx(np.percentile([2.0, 0.0], 99))


def test_percentile_ignores_none_and_nan():
    assert percentile([None, float("nan"), 1.0, 3.0], 50) == pytest.approx(2.0)
    assert percentile([None, float("nan")], 50) is None


def test_summarize_one_row_per_cell_with_summary_columns():
    records = pd.DataFrame([
        rec((1000, 2000), phase="warmup", config="agg"),
        rec((10, 20), config="agg"), rec((12, 22), config="agg", send_ms=1),
        rec((30, 40), config="agg", concurrency=8),
        rec((5, 15), config="pd-rdma"),
        rec((), ok=False, config="pd-tcp"),
    ])
    out = summarize(records)
    assert list(out.columns) == SUMMARY_COLUMNS
    assert len(out) == 4
    keys = ["config", "suite", "workload", "concurrency", "stream", "trial"]
    assert not out.duplicated(keys).any()
    agg1 = out[(out.config == "agg") & (out.concurrency == 1)].iloc[0]
    expected = summarize_cell(records[(records.config == "agg") & (records.concurrency == 1)])
    for k, v in expected.items():
        assert agg1[k] == pytest.approx(v), k
    failed = out[out.config == "pd-tcp"].iloc[0]
    assert failed["requests_ok"] == 0 and failed["requests_failed"] == 1
    assert failed["ttft_p50_ms"] is None and failed["itl_p99_ms"] is None and failed["output_tok_s"] is None


def test_summarize_of_no_records_is_empty_with_columns():
    out = summarize(pd.DataFrame(columns=["config"]))
    assert out.empty and list(out.columns) == SUMMARY_COLUMNS


def test_tokens_read_together_are_counted_and_contaminate_an_arrival_timed_cell():
    from epdbench.analysis.noise import is_contaminated
    spaced = [rec((10, 20, 30, 40, 50)) for _ in range(9)]
    bunched = rec((10, 20, 20, 20, 50))                        # two tokens read with the one before
    s = cell(*spaced, bunched)
    assert s["coalesced_share"] == pytest.approx(2 / 40)
    assert not is_contaminated({**s, "timing": "arrival"})     # 5%: at the limit, not over it
    s = cell(*spaced[:4], bunched)
    assert s["coalesced_share"] == pytest.approx(2 / 20)
    assert is_contaminated({**s, "timing": "arrival"})
    assert not is_contaminated({**s, "timing": "modelled"})    # timed by the engine's stamps, not by arrival
    assert cell(rec((10,)))["coalesced_share"] is None          # one chunk: no gap to judge
