"""benchmarks/gpu/gpu_allreduce.py: its measuring logic runs end to end over gloo in two CPU processes and writes rows
that read back as physics/gpu_ops.py's CSV; its sizing helpers; bad input ends in one line and exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from epdbench.physics.gpu_ops import ALLREDUCE_GRIDS, LM_MODELS, read_ops_csv
from tests.benchmark_scripts import load_benchmark

pytest.importorskip("torch", reason="benchmarks/gpu/gpu_allreduce.py needs PyTorch (its CPU build will do)")
SCRIPT = Path(__file__).parents[1] / "benchmarks" / "gpu" / "gpu_allreduce.py"


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("gpu/gpu_allreduce")


def test_multicast_is_off_in_the_environment_before_nccl_starts(bench):
    import os
    assert {k: os.environ[k] for k in bench.MULTICAST_OFF} == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def test_two_gloo_ranks_time_every_model_and_size_both_ways_with_correct_sums(tmp_path):
    out = tmp_path / "allreduce.csv"
    run = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out), "--backend", "gloo", "--world", "2",
                          "--quick", "--tokens", "1,8", "--timeout-s", "120"],
                         capture_output=True, text=True, timeout=180)
    assert run.returncode == 0, run.stderr[-2000:]
    rows = read_ops_csv(out)
    assert {(r.model, r.tokens, "eager" in r.impl) for r in rows} == {
        (m, t, eager) for m in LM_MODELS for t in (1, 8) for eager in (True, False)}
    grid = ALLREDUCE_GRIDS["quick"]
    for r in rows:
        assert r.op == "allreduce" and r.tp == 2 and r.repeats == grid.repeats
        assert r.bytes == 2 * r.tokens * LM_MODELS[r.model].hidden and r.flops == r.tokens * LM_MODELS[r.model].hidden
        assert 0 < r.time_min_ms <= r.time_ms <= r.time_max_ms
    assert "sum rel err" in run.stdout and "FAILED" not in run.stdout and "bus GB/s" in run.stdout


@pytest.mark.parametrize("est_ms, copies, expected", [
    (0.01, 8, 50),        # 0.5 ms of 10 µs calls
    (1e-6, 8, 200),       # never more than MAX_INNER
    (1e-6, 1, 32),        # never more in-place sums per copy than GROWTH_CALLS
    (5.0, 1, 1),          # at least one
])
def test_inner_calls_fill_the_target_within_the_bounds(bench, est_ms, copies, expected):
    assert bench.inner_calls(est_ms, 0.5, copies) == expected


def test_copies_cover_four_l2s_at_most_eight(bench):
    assert bench.buffer_copies(10_240, 60 * 2 ** 20) == 8
    assert bench.buffer_copies(2 ** 30, 60 * 2 ** 20) == 1
    assert bench.buffer_copies(60 * 2 ** 20, 60 * 2 ** 20) == 4


def test_bus_bandwidth_is_nccl_tests_busbw(bench):
    assert bench.bus_gb_s(1e9, 2, 10.0) == pytest.approx(100.0)        # 1 GB in 10 ms, 2(TP−1)/TP = 1
    assert bench.bus_gb_s(1e9, 8, 10.0) == pytest.approx(175.0)


@pytest.mark.parametrize("argv, says", [
    (["--backend", "gloo", "--world", "1"], "--world 1 and --tps"),
    (["--backend", "gloo", "--tps", "x"], "give integers"),
    (["--backend", "gloo", "--tokens", "0"], "token counts are positive"),
])
def test_bad_input_is_one_line_and_exit_2(bench, tmp_path, capsys, argv, says):
    assert bench.main(["--out", str(tmp_path / "x.csv"), *argv]) == 2
    err = capsys.readouterr().err.strip()
    assert says in err and len(err.splitlines()) == 1


def test_nccl_without_gpus_says_what_to_do(bench, tmp_path, capsys):
    import torch
    if torch.cuda.device_count() >= 2:
        pytest.skip("this host has GPUs")
    assert bench.main(["--out", str(tmp_path / "x.csv")]) == 2
    assert "--backend gloo" in capsys.readouterr().err
