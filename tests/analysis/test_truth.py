"""analysis/truth.py: the truth table's contract — its labels are the spec's workload labels, a row it cannot read
is named, failed cells and non-positive figures are left out and said — and the simulator's summary written in
it."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from epdbench.analysis import truth
from epdbench.specs.models import load_spec
from epdbench.specs.workload import plan_cells


def row(**changes) -> dict:
    base = {"gpu": "NVIDIA H200", "vllm_version": "0.26.0", "model": "m", "tool": "epdbench", "config": "aggregated",
            "suite": "text", "workload": "1024/128", "input_tokens": 1024, "image_px": 0, "output_tokens": 128,
            "concurrency": 1, "n_measured": 8, "requests_ok": 8, "prompt_tokens_mean": 1024.0, "ttft_p50_ms": 30.0,
            "ttft_p99_ms": 31.0, "tpot_p50_ms": 7.0, "itl_p99_ms": 7.5, "output_tok_s": 120.0, "req_s": 0.9,
            "engine_queue_ms_mean": 0.1, "engine_prefill_ms_mean": 25.0, "engine_decode_ms_mean": 889.0,
            "engine_ttft_ms_mean": 28.0, "engine_tpot_ms_mean": 7.0}
    return {**base, **changes}


def test_the_workload_labels_are_the_specs():
    labels = {cell.workload for cell in plan_cells(load_spec("vllm-truth"))}
    assert labels == {"1024/128", "4096/128", "8192/128", "560px+400/128", "1260px+400/128", "1792px+400/128",
                      "reuse:1792px+400/128"}
    assert {truth.parse_workload(w) for w in labels} == {(0, 1024, 128), (0, 4096, 128), (0, 8192, 128),
                                                          (560, 400, 128), (1260, 400, 128), (1792, 400, 128)}
    assert truth.parse_workload("4k:1260px+2071/128") == (1260, 2071, 128)     # a multimodal cell: its name leads
    assert truth.parse_workload("1024/128@4/s") is None and truth.parse_workload("100-200/64") is None


def test_a_table_of_the_contract_passes_and_a_blank_image_edge_is_no_image():
    table = pd.DataFrame([row(), row(image_px=None, concurrency=8)])
    truth.check(table)
    assert truth.gpu_of(table) == "NVIDIA H200"


@pytest.mark.parametrize("changes, expected", [
    ({"concurrency": 4.5}, "row 1 (gpu NVIDIA H200, tool epdbench, config aggregated, suite text, workload "
                           "1024/128): concurrency '4.5' is not a whole number"),
    ({"ttft_p50_ms": "30 ms"}, "ttft_p50_ms '30 ms' is not a plain number"),
    ({"tool": ""}, "has no tool: every row needs gpu, tool, config, suite, workload, concurrency"),
    ({"image_px": 560}, "row 1 (tool epdbench, workload 1024/128, concurrency 1): image_px, input_tokens, "
                        "output_tokens (560, 1024, 128) are not the workload's (0, 1024, 128)"),
])
def test_a_row_it_cannot_read_is_named(changes, expected):
    with pytest.raises(truth.TruthError) as e:
        truth.check(pd.DataFrame([row(), row(**changes)]).iloc[1:].reset_index(drop=True))
    assert expected in str(e.value)


def test_failed_cells_and_figures_that_are_not_positive_are_left_out_and_said():
    table = pd.DataFrame([row(), row(workload="4096/128", input_tokens=4096, requests_ok=7),
                          row(concurrency=8, engine_queue_ms_mean=0.0, engine_prefill_ms_mean=0.0)])
    notes: list[str] = []
    kept = truth.usable(table, notes)
    assert len(kept) == 2 and kept["requests_ok"].tolist() == [8, 8]
    assert notes == ["1 row with failed requests left out (their figures count only the requests that succeeded; "
                     "the simulator serves every request)"]
    cells = truth.cells(kept, notes)
    assert "1 figure not positive left out (engine_prefill_ms 1)" in notes[1]
    one = cells.loc[("aggregated", "text", "1024/128", 1, "main")]
    assert one["engine_decode_ms_per_token"] == 7.0 and one["engine_prefill_ms"] == 25.0
    assert math.isnan(cells.loc[("aggregated", "text", "1024/128", 8, "main"), "engine_prefill_ms"])


def test_rows_measured_on_a_warm_cache_are_left_out_and_said():
    table = pd.DataFrame([row(engine_prefix_hit_pct=0.0, engine_mm_hit_pct=None),
                          row(concurrency=8, engine_prefix_hit_pct=1.9),                   # a shared template block
                          row(concurrency=32, engine_prefix_hit_pct=52.1),                 # repeated prompts
                          row(workload="560px+400/128", input_tokens=400, image_px=560, engine_prefix_hit_pct=0.0,
                              engine_mm_hit_pct=20.0),                                    # an image encoded before
                          row(workload="4096/128", input_tokens=4096)])                   # not measured: kept
    truth.check(table)
    notes: list[str] = []
    kept = truth.usable(table, notes)
    assert kept["concurrency"].tolist() == [1, 8, 1] and kept["workload"].tolist()[-1] == "4096/128"
    assert notes == ["2 rows measured on a warm cache left out (prefix hits up to 52 % of their prompt tokens, or "
                     "images from the encoder cache): the simulator computes every prompt"]


def test_rows_of_one_cell_are_averaged_and_another_tools_rows_are_left_to_it():
    table = pd.DataFrame([row(), row(ttft_p50_ms=40.0), row(tool="vllm-bench", ttft_p50_ms=99.0)])
    cells = truth.cells(truth.for_tool(table, "epdbench"))
    assert cells["ttft_p50_ms"].tolist() == [35.0]
    with pytest.raises(truth.TruthError, match="no row of tool 'other': the table has epdbench, vllm-bench"):
        truth.for_tool(table, "other")


def test_the_simulators_summary_written_as_a_truth_table_reads_back_as_the_same_cells():
    summary = pd.DataFrame([{"config": "aggregated", "suite": "image", "workload": "560px+400/128",
                             "concurrency": 4, "stream": "main", "trial": 0, "requests_total": 16, "requests_ok": 16,
                             "prompt_tokens_mean": 823.0, "ttft_p50_ms": 50.0, "ttft_p99_ms": 60.0,
                             "tpot_p50_ms": 9.0, "itl_p99_ms": None, "output_tok_s": 400.0, "req_s": 3.1,
                             **{m: 2.0 for m in truth.ENGINE_MEANS}},
                            {"config": "aggregated", "suite": "mixed", "workload": "100-200/64", "concurrency": 2,
                             "stream": "burst", "trial": 0}])
    table = truth.as_truth_table(summary, "NVIDIA H200", "m")
    assert list(table.columns) == truth.COLUMNS and len(table) == 1          # a mixed stream is no fixed cell
    assert table.iloc[0][["image_px", "input_tokens", "output_tokens", "n_measured"]].tolist() == [560, 400, 128, 16]
    truth.check(table)
    cells = truth.cells(table)
    assert cells.index.tolist() == [("aggregated", "image", "560px+400/128", 4, "main")]
    assert cells.iloc[0]["engine_decode_ms_per_token"] == pytest.approx(2.0 / 127)
    assert math.isnan(cells.iloc[0]["itl_p99_ms"])


@pytest.mark.parametrize("name", ["vllm_truth_h100.csv", "h100-2026-12-06/vllm_truth.csv"])
def test_the_kept_h100_tables_are_whole_cold_and_cover_every_cell_of_the_spec(name):
    from pathlib import Path
    frame = pd.read_csv(Path(__file__).parents[2] / "benchmarks" / "data" / name)
    truth.check(frame)                                         # raises on anything it cannot use
    # every cold cell of the spec: the reused-image cell came after these tables
    want = {(c.suite, c.workload, c.concurrency) for c in plan_cells(load_spec("vllm-truth")) if c.suite != "mm-reuse"}
    for tool in sorted(set(frame["tool"])):
        rows = truth.for_tool(frame, tool)
        notes: list[str] = []
        kept = truth.usable(rows, notes)
        # every measured request served, nothing served from the prefix or encoder cache: no row left out
        assert len(kept) == len(rows) == len(want) and notes == []
        assert set(zip(kept["suite"], kept["workload"], kept["concurrency"])) == want
    assert set(frame["gpu"]) == {"NVIDIA H100 80GB HBM3"}
