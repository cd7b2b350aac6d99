"""physics/allreduce.py: the all-reduce law fitted to benchmarks/gpu/gpu_allreduce.py's rows reproduces them, holds the
latency floor below them and the link's bandwidth above, is scaled by NVLink, and falls back to NCCL's constants
for a TP the measurement lacks, under the roofline laws, and without a measurement."""
from __future__ import annotations

import math

import pytest

from epdbench.physics import allreduce
from epdbench.physics.costmodel import CostModel
from epdbench.physics.gpu_ops import ALLREDUCE_GRIDS, LM_MODELS, parse_ops_csv
from epdbench.physics.oplaws import digest
from epdbench.specs.models import load_spec
from epdbench.specs.node import OperatorTimings
from tests.benchmark_scripts import load_benchmark
from tests.physics.test_gpu_ops import as_csv, row

FLOOR_S, BUS_GB_S = 12e-6, 360.0          # a curve of the shape NCCL's all-reduce has: latency + bytes / bandwidth
LEAVE_ONE_OUT_REL = 0.05                  # an interior size left out is predicted within 5 % (1.5 % here)


def curve_s(n_bytes: float, tp: int = 2) -> float:
    return FLOOR_S + n_bytes * 2 * (tp - 1) / tp / (BUS_GB_S * 1e9)


def allreduce_rows(tp: int = 2, impl: str = "nccl 2.27.7 cuda-graph", scale: float = 1.0) -> list[dict]:
    """One row per model and full-grid token count, timed by `curve_s` × scale."""
    rows = []
    for model, shape in LM_MODELS.items():
        for tokens in ALLREDUCE_GRIDS["full"].tokens:
            n_bytes = 2 * tokens * shape.hidden
            ms = curve_s(n_bytes, tp) * scale * 1e3
            rows.append(row(op="allreduce", impl=impl, model=model, tp=str(tp), tokens=str(tokens),
                            flops=str((tp - 1) * tokens * shape.hidden), bytes=str(n_bytes), time_ms=f"{ms:.6g}",
                            time_min_ms=f"{ms * 0.98:.6g}", time_max_ms=f"{ms * 1.02:.6g}"))
    return rows


@pytest.fixture
def rows():
    return parse_ops_csv(as_csv(allreduce_rows()))


@pytest.fixture
def pd_text():
    return load_spec("pd-text")


def test_new_rows_read_back_and_need_their_tp_and_tokens():
    parsed = parse_ops_csv(as_csv(allreduce_rows()))
    assert {r.op for r in parsed} == {"allreduce"} and all(r.bytes == 2 * r.tokens * LM_MODELS[r.model].hidden
                                                           for r in parsed)
    with pytest.raises(ValueError, match="row 2, column tp: empty, but this op needs it"):
        parse_ops_csv(as_csv([{**allreduce_rows()[0], "tp": ""}]))


def test_the_law_reproduces_every_row_it_was_fitted_on(rows):
    law = allreduce.fit_laws(rows)[2]
    for r in rows:
        assert law.seconds_at_source(r.bytes) == pytest.approx(r.time_ms / 1e3, rel=1e-9)


def test_an_interior_size_left_out_is_predicted_within_the_stated_error(rows):
    sizes = sorted({r.bytes for r in rows})
    worst = 0.0
    for left in sizes[1:-1]:
        law = allreduce.fit_laws([r for r in rows if r.bytes != left])[2]
        worst = max(worst, abs(law.seconds_at_source(left) / curve_s(left) - 1))
    assert 0 < worst < LEAVE_ONE_OUT_REL


def test_below_the_smallest_size_the_floor_above_the_largest_the_links_bandwidth(rows):
    law = allreduce.fit_laws(rows)[2]
    smallest = min(r.bytes for r in rows)
    assert law.seconds_at_source(1) == law.seconds_at_source(smallest) == law.floor_s
    largest = max(r.bytes for r in rows)
    assert law.seconds_at_source(4 * largest) == pytest.approx(curve_s(4 * largest), rel=1e-3)
    assert law.bus_gb_s == pytest.approx(BUS_GB_S, rel=1e-3)


def test_graph_rows_are_preferred_to_eager_ones_and_eager_ones_serve_alone():
    both = parse_ops_csv(as_csv(allreduce_rows() + allreduce_rows(impl="nccl 2.27.7 eager", scale=3.0)))
    law = allreduce.fit_laws(both)[2]
    assert law.impl == "cuda-graph" and law.floor_s == pytest.approx(curve_s(2 * LM_MODELS[
        "Qwen/Qwen2.5-VL-7B-Instruct"].hidden), rel=1e-5)
    eager = allreduce.fit_laws(parse_ops_csv(as_csv(allreduce_rows(impl="nccl 2.27.7 eager", scale=3.0))))[2]
    assert eager.floor_s == pytest.approx(3 * law.floor_s, rel=1e-5)


def test_a_tp_with_one_size_has_no_law():
    one = parse_ops_csv(as_csv(allreduce_rows()[:1]))
    assert allreduce.fit_laws(one) == {}


def with_default(monkeypatch, tmp_path, rows_: list[dict]) -> None:
    path = tmp_path / "allreduce.csv"
    path.write_text(as_csv(rows_))
    monkeypatch.setattr(allreduce, "SOURCE_CSV", path)
    allreduce._default.cache_clear()


@pytest.fixture(autouse=True)
def fresh_default():
    allreduce._default.cache_clear()
    yield
    allreduce._default.cache_clear()


def test_the_cost_model_charges_two_measured_all_reduces_per_layer_at_the_measured_tp(monkeypatch, tmp_path,
                                                                                      pd_text):
    with_default(monkeypatch, tmp_path, allreduce_rows())
    m, hw = pd_text.model, pd_text.hardware          # H100 SXM5: NVLink 900 GB/s, the measured H200's figure
    for tokens in (1, 37, 256, 8192):
        n_bytes = tokens * m.hidden_size * m.dtype_bytes
        expected = 2 * m.n_layers * allreduce.fit_laws(parse_ops_csv(as_csv(allreduce_rows())))[2].seconds(n_bytes)
        assert CostModel(m, hw, tp=2).allreduce_s(tokens) == pytest.approx(expected, rel=1e-12)
    assert "measured at TP 2 on NVIDIA H200" in allreduce.describe(hw)


def test_tp_beyond_the_measurement_keeps_nccls_constants(monkeypatch, tmp_path, pd_text):
    with_default(monkeypatch, tmp_path, allreduce_rows())
    hw = pd_text.hardware
    for tp in (4, 8):
        assert allreduce.seconds(hw, tp, 1e6) == allreduce.nccl_seconds(hw, tp, 1e6)
    assert "other TP: NCCL's ring constants (6.6 µs + 0.6 µs per ring step" in allreduce.describe(hw)


def test_roofline_laws_and_no_measurement_keep_nccls_constants(monkeypatch, tmp_path, pd_text):
    roofline = pd_text.hardware.model_copy(update={"op_laws": "roofline"})
    with_default(monkeypatch, tmp_path, allreduce_rows())
    assert allreduce.seconds(roofline, 2, 1e6) == allreduce.nccl_seconds(roofline, 2, 1e6)
    assert allreduce.describe(roofline).startswith("TP all-reduce: NCCL's ring constants")
    monkeypatch.setattr(allreduce, "SOURCE_CSV", tmp_path / "absent.csv")
    allreduce._default.cache_clear()
    assert allreduce.seconds(pd_text.hardware, 2, 1e6) == allreduce.nccl_seconds(pd_text.hardware, 2, 1e6)


def test_a_slower_nvlink_stretches_the_time_beyond_the_floor(monkeypatch, tmp_path, pd_text):
    with_default(monkeypatch, tmp_path, allreduce_rows())
    half = pd_text.hardware.model_copy(update={"nvlink_gb_s": 450})
    n_bytes = 8192 * 5120 * 2
    at_source = allreduce.seconds(pd_text.hardware, 2, n_bytes)
    floor = allreduce.measured(half).laws[2].floor_s
    assert allreduce.seconds(half, 2, n_bytes) == pytest.approx(floor + 2 * (at_source - floor), rel=1e-12)
    assert "scaled to 450 GB/s NVLink from the measured 900" in allreduce.describe(half)


def test_operator_timings_with_all_reduce_rows_are_used_as_this_nodes(monkeypatch, tmp_path, pd_text):
    monkeypatch.setattr(allreduce, "SOURCE_CSV", tmp_path / "absent.csv")
    text = as_csv(allreduce_rows(scale=2.0, tp=2) + allreduce_rows(tp=4))
    timings = OperatorTimings(source="mine.csv", gpu="NVIDIA H200", sha256=digest(text), csv=text)
    hw = pd_text.hardware.model_copy(update={"op_timings": timings, "nvlink_gb_s": 450})
    assert allreduce.seconds(hw, 2, 1e6) == pytest.approx(2 * curve_s(1e6), rel=0.05)     # unscaled by NVLink
    assert allreduce.seconds(hw, 4, 1e6) == pytest.approx(curve_s(1e6, 4), rel=0.05)
    assert allreduce.seconds(hw, 8, 1e6) == allreduce.nccl_seconds(hw, 8, 1e6)
    assert "(mine.csv;" in allreduce.describe(hw) and "measured at TP 2, 4" in allreduce.describe(hw)


def test_tp_one_and_no_bytes_cost_nothing(pd_text):
    assert allreduce.seconds(pd_text.hardware, 1, 1e6) == 0.0 == allreduce.seconds(pd_text.hardware, 2, 0)
    assert math.isfinite(allreduce.seconds(pd_text.hardware, 2, 1))


def test_the_comparison_script_sets_nccls_constants_beside_the_rows_and_the_left_out_error(tmp_path, capsys):
    bench = load_benchmark("simulator/allreduce_vs_model")
    path = tmp_path / "rows.csv"
    path.write_text(as_csv(allreduce_rows() + allreduce_rows(impl="nccl 2.27.7 eager", scale=3.0)))
    cases = bench.comparisons(parse_ops_csv(path.read_text()))
    assert len(cases) == len(allreduce_rows())                     # the graph rows only
    hw = load_spec("pd-text").hardware
    for c in cases:
        assert c["before"] == pytest.approx(c["measured_ms"] / 1e3 / allreduce.nccl_seconds(hw, 2, c["bytes"]))
    assert all(abs(c["left_out"] - 1) < LEAVE_ONE_OUT_REL for c in cases if c["left_out"] is not None)
    assert bench.main(["--csv", str(path)]) == 0
    assert capsys.readouterr().out.startswith("TP 2: 30 sizes; measured / NCCL constants: median")
    path.write_text(as_csv([row()]))
    assert bench.main(["--csv", str(path)]) == 2
    assert "no all-reduce rows" in capsys.readouterr().err
