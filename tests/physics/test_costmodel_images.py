"""physics/costmodel.py, what an image costs: the vision tower's FLOPs and roofline time (hardware.op_laws roofline;
the measured law: test_oplaws.py), and the API server's preprocessing."""
from __future__ import annotations

import pytest

from epdbench.physics.costmodel import CostModel, image_preprocess_seconds, token_grid, vision_flops
from epdbench.specs.models import VisionSpec, load_spec


@pytest.fixture(scope="module")
def spec():
    spec = load_spec("epd-multimodal")
    return spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"op_laws": "roofline"})})


@pytest.fixture(scope="module")
def vision(spec):
    return spec.model.vision


def test_the_preset_is_qwen25_vl_7b_vision_config(vision):
    assert (vision.depth, vision.hidden_size, vision.intermediate_size, vision.embed_dim) == (32, 1280, 3420, 3584)
    assert (vision.patch_size, vision.temporal_patch_size, vision.spatial_merge_size) == (14, 2, 2)
    assert (vision.window_size, vision.fullatt_block_indexes) == (112, (7, 15, 23, 31))


def test_the_structure_adds_up_to_the_towers_parameter_count(vision):
    # Qwen2.5-VL-7B's vision tower, weight by weight (biases on qkv, proj, MLP and merger; RMSNorm weights)
    d, i = 1280, 3420
    block = (d * 3 * d + 3 * d) + (d * d + d) + (d * 2 * i + 2 * i) + (i * d + d) + 2 * d
    merger = d + (4 * d * 4 * d + 4 * d) + (4 * d * 3584 + 3584)
    params = 3 * 2 * 14 * 14 * d + 32 * block + merger
    assert params / 1e9 == pytest.approx(vision.params_b, rel=0.01)


def test_flops_of_a_560px_image_match_a_hand_count(vision):
    # 560 px = 20 × 20 LM tokens = 40 × 40 = 1600 patches of 14 px; windows of 112 px = 8 × 8 patches: 5 × 5 of them
    patches = 1600
    embed = 2 * (3 * 2 * 14 * 14) * 1280                                   # Conv3d (2, 14, 14) as a linear map
    block = 2 * (1280 * 3 * 1280 + 1280 * 1280 + 1280 * 2 * 3420 + 3420 * 1280)   # qkv, proj, gate_up, down
    merger = 2 * (5120 * 5120 + 5120 * 3584)                               # per LM token: 2×2 patches of 1280
    full = 4 * 1280 * patches * patches                                     # QKᵀ + AV over the whole image
    windowed = 4 * 1280 * 25 * 64 * 64                                      # ... within each of 25 windows
    hand = patches * (embed + 32 * block) + 400 * merger + 4 * full + 28 * windowed
    assert vision_flops(vision, 20, 20) == hand
    assert hand == pytest.approx(2.123e12, rel=1e-3)


def test_windows_at_the_edge_are_cut_short(vision):
    # 22 × 22 tokens: windows of 4 tokens along each edge, five whole and one of 2 → Σ (patches per window)²
    # = 2⁴ · (5·4² + 2²)²; an image smaller than one window attends as in a full-attention block
    windowed = vision.model_copy(update={"fullatt_block_indexes": ()})
    full = vision.model_copy(update={"fullatt_block_indexes": tuple(range(32))})
    patches = 22 * 22 * 4
    assert (vision_flops(windowed, 22, 22) - vision_flops(full, 22, 22)
            == 32 * 4 * 1280 * (2 ** 4 * (5 * 4 ** 2 + 2 ** 2) ** 2 - patches ** 2))
    assert vision_flops(windowed, 2, 2) == vision_flops(full, 2, 2)


def test_full_attention_grows_with_the_area_squared_and_windows_with_the_area(vision):
    windowed = vision.model_copy(update={"fullatt_block_indexes": ()})
    full = vision.model_copy(update={"fullatt_block_indexes": tuple(range(32))})
    for side in (8, 20, 64):                     # edges in tokens, whole windows; doubling the edge = 4× the area
        assert vision_flops(windowed, 2 * side, 2 * side) == 4 * vision_flops(windowed, side, side)
        n = side * side * 4                      # patches
        excess = vision_flops(full, 2 * side, 2 * side) - 4 * vision_flops(full, side, side)
        assert excess == 32 * 4 * 1280 * ((4 * n) ** 2 - 4 * n ** 2)
    # the real mix: each doubling of the edge costs more than 4× and more so as the image grows
    ratios = [vision_flops(vision, 2 * s, 2 * s) / vision_flops(vision, s, s) for s in (8, 32, 128)]
    assert 4 < ratios[0] < ratios[1] < ratios[2] < 16


def test_images_of_one_pass_attend_only_within_themselves(spec):
    cm = CostModel(spec.model, spec.hardware)
    one = cm.encode_seconds(1600)
    assert cm.encode_seconds([1600, 1600]) == pytest.approx(2 * one)
    assert cm.encode_seconds([1600, 0]) == one == cm.encode_seconds([1600])
    assert cm.encode_seconds(6400) > 4 * one                 # one image of 4× the area: full attention grows
    assert cm.encode_seconds([]) == cm.encode_seconds(0) == 0.0


def test_a_tiny_image_costs_reading_the_towers_weights(spec):
    cm = CostModel(spec.model, spec.hardware)
    weights_s = spec.model.vision.params_b * 1e9 * spec.model.dtype_bytes / cm.bytes_per_s
    assert cm.encode_seconds(4) == pytest.approx(weights_s)
    assert cm.encode_seconds(400) == pytest.approx(vision_flops(spec.model.vision, 20, 20) / cm.flops_per_s)


def test_a_token_count_is_laid_out_as_the_squarest_grid():
    assert token_grid(400) == (20, 20) and token_grid(1) == (1, 1)
    assert token_grid(800) == (28, 29)           # 28 · 29 ≥ 800: the last column short


def test_the_structure_must_agree_with_pixels_per_token():
    with pytest.raises(ValueError, match="pixels_per_token 32 is not patch_size"):
        VisionSpec(params_b=0.6, embed_dim=3584, pixels_per_token=32)
    with pytest.raises(ValueError, match="fullatt_block_indexes"):
        VisionSpec(params_b=0.6, embed_dim=3584, depth=8)


def test_preprocessing_is_a_fixed_cost_plus_one_per_pixel(spec):
    hw = spec.hardware.model_copy(update={"image_preprocess_ms": 2.0, "image_preprocess_ms_per_mp": 40.0,
                                          "image_decode_ms_per_mp": 10.0})
    assert image_preprocess_seconds(hw, []) == 0.0
    assert image_preprocess_seconds(hw, [(1000, 500)]) == pytest.approx((2.0 + 40.0 * 0.5) / 1e3)
    assert image_preprocess_seconds(hw, [(1000, 500), (2000, 1000)]) == pytest.approx((4.0 + 40.0 * 2.5) / 1e3)
    # a processor-cache hit is decoded and hashed only
    assert image_preprocess_seconds(hw, [(1000, 500)], [(2000, 1000)]) == pytest.approx((4.0 + 20.0 + 20.0) / 1e3)
