"""physics/costmodel.py: roofline step times (hardware.op_laws roofline; the measured laws: test_oplaws.py), image
tokens, KV transfer times, FCFS chunked prefill."""
from __future__ import annotations

import pytest

from epdbench.physics.costmodel import (CostModel, PrefillChunk, chunk_prefill, encoder_cache_tokens, image_tokens,
                                        kv_descriptors, link_bytes_per_s, max_mm_item_tokens, peer_lanes,
                                        setup_seconds, transfer_seconds)
from epdbench.specs.models import HardwareSpec, load_spec
from epdbench.specs.node import TCP_DESCRIPTOR_MS, TCP_SETUP_MS, UCX_TCP_SETUP_MS

GiB = 2 ** 30


@pytest.fixture(scope="module")
def smoke():
    spec = load_spec("smoke")
    return spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"op_laws": "roofline"})})


@pytest.fixture(scope="module")
def cm(smoke):
    return CostModel(smoke.model, smoke.hardware, tp=1)


def overhead_s(cm):
    return cm.hw.step_overhead_ms / 1e3


@pytest.mark.parametrize("px, tokens", [(560, 400), (840, 900), (1260, 2025), (1792, 4096)])
def test_image_tokens_match_qwen25_vl(smoke, px, tokens):
    assert image_tokens(smoke.model, px, px) == tokens


@pytest.mark.parametrize("width, height, tokens", [
    (4000, 4000, 16384),     # 16 MP, over max_pixels (12845056): scaled to 3584² (128 × 128 tokens), not 143²
    (6000, 1000, 7704),      # within the range: each side to the nearest 28 px, 5992 × 1008
    (28, 28, 4),             # under min_pixels (3136 = 56²): scaled up to 56², 2 × 2 tokens
    (30, 100, 4),            # 28 × 112 px after rounding: 3136, at min_pixels
])
def test_image_tokens_follow_the_image_processors_smart_resize(smoke, width, height, tokens):
    assert image_tokens(smoke.model, width, height) == tokens


def test_image_tokens_of_text_only_model_is_zero(smoke):
    text_only = smoke.model.model_copy(update={"vision": None})
    assert image_tokens(text_only, 560, 560) == 0


def test_decode_step_is_bandwidth_bound(cm):
    ctx = 1000
    bw = cm.hw.hbm_tb_s * 1e12 * cm.hw.hbm_efficiency * 1
    expected = (cm.model.weight_bytes + cm.model.kv_bytes_per_token * ctx) / bw + overhead_s(cm)
    assert cm.step_seconds([ctx], []) == pytest.approx(expected, rel=1e-9)
    # 7.6 B params in bf16 over 2.68 TB/s: about 5.7 ms of weight reads plus 1 ms overhead
    assert 6e-3 < cm.step_seconds([ctx], []) < 8e-3


def test_decode_step_grows_with_kv_context(cm):
    short, long = cm.step_seconds([100], []), cm.step_seconds([16000], [])
    assert long > short
    assert long - short == pytest.approx(cm.model.kv_bytes_per_token * 15900 / cm.bytes_per_s, rel=1e-6)
    # batching decodes of short contexts is almost free: the weights are read once per step
    assert cm.step_seconds([100] * 8, []) < 1.05 * short


def _prefill_s(cm, tokens):
    return cm.step_seconds([], [PrefillChunk(0, tokens)]) - overhead_s(cm)


def test_prefill_grows_about_linearly_with_tokens(cm):
    for n in (1024, 2048, 4096):
        ratio = _prefill_s(cm, 2 * n) / _prefill_s(cm, n)
        assert 1.95 < ratio < 2.3   # linear in weights FLOPs, plus a modest causal-attention term


def test_long_prefill_is_compute_bound(cm):
    n = 8192
    flops = 2 * cm.model.params_b * 1e9 * n + cm.attention_flops(0, n)
    compute_s = flops / (cm.hw.bf16_tflops * 1e12 * cm.hw.compute_efficiency)
    assert compute_s > cm.model.weight_bytes / cm.bytes_per_s
    assert _prefill_s(cm, n) == pytest.approx(compute_s, rel=1e-9)


def test_prefill_chunk_later_in_the_prompt_costs_more(cm):
    # same tokens, longer causal context
    assert cm.step_seconds([], [PrefillChunk(4096, 1024)]) > cm.step_seconds([], [PrefillChunk(0, 1024)])


@pytest.mark.parametrize("decodes, prefill", [([2000] * 4, []), ([], [PrefillChunk(0, 4096)]),
                                              ([500] * 8, [PrefillChunk(0, 2048)])])
def test_tp2_is_faster_but_not_free(smoke, decodes, prefill):
    t1 = CostModel(smoke.model, smoke.hardware, tp=1).step_seconds(decodes, prefill)
    cm2 = CostModel(smoke.model, smoke.hardware, tp=2)
    t2 = cm2.step_seconds(decodes, prefill)
    over = smoke.hardware.step_overhead_ms / 1e3
    assert t2 < t1
    assert t2 > (t1 - over) / 2 + over   # all-reduces over NVLink cost something
    assert cm2.allreduce_s(len(decodes) + sum(c.tokens for c in prefill)) > 0


def test_empty_step_costs_nothing(cm):
    assert cm.step_seconds([], []) == 0.0


def test_transfer_of_one_gib_tcp_vs_rdma(smoke):
    hw = smoke.hardware
    tcp = transfer_seconds(hw, "tcp", GiB)
    rdma = transfer_seconds(hw, "rdma", GiB)
    assert tcp == pytest.approx(GiB / (hw.tcp_gb_s * 1e9) + (hw.tcp_setup_ms + hw.tcp_latency_ms) / 1e3)
    assert rdma == pytest.approx(GiB / (hw.rdma_nic_gbit_s / 8 * 1e9 * hw.rdma_efficiency) + hw.rdma_latency_ms / 1e3)
    assert rdma < tcp / 10          # 3 GB/s TCP vs 40 GB/s on one 400 Gbit/s NIC
    assert transfer_seconds(hw, "rdma", GiB, rdma_interfaces=2) == pytest.approx(
        (rdma - hw.rdma_latency_ms / 1e3) / 2 + hw.rdma_latency_ms / 1e3)


LINK = HardwareSpec(gpu="toy", bf16_tflops=1000, hbm_tb_s=1.0, nvlink_gb_s=100, tcp_gb_s=2.0, tcp_setup_ms=0.1,
                    tcp_descriptor_ms=0.02, tcp_latency_ms=0.3, rdma_nic_gbit_s=400, rdma_efficiency=0.8,
                    rdma_latency_ms=0.05)


@pytest.mark.parametrize("transport, n_bytes, descriptors, interfaces, ms", [
    ("tcp", 0, 1, 1, 0.4),                    # setup 0.1 + network 0.3, no bytes
    ("tcp", 2_000_000, 1, 1, 1.4),            # + 2 MB at 2 GB/s: 1 ms
    ("tcp", 2_000_000, 56, 1, 2.5),           # 55 further descriptors: + 1.1 ms
    ("tcp", GiB, 56, 1, 538.370912),          # 1073741824 B / 2e9 B/s = 536.870912 ms, + 0.1 + 1.1 + 0.3
    ("rdma", 40_000_000, 56, 1, 1.05),        # 400 Gbit/s × 0.8 = 40 GB/s: 1 ms, + 0.05; descriptors cost nothing
    ("rdma", 40_000_000, 1, 2, 0.55),         # two NICs: 80 GB/s
])
def test_transfer_time_by_hand(transport, n_bytes, descriptors, interfaces, ms):
    assert transfer_seconds(LINK, transport, n_bytes, interfaces, descriptors) * 1e3 == pytest.approx(ms)
    assert setup_seconds(LINK, transport, descriptors) * 1e3 == pytest.approx(
        ms - n_bytes / link_bytes_per_s(LINK, transport, interfaces) * 1e3)


def test_measured_tcp_setup_is_the_default_and_old_spec_files_still_load(smoke):
    hw = HardwareSpec(gpu="toy", bf16_tflops=1, hbm_tb_s=1, nvlink_gb_s=1, tcp_gb_s=1, tcp_latency_ms=0.5,
                      rdma_nic_gbit_s=1)   # a spec file of before: no tcp_setup_ms, an explicit tcp_latency_ms
    assert (hw.tcp_setup_ms, hw.tcp_descriptor_ms) == (TCP_SETUP_MS, TCP_DESCRIPTOR_MS) == (0.064, 0.034)
    assert setup_seconds(hw, "tcp") * 1e3 == pytest.approx(0.564)
    assert CostModel(smoke.model, smoke.hardware).kv_descriptors == 56      # 28 layers, K and V


def test_a_tcp_transfer_holds_one_lane_per_descriptor_up_to_four_and_rdma_none():
    assert [peer_lanes("tcp", d) for d in (1, 2, 4, 56)] == [1, 2, 4, 4]
    assert peer_lanes("rdma", 56) == 0


def test_nixl_reads_one_descriptor_per_region_and_block_at_ucxs_measured_setup_and_holds_no_lanes(smoke):
    cost = CostModel(smoke.model, smoke.hardware)
    assert kv_descriptors(cost, "nixl", 4096) == 2 * 28 * 256 and kv_descriptors(cost, "nixl", 17) == 2 * 28 * 2
    assert kv_descriptors(cost, "mooncake", 4096) == 56
    hw = smoke.hardware
    assert setup_seconds(hw, "tcp", 14336, "nixl") * 1e3 == pytest.approx(UCX_TCP_SETUP_MS + hw.tcp_latency_ms)
    assert setup_seconds(hw, "rdma", 14336, "nixl") == setup_seconds(hw, "rdma", 56) == hw.rdma_latency_ms / 1e3
    assert peer_lanes("tcp", 14336, "nixl") == 0 and peer_lanes("tcp", 56) == 4


def test_chunk_prefill_packs_fcfs_and_splits_the_last():
    out = chunk_prefill([(0, 100), (0, 300), (0, 50)], budget=250)
    assert out == [(0, PrefillChunk(start=0, tokens=100)), (1, PrefillChunk(start=0, tokens=150))]


def test_chunk_prefill_resumes_a_partial_prompt_and_skips_done_ones():
    out = chunk_prefill([(300, 300), (100, 300), (0, 40)], budget=1000)
    assert out == [(1, PrefillChunk(start=100, tokens=200)), (2, PrefillChunk(start=0, tokens=40))]


def test_chunk_prefill_with_no_budget_schedules_nothing():
    assert chunk_prefill([(0, 10)], budget=0) == []


@pytest.mark.parametrize("tp, tokens, expected_s", [
    # 1000 tokens × 3584 × 2 B = 7.168 MB; ring: 2·1/2 of it at 450 GB/s = 15.929 µs;
    # latency 6.6 + 2·0.6 = 7.8 µs; 23.729 µs × 2 all-reduces × 28 layers
    (2, 1000, 1.328818e-3),
    # one decode token at TP 4: 7168 B × 2·3/4 at 450 GB/s = 0.0239 µs; latency 6.6 + 6·0.6 = 10.2 µs; × 56
    (4, 1, 5.725380e-4),
])
def test_tp_allreduce_is_a_ring_at_per_direction_nvlink_bandwidth_plus_nccl_latency(smoke, tp, tokens, expected_s):
    nccl = smoke.hardware.model_copy(update={"op_laws": "roofline"})     # a measured all-reduce would replace it
    cm = CostModel(smoke.model, nccl, tp=tp)
    assert cm.allreduce_s(tokens) == pytest.approx(expected_s, rel=1e-6)
    assert CostModel(smoke.model, smoke.hardware, tp=1).allreduce_s(tokens) == 0.0


def test_kv_capacity_is_gpu_memory_left_after_the_weights(cm, smoke):
    # 80 GB × 0.9 − 15.2 GB of weights = 56.8 GB over 57344 B per token (2 × 28 layers × 4 KV heads × 128 × 2 B)
    assert cm.kv_capacity_tokens(0.9) == 990_513
    # TP 2: twice the memory, the same weights
    assert CostModel(smoke.model, smoke.hardware, tp=2).kv_capacity_tokens(0.9) == 2_246_093
    assert cm.kv_capacity_tokens(0.19) == 0            # the weights do not even fit
    # TP 8 over 4 KV heads: each head is held twice, so a token takes twice the bytes: 8 × 72 − 15.2 GB over 114688 B
    assert CostModel(smoke.model, smoke.hardware, tp=8).kv_capacity_tokens(0.9) == int(
        (8 * 80e9 * 0.9 - smoke.model.weight_bytes) / 114_688)


def test_replicated_kv_heads_are_read_and_moved_on_every_gpu_that_holds_them(smoke):
    # Qwen2.5-VL-7B has 4 KV heads: up to TP 4 they are split, at TP 8 each is held on two GPUs
    per_token = smoke.model.kv_bytes_per_token
    assert [smoke.model.kv_bytes_per_token_at(tp) for tp in (1, 2, 4, 8)] == [per_token] * 3 + [2 * per_token]
    tp4, tp8 = (CostModel(smoke.model, smoke.hardware, tp=tp) for tp in (4, 8))
    assert tp8.kv_bytes(1000) == 2 * tp4.kv_bytes(1000) == 2 * 1000 * per_token    # what a transfer into it moves
    # a decode step's KV read: 16000 more context tokens cost TP 8 what they cost TP 4 (twice the bytes over
    # twice the bandwidth), where splitting heads would have halved it
    extra = [cost.step_seconds([16100], []) - cost.step_seconds([100], []) for cost in (tp4, tp8)]
    assert extra[1] == pytest.approx(extra[0], rel=1e-3)
    assert extra[0] == pytest.approx(16000 * per_token / tp4.bytes_per_s, rel=1e-3)


def test_an_engine_starts_only_if_its_kv_cache_holds_one_max_model_len_sequence():
    spec = load_spec("pd-text")                               # Qwen3-32B, max_model_len 32768, 0.9 of 80 GB
    one = CostModel(spec.model, spec.hardware, tp=1)          # 72 − 65.5 GB of weights: 24414 tokens of 256 KiB
    assert one.start_problem(spec.engine) == (
        "To serve at least one request with the models's max seq len (32768), (8.00 GiB KV cache is needed, which "
        "is larger than the available KV cache memory (5.96 GiB). Based on the available memory, the estimated "
        "maximum model length is 24400. Try increasing `gpu_memory_utilization` or decreasing `max_model_len` when "
        "initializing the engine.")
    assert CostModel(spec.model, spec.hardware, tp=2).start_problem(spec.engine) is None
    low = spec.engine.model_copy(update={"gpu_memory_utilization": 0.5})     # the weights alone do not fit
    assert one.start_problem(low).startswith("No available memory for the cache blocks.")
    # the check is on memory, as vLLM's: a num_gpu_blocks_override does not make it start
    assert one.start_problem(spec.engine.model_copy(update={"num_gpu_blocks_override": 4096})) is not None


def test_encoder_cache_is_the_token_budget_raised_to_the_largest_item(smoke):
    model, engine = smoke.model, smoke.engine
    assert max_mm_item_tokens(model, 16384) == 16384          # an image of 12845056 px = 16384 tokens of 28 px
    assert max_mm_item_tokens(model, 40000) == 32768          # a video of 2 frame pairs of that size fits
    assert max_mm_item_tokens(model, 10 ** 6) == 7 * 16384    # at most 14 frames
    assert encoder_cache_tokens(model, engine) == 16384       # max_num_batched_tokens 8192 < 16384
    assert encoder_cache_tokens(model, engine.model_copy(update={"max_num_batched_tokens": 20000})) == 20000
    assert encoder_cache_tokens(model, engine.model_copy(update={"encoder_cache_tokens": 50000})) == 50000
    assert encoder_cache_tokens(model.model_copy(update={"vision": None}), engine) == 0


def test_tokenizing_a_prompt_costs_its_text_tokens_at_the_measured_rate():
    from epdbench.physics.costmodel import tokenize_seconds
    from epdbench.specs.node import TOKENIZE_US_PER_TOKEN
    hw = LINK
    assert hw.tokenize_us_per_token == TOKENIZE_US_PER_TOKEN
    assert tokenize_seconds(hw, 4096) == pytest.approx(4096 * TOKENIZE_US_PER_TOKEN / 1e6)
    assert tokenize_seconds(hw, 0) == tokenize_seconds(hw, -5) == 0.0
    # a fitted rendering cost per prompt (calibrate --engine-steps) adds to each prompt of the batch
    fitted = hw.model_copy(update={"request_render_ms": 3.0})
    assert tokenize_seconds(fitted, 4096, prompts=4) == pytest.approx(4096 * TOKENIZE_US_PER_TOKEN / 1e6 + 0.012)
