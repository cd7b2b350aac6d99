"""benchmarks/simulator/gpu_ops_vs_model.py: every operator class of the checked-in H200 CSV is set beside the cost
model under both its operator laws, the model's figure for a case is the cost model's own, and a bad CSV ends in one
line and exit 2."""
import math

import pytest

from epdbench.physics.costmodel import PrefillChunk
from epdbench.physics.gpu_ops import read_ops_csv
from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("simulator/gpu_ops_vs_model")


@pytest.fixture(scope="module")
def every(bench):
    return {laws: bench.comparisons(read_ops_csv(bench.CSV), True, laws) for laws in bench.LAWS}


def test_every_class_is_compared_and_every_ratio_is_a_finite_quotient(bench, every):
    assert {c["cls"] for c in every["roofline"]} == set(bench.CLASSES)
    assert {c["cls"] for c in every["measured"]} == set(bench.CLASSES) - {"ceiling"}     # no one rate to compare
    for c in every["roofline"] + every["measured"]:
        assert c["measured_ms"] > 0 and c["model_ms"] > 0
        assert math.isclose(c["ratio"], c["measured_ms"] / c["model_ms"])


def test_the_summary_sets_both_laws_side_by_side_and_the_measured_ones_match_their_source(bench, capsys):
    assert bench.main(["--markdown"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert "| operator class | cases | measured / roofline model | measured / measured-law model |" in table
    decode = next(line for line in table if line.startswith("| decode step |"))
    assert decode.endswith("| 1.00 (1.00–1.00) |")          # the law holds every measured step


def test_the_model_runs_on_h200_datasheet_figures(bench):
    cm = bench.cost_model("Qwen/Qwen2.5-VL-7B-Instruct", 1)
    assert (cm.hw.bf16_tflops, cm.hw.hbm_tb_s, cm.hw.hbm_gb) == (bench.H200["bf16_tflops"], bench.H200["hbm_tb_s"],
                                                                 bench.H200["hbm_gb"])


@pytest.mark.parametrize("laws", ["roofline", "measured"])
def test_a_prefill_case_carries_the_cost_models_step_less_its_tail(bench, every, laws):
    case = next(c for c in every[laws] if c["cls"] == "prefill (composite)"
                and c["case"].startswith("Qwen3-32B tp2 2048"))
    cm = bench.cost_model("Qwen/Qwen3-32B", 2, laws)
    expected = cm.step_seconds([], [PrefillChunk(0, 2048)]) - cm.allreduce_s(2048) - cm.hw.step_overhead_ms / 1e3
    expected -= cm.laws.residual_s if laws == "measured" else 0.0       # norms, rotary, activations: no GPU row
    assert case["model_ms"] == pytest.approx(expected * 1e3)


def test_a_bad_csv_is_one_line_and_exit_2(bench, tmp_path, capsys):
    bad = tmp_path / "ops.csv"
    bad.write_text("gpu,op\nH200,gemm.qkv\n")
    assert bench.main(["--csv", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "header: missing" in err
