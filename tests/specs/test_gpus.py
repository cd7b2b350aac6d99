"""specs/gpus.py: the GPUs whose datasheet figures epdbench knows, by the name the device reports; a table measured
on one puts the spec's node on its figures."""
from __future__ import annotations

from epdbench.physics.costmodel import CostModel
from epdbench.physics.oplaws import SOURCE_BF16_TFLOPS, SOURCE_HBM_TB_S
from epdbench.specs.gpus import DATASHEETS, datasheet_for, on_gpu
from epdbench.specs.models import load_spec


def test_the_device_names_give_the_datasheets_and_unknown_ones_none():
    assert datasheet_for("NVIDIA H100 80GB HBM3").gpu == "H100-SXM5-80GB"
    assert datasheet_for(" NVIDIA H200 ").gpu == "H200-SXM-141GB"
    assert datasheet_for("H200-SXM-141GB") is DATASHEETS["H200-SXM-141GB"]
    assert datasheet_for("NVIDIA H100 PCIe") is None and datasheet_for("NVIDIA H200 NVL") is None


def test_the_datasheets_agree_with_the_presets_and_the_measured_laws_source():
    h100, h200 = DATASHEETS["H100-SXM5-80GB"], DATASHEETS["H200-SXM-141GB"]
    for preset in ("vllm-truth", "epd-multimodal", "pd-text"):
        hw = load_spec(preset).hardware
        assert (hw.gpu, hw.bf16_tflops, hw.hbm_tb_s, hw.hbm_gb, hw.nvlink_gb_s) == (
            h100.gpu, h100.bf16_tflops, h100.hbm_tb_s, h100.hbm_gb, h100.nvlink_gb_s)
    assert (h200.bf16_tflops, h200.hbm_tb_s) == (SOURCE_BF16_TFLOPS, SOURCE_HBM_TB_S)   # the H200 the laws measured
    assert all(d.source.startswith(f"NVIDIA {d.gpu[:4]} Tensor Core GPU datasheet") for d in DATASHEETS.values())


def test_on_an_h200_the_spec_keeps_its_free_constants_and_decodes_at_the_h200s_bandwidth():
    spec = load_spec("vllm-truth")
    spec = spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"step_overhead_ms": 2.5})})
    h200 = on_gpu(spec, DATASHEETS["H200-SXM-141GB"])
    assert (h200.hardware.gpu, h200.hardware.hbm_gb, h200.hardware.step_overhead_ms) == ("H200-SXM-141GB", 141, 2.5)
    assert on_gpu(spec, DATASHEETS["H100-SXM5-80GB"]) is spec
    on_h100, on_h200 = (CostModel(s.model, s.hardware, 1) for s in (spec, h200))
    assert on_h200.decode_step_seconds(1, 1024) < on_h100.decode_step_seconds(1, 1024)
    assert on_h200.kv_capacity_tokens(0.85) > 1.9 * on_h100.kv_capacity_tokens(0.85)   # 141 GB against 80
