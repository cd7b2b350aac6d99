"""benchmarks/simulator/truth_from_run.py: a compare run's results folder (summary.csv, spec.yaml, evidence/<config>/
stages.json) written as a truth table, every configuration's cells and a mixed window's streams; the GPU lane's kept
folders (benchmarks/gpu/gpu_local_lane.py: lane.json, records.parquet, stages.json) as one table of three
configurations, its client figures the product's summary of the records; bad input is one line and exit 2."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
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


DATA = Path(__file__).parent.parent / "benchmarks" / "data"
# benchmarks/gpu/gpu_local_lane.py's folders kept from the H100 GPU lane, each one configuration's files laid flat
LANES = [DATA / "h100-2026-12-07" / "lane-aggregated", DATA / "h100-2026-12-06" / "lane-pd-nixl-tcp",
         DATA / "h100-2026-12-06" / "lane-epd"]
LANE_ARGS = ["--gpu", "NVIDIA H100 80GB HBM3", "--vllm-version", "0.26.0"]


def test_the_kept_gpu_lanes_become_the_kept_one_gpu_table(tmp_path, capsys):
    out = tmp_path / "truth.csv"
    script = load_benchmark("simulator/truth_from_run")
    assert script.main([*map(str, LANES), *LANE_ARGS, "--out", str(out)]) == 0
    assert "12 rows (3 configurations, 4 cells)" in capsys.readouterr().out
    table = pd.read_csv(out)
    truth.check(table)
    pd.testing.assert_frame_equal(table, pd.read_csv(DATA / "h100-2026-12-07" / "truth_one_gpu_lanes.csv"))
    # the client figures are the product's summary of the records: what the lane printed for each cell as it ran
    for lane in LANES:
        for result in json.loads((lane / "lane.json").read_text()):
            for cell in result["cells"]:
                suite, workload, conc, _ = cell["cell"].split("|")
                row = table[(table["config"] == result["config"]) & (table["suite"] == suite)
                            & (table["workload"] == workload) & (table["concurrency"] == int(conc[1:]))]
                assert len(row) == 1
                for column in ("ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_p99_ms", "output_tok_s",
                               "energy_j_per_token"):
                    assert row[column].iloc[0] == pytest.approx(cell[column], abs=1e-3), (cell["cell"], column)
    assert (table["n_measured"] == 8).all() and (table["requests_ok"] == 8).all()
    # cold: no prefix-cache hit, no image from the encoder cache; the engine histograms' per-suite deltas are not in
    # these stages.json (kept before the evidence took them): those columns are empty, not 0
    assert (table["engine_prefix_hit_pct"] == 0).all()
    assert (table[table["suite"] == "image"]["engine_mm_hit_pct"] == 0).all()
    assert table["engine_prefill_ms_mean"].isna().all()


def test_a_lane_folder_it_cannot_use_is_one_line_and_exit_2(tmp_path, capsys):
    script = load_benchmark("simulator/truth_from_run")
    out = ["--out", str(tmp_path / "t.csv")]
    broken = tmp_path / "lane"
    shutil.copytree(LANES[0], broken)
    (broken / "records.parquet").unlink()
    assert script.main([str(broken), *LANE_ARGS, *out]) == 2
    assert capsys.readouterr().err.strip().endswith("lane.json but no records.parquet (a gpu_local_lane.py folder has "
                                                    "lane.json, records.parquet and spec.yaml)")
    assert script.main([str(LANES[0]), str(LANES[0]), *LANE_ARGS, *out]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "configuration aggregated is in an earlier folder too" in err
    shutil.copytree(LANES[1], tmp_path / "no-stages")
    (tmp_path / "no-stages" / "stages.json").unlink()
    assert script.main([str(tmp_path / "no-stages"), *LANE_ARGS, *out]) == 2
    assert "no evidence/<config>/stages.json nor stages.json" in capsys.readouterr().err
    (tmp_path / "no-stages" / "lane.json").write_text("{}")
    assert script.main([str(tmp_path / "no-stages"), *LANE_ARGS, *out]) == 2
    assert "lane.json: not a list of configurations' results" in capsys.readouterr().err
    assert not (tmp_path / "t.csv").exists()
