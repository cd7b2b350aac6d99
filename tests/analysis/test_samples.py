"""analysis/samples.py: the CDF cell, pooled ITL samples, prompt fit and early stops from raw records."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.metrics import summarize
from epdbench.analysis.samples import cdf_cell, early_stops, itl_samples_ms, prompt_fit


def record(config="pd-tcp", workload="4096/32", concurrency=4, stream="main", phase="measured", ok=True,
           prompt=4096, target=4096, out=32, max_tokens=32, offsets=(0, 10_000_000, 25_000_000), trial=0) -> dict:
    return {"config": config, "suite": "fixed", "workload": workload, "concurrency": concurrency, "stream": stream,
            "trial": trial, "phase": phase, "ok": ok, "prompt_tokens": prompt, "target_prompt_tokens": target,
            "output_tokens": out, "max_tokens": max_tokens, "chunk_offsets_ns": list(offsets),
            "chunk_tokens": [1] * len(offsets), "ttft_ms": 5.0, "e2e_ms": 30.0, "done_ms": 30.0, "send_ns": 0,
            "scheduled_ns": 0}


def test_cdf_cell_is_the_longest_shape_at_the_highest_concurrency():
    records = pd.DataFrame([record(workload="512/32", concurrency=8, prompt=512, target=512),
                            record(workload="8192/32", concurrency=8, prompt=8192, target=8192),
                            record(workload="8192/32", concurrency=1, prompt=8192, target=8192)])
    assert cdf_cell(summarize(records), "fixed") == ("fixed", "8192/32", 8, "main")
    assert cdf_cell(summarize(records), "mm") is None


def test_itl_samples_pool_measured_successful_requests_of_every_trial():
    records = pd.DataFrame([record(), record(trial=1, offsets=(0, 5_000_000)), record(phase="warmup"),
                            record(ok=False), record(config="aggregated", offsets=(0, 40_000_000))])
    samples = itl_samples_ms(records, ("fixed", "4096/32", 4, "main"))
    assert samples == {"pd-tcp": [10.0, 15.0, 5.0], "aggregated": [40.0]}
    summary = summarize(records).set_index(["config", "trial"])
    assert summary.loc[("pd-tcp", 0), "n_itl_samples"] + summary.loc[("pd-tcp", 1), "n_itl_samples"] == 3


def test_prompt_fit_and_ranged_cells():
    records = pd.DataFrame([record(prompt=4100), record(prompt=4090),
                            record(workload="1024-2048/32", prompt=1500, target=1500),
                            record(workload="1024-2048/32", prompt=1900, target=1900)])
    fit = prompt_fit(records)
    assert (fit.requests, fit.max_abs_tokens) == (4, 6) and abs(fit.max_rel - 6 / 4096) < 1e-12
    assert fit.ranged_cells == [("fixed", "1024-2048/32", 1500, 1900)]
    assert prompt_fit(pd.DataFrame()) is None


def test_early_stops_are_counted_per_cell():
    records = pd.DataFrame([record(out=32), record(out=20), record(config="epd", out=31), record(phase="warmup", out=1)])
    stops = early_stops(records)
    assert (stops.requests, stops.stopped_early) == (3, 2)
    assert stops.where == [("pd-tcp", "fixed", "4096/32", 4, 1, 2), ("epd", "fixed", "4096/32", 4, 1, 1)]
