"""benchmarks/simulator/truth_from_run.py: a compare run's results folder (summary.csv, spec.yaml, evidence/<config>/
stages.json) written as a truth table, every configuration's cells and a mixed window's streams; bad input is one
line and exit 2."""
from __future__ import annotations

import json

import pandas as pd
import yaml

from epdbench.analysis import truth
from tests.benchmark_scripts import load_benchmark

SUITE_DELTAS = {"server": {"engine_prefill_s_sum": 0.9, "engine_prefill_s_count": 6, "prefix_cache_queries": 6000,
                           "prefix_cache_hits": 4800, "mm_cache_queries": 6, "mm_cache_hits": 5}}


def results(tmp_path, kind: str = "local"):
    run = tmp_path / "run"
    (run / "evidence" / "aggregated").mkdir(parents=True)
    (run / "spec.yaml").write_text(yaml.safe_dump({"name": "gpu-qwen25vl", "target": {"kind": kind},
                                                   "model": {"name": "Qwen/Qwen2.5-VL-7B-Instruct"}}))
    base = {"config": "aggregated", "trial": 0, "requests_ok": 12, "requests_total": 12, "ttft_p50_ms": 80.0,
            "ttft_p99_ms": 120.0, "tpot_p50_ms": 7.0, "itl_p99_ms": 30.0, "output_tok_s": 400.0, "req_s": 3.0,
            "prompt_tokens_mean": 4500.0}
    pd.DataFrame([{**base, "suite": "text-with-images", "workload": "1024/256", "concurrency": 4, "stream": "text"},
                  {**base, "suite": "text-with-images", "workload": "1792px+400/64", "concurrency": 2,
                   "stream": "images"},
                  {**base, "suite": "mm-reuse", "workload": "reuse:1792px+400/64", "concurrency": 4,
                   "stream": "main"}]).to_csv(run / "summary.csv", index=False)
    (run / "evidence" / "aggregated" / "stages.json").write_text(json.dumps(
        {"suites": {"mm-reuse": {"metrics_delta": SUITE_DELTAS}, "text-with-images": {"metrics_delta": {}}}}))
    return run


def test_a_local_run_becomes_a_truth_table(tmp_path, capsys):
    out = tmp_path / "truth.csv"
    script = load_benchmark("simulator/truth_from_run")
    assert script.main([str(results(tmp_path)), "--gpu", "NVIDIA H100 80GB HBM3", "--vllm-version", "0.26.0",
                        "--out", str(out)]) == 0
    table = pd.read_csv(out)
    truth.check(table)
    assert list(zip(table["suite"], table["stream"])) == [("text-with-images", "text"),
                                                          ("text-with-images", "images"), ("mm-reuse", "main")]
    reuse = table.iloc[2]
    assert reuse["engine_prefill_ms_mean"] == 150.0 and reuse["engine_prefix_hit_pct"] == 80.0
    assert round(reuse["engine_mm_hit_pct"], 1) == 83.3 and reuse["model"] == "Qwen/Qwen2.5-VL-7B-Instruct"
    assert table.iloc[0]["engine_prefill_ms_mean"] != table.iloc[0]["engine_prefill_ms_mean"]     # unknown: empty
    assert "3 rows (1 configurations, 3 cells)" in capsys.readouterr().out


def test_a_simulator_run_or_a_folder_without_evidence_is_one_line_and_exit_2(tmp_path, capsys):
    script = load_benchmark("simulator/truth_from_run")
    args = ["--gpu", "g", "--vllm-version", "v", "--out", str(tmp_path / "t.csv")]
    assert script.main([str(results(tmp_path, kind="sim")), *args]) == 2
    assert "a run on target sim, not on real engines" in capsys.readouterr().err
    assert script.main([str(tmp_path / "nowhere"), *args]) == 2
    assert "not a compare results folder" in capsys.readouterr().err
