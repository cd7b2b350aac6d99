"""physics/gpu_ops.py: the shapes benchmarks/gpu/gpu_ops.py times agree with the presets, and its CSV reads back
strictly (a bad cell: one line naming the row, the column and the fix)."""
from __future__ import annotations

import csv
import io
from pathlib import Path

import pytest

from epdbench.physics.costmodel import _window_pairs
from epdbench.physics.gpu_ops import (COLUMNS, GRIDS, LM_MODELS, OPS, PRESET_TPS, VISION_MODELS, GpuOpsError,
                                      parse_ops_csv, read_ops_csv)
from epdbench.physics.oplaws import SOURCE_CSV
from epdbench.specs.models import PRESET_DIR, load_spec

DATA = Path(__file__).parents[2] / "benchmarks" / "data"
# The presets of GPU nodes (the simulator's and a cluster's); the local target's cpu-tiny serves a tiny model made
# at run time on CPU, which no GPU measurement covers.
PRESETS = sorted(p.stem for p in PRESET_DIR.glob("*.yaml") if load_spec(p.stem).target.kind != "local")


def preset_models() -> dict[str, set[int]]:
    """Each preset model and the TP sizes its roles use."""
    out: dict[str, set[int]] = {}
    for name in PRESETS:
        spec = load_spec(name)
        out.setdefault(spec.model.name, set()).update(r.tp for c in spec.configurations for r in c.roles)
    return out


def row(**cells) -> dict:
    base = dict(gpu="NVIDIA H200", driver="580.159.04", torch="2.11.0+cu130", cuda="13.0",
                date="2026-12-04T12:00:24+00:00", op="gemm.qkv", impl="F.linear (cuBLAS)",
                model="Qwen/Qwen3-32B", tp="2", layers="", tokens="64", batch="", context="", image_px="",
                flops="6710886400", bytes="53739520", time_ms="0.031", time_min_ms="0.030", time_max_ms="0.033",
                repeats="15")
    return {**base, **cells}


def as_csv(rows: list[dict], columns=COLUMNS) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def test_every_preset_model_and_tp_is_measured():
    for model, tps in preset_models().items():
        assert model in LM_MODELS
        assert tps | {1} == set(PRESET_TPS[model])


@pytest.mark.parametrize("preset", PRESETS)
def test_layer_shapes_are_the_presets(preset):
    m = load_spec(preset).model
    s = LM_MODELS[m.name]
    assert (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim) == (m.n_layers, m.hidden_size, m.n_heads,
                                                                     m.n_kv_heads, m.head_dim)
    assert s.kv_bytes_per_token(1, m.dtype_bytes) == m.kv_bytes_per_token
    # the GEMMs of every layer, the embedding and the lm_head add up to the preset's parameter count
    gemm_params = sum(n * k for n, k in s.gemms(1).values()) - s.gemms(1)["lm_head"][0] * s.hidden
    params = s.layers * gemm_params + 2 * s.vocab * s.hidden
    assert params / 1e9 == pytest.approx(m.params_b, rel=0.02)


@pytest.mark.parametrize("model", list(LM_MODELS))
def test_tp_shards_add_up_to_the_whole_layer(model):
    s = LM_MODELS[model]
    for tp in PRESET_TPS[model]:
        whole, rank = s.gemms(1), s.gemms(tp)
        assert rank["gate_up"][0] * tp == whole["gate_up"][0] and rank["down"][1] * tp == whole["down"][1]
        assert rank["o"][1] * tp == whole["o"][1]
        assert rank["qkv"][0] * tp == whole["qkv"][0] or s.kv_heads < tp


def test_vision_shape_is_the_presets_vision_spec():
    v = load_spec("epd-multimodal").model.vision
    s = VISION_MODELS["Qwen/Qwen2.5-VL-7B-Instruct"]
    assert (s.depth, s.hidden, s.intermediate, s.out_hidden) == (v.depth, v.hidden_size, v.intermediate_size,
                                                                 v.embed_dim)
    assert (s.patch, s.temporal_patch, s.merge, s.window_px) == (v.patch_size, v.temporal_patch_size,
                                                                v.spatial_merge_size, v.window_size)
    assert s.fullatt_blocks == v.fullatt_block_indexes
    assert s.patch * s.merge == v.pixels_per_token


@pytest.mark.parametrize("rows,cols", [(1, 1), (4, 4), (20, 20), (45, 45), (7, 13)])
def test_windows_cover_the_image_as_the_cost_model_counts_them(rows, cols):
    s = VISION_MODELS["Qwen/Qwen2.5-VL-7B-Instruct"]
    windows = s.windows(rows, cols)
    assert sum(windows) == rows * cols * s.merge ** 2
    assert sum(n * n for n in windows) == _window_pairs(load_spec("epd-multimodal").model.vision, rows, cols)


def test_grids_fit_the_budgets_they_state():
    for grid in GRIDS.values():
        assert grid.repeats >= 3 and grid.warmup >= 1
        assert all(new <= ctx for new, ctx in grid.chunks)
        assert all(images >= 1 and px >= 1 for px, images in grid.images)
    assert set(GRIDS["quick"].gemm_tokens) <= set(GRIDS["full"].gemm_tokens)


def test_a_valid_csv_reads_back_typed():
    text = as_csv([row(), row(op="attn.decode", tokens="", batch="8", context="2048"),
                   row(op="peak.copy", model="", tp="", tokens="", flops="0")])
    gemm, decode, copy = parse_ops_csv(text)
    assert (gemm.op, gemm.tp, gemm.tokens, gemm.batch) == ("gemm.qkv", 2, 64, None)
    assert gemm.time_min_ms <= gemm.time_ms <= gemm.time_max_ms and gemm.date.year == 2026
    assert (decode.batch, decode.context) == (8, 2048)
    assert copy.model == "" and copy.tp is None


def test_the_checked_in_h200_csvs_are_valid_and_cover_every_op_and_model():
    for path in (SOURCE_CSV, DATA / "gpu_ops_h200_repeat.csv"):
        rows = read_ops_csv(path)
        assert {r.op for r in rows} == set(OPS) - {"allreduce"}      # one GPU: benchmarks/gpu/gpu_ops.py's ops
        assert {r.model for r in rows if r.model} == set(LM_MODELS) | set(VISION_MODELS)
        assert {r.gpu for r in rows} == {"NVIDIA H200"}


@pytest.mark.parametrize("cells,column", [
    (dict(op="gemm.mlp"), "op"),
    (dict(tokens=""), "tokens"),
    (dict(tokens="64.5"), "tokens"),
    (dict(tp="0"), "tp"),
    (dict(time_ms="0.05"), "time_ms"),
    (dict(time_min_ms="nan"), "time_min_ms"),
    (dict(flops="-1"), "flops"),
    (dict(date="yesterday"), "date"),
    (dict(model=""), "model"),
    (dict(gpu=" "), "gpu"),
    (dict(op="vision.tower", image_px="", batch="1"), "image_px"),
    (dict(repeats="0"), "repeats"),
])
def test_a_bad_cell_is_one_line_naming_row_and_column(cells, column):
    with pytest.raises(GpuOpsError) as err:
        parse_ops_csv(as_csv([row(**cells)]), "ops.csv")
    message = str(err.value)
    assert "\n" not in message
    assert f"ops.csv, row 2, column {column}:" in message


def test_the_row_number_is_the_files_line():
    with pytest.raises(GpuOpsError, match=r"row 4, column batch"):
        parse_ops_csv(as_csv([row(), row(), row(op="attn.decode", batch="x", context="1")]))


def test_header_problems_name_the_columns():
    with pytest.raises(GpuOpsError, match=r"header: missing repeats; unknown note"):
        parse_ops_csv(as_csv([row(note="x")], [c for c in COLUMNS if c != "repeats"] + ["note"]))


def test_a_ragged_row_an_empty_file_and_a_missing_file_are_one_line_each(tmp_path):
    text = as_csv([row()])
    with pytest.raises(GpuOpsError, match=r"row 2: \d+ cells expected"):
        parse_ops_csv(text.replace("\r\n", ",extra\r\n", 2).replace(",extra", "", 1))
    with pytest.raises(GpuOpsError, match="no rows"):
        parse_ops_csv(as_csv([]))
    with pytest.raises(GpuOpsError, match="cannot be read"):
        read_ops_csv(tmp_path / "absent.csv")
