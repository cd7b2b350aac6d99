"""`epdbench calibrate --engine-steps TRUTH.csv --out PROFILE`: the engine constants fitted to a real engine's own step
timings, here a truth table the simulator made with moved constants (tests/truth_tables.py), which the fit must
find; a table it cannot use is one line and exit 2."""
from __future__ import annotations

import pandas as pd
import pytest

from epdbench.cli import main
from epdbench.specs.gpus import DATASHEETS
from epdbench.specs.profile import error_bar, load_profile, profile_origin
from tests.test_calibrate_ops_cli import one_line_error
from tests.truth_tables import HIDDEN, synthetic_truth

TOLERANCE = 0.01     # the lone cells are predicted exactly: the search stops within 0.1 % in log space


@pytest.fixture(scope="module")
def table(tmp_path_factory):
    return synthetic_truth(tmp_path_factory.mktemp("truth") / "vllm_truth_h100.csv")


def test_the_fit_finds_the_engines_constants_and_the_batched_cells_confirm_them(table, tmp_path, capsys):
    out = tmp_path / "engine.yaml"
    assert main(["calibrate", "--engine-steps", str(table), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    profile = load_profile(out)
    assert profile["hardware"] == pytest.approx(HIDDEN, rel=TOLERANCE)
    assert profile["left_as_in_spec"] == ["allreduce_latency_us", "compute_efficiency", "hbm_efficiency"]
    assert (profile["fitted_figures"], profile["spec"], profile["gpu"]) == ("engine", "vllm-truth", "H100-SXM5-80GB")
    assert max(profile["fit_error"].values()) < 1e-3 and max(profile["holdout_error"].values()) < 1e-3
    assert min(profile["holdout_spec_error"].values()) > 0.05           # the preset's constants were off
    assert profile["holdout_verdict"] == {"engine_prefill_ms": "better", "engine_decode_ms_per_token": "better",
                                          "engine_preprocess_ms": "better"}
    assert set(profile["holdout_tail"]) == set(profile["holdout_error"])     # the batched cells' p90 and worst
    assert all(t["p90_error"] < 1e-3 and " c=" in t["worst_cell"] for t in profile["holdout_tail"].values())
    assert "6 lone cells (concurrency 1) fitted, 9 batched cells to check" in printed
    assert ("not fitted here, outside the engine: tcp_gb_s, tcp_latency_ms, rdma_efficiency, rdma_latency_ms, "
            "request_hop_ms") in printed
    assert "no role of the run is tensor-parallel" in printed and "batched (9), fitted" in printed
    assert "engine step timings" in profile_origin(profile)
    assert error_bar(profile).startswith("fitted to engine step timings (its errors are of the engines' prefill")
    assert "engine_prefill_ms 0.0% (p90 0.0%, worst aggregated " in error_bar(profile)


def test_a_table_measured_on_an_h200_puts_the_spec_on_the_h200s_figures(tmp_path, capsys):
    from epdbench.specs.gpus import on_gpu
    from epdbench.specs.models import load_spec

    h200 = on_gpu(load_spec("vllm-truth"), DATASHEETS["H200-SXM-141GB"])
    table = synthetic_truth(tmp_path / "h200.csv", spec=h200, gpu="NVIDIA H200")
    out = tmp_path / "h200.yaml"
    assert main(["calibrate", "--engine-steps", str(table), "--out", str(out), "--evaluations", "60"]) == 0
    printed = capsys.readouterr().out
    assert "the table was measured on NVIDIA H200: spec vllm-truth's node (H100-SXM5-80GB) takes its" in printed
    profile = load_profile(out)
    assert profile["gpu"] == "H200-SXM-141GB"
    assert profile["hardware"] == pytest.approx(HIDDEN, rel=TOLERANCE)


def rewritten(table, tmp_path, change) -> str:
    frame = pd.read_csv(table, dtype=str, keep_default_na=False)
    frame = change(frame)
    path = tmp_path / "bad.csv"
    frame.to_csv(path, index=False)
    return str(path)


@pytest.mark.parametrize("change, expected", [
    (lambda f: f.drop(columns=["workload"]), "no column(s) workload: a truth table has gpu, "),
    (lambda f: f.assign(engine_prefill_ms_mean=f["engine_prefill_ms_mean"].where(f.index != 3, "1,234.5")),
     "row 4 (gpu NVIDIA H100 80GB HBM3, tool epdbench, config aggregated, suite text, workload 4096/128, "
     "concurrency 1): engine_prefill_ms_mean '1,234.5' is not a plain number"),
    (lambda f: f.assign(gpu=f["gpu"].where(f.index != 0, "NVIDIA H200")), "rows of 2 GPUs ("),
    (lambda f: f.assign(gpu="NVIDIA A100-SXM4-80GB"), "gpu 'NVIDIA A100-SXM4-80GB' is not a GPU whose datasheet"),
    (lambda f: f.assign(tool="vllm-bench"), "no row of tool 'epdbench': the table has vllm-bench"),
    (lambda f: f.assign(input_tokens=f["input_tokens"].where(f.index != 0, "1000")),
     "image_px, input_tokens, output_tokens (0, 1000, 128) are not the workload's (0, 1024, 128)"),
    (lambda f: f.assign(workload=f["workload"].where(f.index != 0, "1024/128@4/s")),
     "workload '1024/128@4/s' is not a fixed shape's label"),
    (lambda f: f[f["concurrency"] != "1"], "no cell at concurrency 1: the fit reads lone requests' engine timings"),
    (lambda f: f.assign(engine_prefill_ms_mean="", engine_decode_ms_mean="", engine_tpot_ms_mean=""),
     "no cell has engine_prefill_ms_mean or engine_decode_ms_mean"),
    (lambda f: f.assign(config="pd"), "config pd not in spec vllm-truth (it has aggregated)"),
    (lambda f: f.iloc[:0], "no rows"),
])
def test_a_table_it_cannot_use_is_one_line_and_exit_2(table, tmp_path, capsys, change, expected):
    err = one_line_error(capsys, ["calibrate", "--engine-steps", rewritten(table, tmp_path, change),
                                  "--out", str(tmp_path / "p.yaml")])
    assert expected in err


def test_bad_flags_are_one_line_and_exit_2(table, tmp_path, capsys):
    out = str(tmp_path / "p.yaml")
    assert "no such file" in one_line_error(capsys, ["calibrate", "--engine-steps", str(tmp_path / "none.csv"),
                                                     "--out", out])
    assert "give one" in one_line_error(capsys, ["calibrate", "--engine-steps", str(table), "--from", str(table),
                                                 "--out", out])
    assert "--metrics is for --from" in one_line_error(capsys, ["calibrate", "--engine-steps", str(table), "--out",
                                                                out, "--metrics", "ttft_p50_ms"])
    assert "does not exist" in one_line_error(capsys, ["calibrate", "--engine-steps", str(table), "--out",
                                                       str(tmp_path / "no" / "p.yaml")])
    assert not (tmp_path / "p.yaml").exists()


def test_failed_cells_are_left_out_and_said(table, tmp_path, capsys):
    path = rewritten(table, tmp_path, lambda f: f.assign(requests_ok=f["requests_ok"].where(f.index != 0, "7")))
    assert main(["calibrate", "--engine-steps", path, "--out", str(tmp_path / "p.yaml"), "--evaluations", "60"]) == 0
    printed = capsys.readouterr().out
    assert "1 row with failed requests left out" in printed and "5 lone cells (concurrency 1) fitted" in printed
