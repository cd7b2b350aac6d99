"""physics/costmodel.py: roofline step times, image tokens, KV transfer times, FCFS chunked prefill."""
from __future__ import annotations

import pytest

from epdbench.physics.costmodel import CostModel, PrefillChunk, chunk_prefill, image_tokens, transfer_seconds
from epdbench.specs.models import load_spec

GiB = 2 ** 30


@pytest.fixture(scope="module")
def smoke():
    return load_spec("smoke")


@pytest.fixture(scope="module")
def cm(smoke):
    return CostModel(smoke.model, smoke.hardware, tp=1)


def overhead_s(cm):
    return cm.hw.step_overhead_ms / 1e3


@pytest.mark.parametrize("px, tokens", [(560, 400), (840, 900), (1260, 2025), (1792, 4096)])
def test_image_tokens_match_qwen25_vl(smoke, px, tokens):
    assert image_tokens(smoke.model, px, px) == tokens


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
    assert tcp == pytest.approx(GiB / (hw.tcp_gb_s * 1e9) + hw.tcp_latency_ms / 1e3)
    assert rdma == pytest.approx(GiB / (hw.rdma_nic_gbit_s / 8 * 1e9 * hw.rdma_efficiency) + hw.rdma_latency_ms / 1e3)
    assert rdma < tcp / 10          # 3 GB/s TCP vs 40 GB/s on one 400 Gbit/s NIC
    assert transfer_seconds(hw, "rdma", GiB, rdma_interfaces=2) == pytest.approx(
        (rdma - hw.rdma_latency_ms / 1e3) / 2 + hw.rdma_latency_ms / 1e3)


def test_chunk_prefill_packs_fcfs_and_splits_the_last():
    out = chunk_prefill([(0, 100), (0, 300), (0, 50)], budget=250)
    assert out == [(0, PrefillChunk(start=0, tokens=100)), (1, PrefillChunk(start=0, tokens=150))]


def test_chunk_prefill_resumes_a_partial_prompt_and_skips_done_ones():
    out = chunk_prefill([(300, 300), (100, 300), (0, 40)], budget=1000)
    assert out == [(1, PrefillChunk(start=100, tokens=200)), (2, PrefillChunk(start=0, tokens=40))]


def test_chunk_prefill_with_no_budget_schedules_nothing():
    assert chunk_prefill([(0, 10)], budget=0) == []
