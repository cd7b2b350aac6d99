"""Physical cost model of one engine step, one KV transfer and one image encode.

Pure functions of the model and hardware figures in the spec: no fitting to any benchmark.
- Prefill is compute-bound: 2·P FLOPs per token plus causal attention, over achievable FLOP/s × TP.
- Decode is bandwidth-bound: weights plus the KV of every running sequence read once per step,
  over achievable HBM bandwidth × TP.
- A step costs the larger of the two (roofline), plus TP all-reduces over NVLink, plus a fixed overhead.
- A KV transfer costs bytes / link bandwidth + latency; an image costs its vision FLOPs.
"""
from __future__ import annotations

from dataclasses import dataclass

from epdbench.specs.models import HardwareSpec, ModelSpec


@dataclass(frozen=True)
class PrefillChunk:
    start: int   # tokens of this prompt already computed
    tokens: int  # tokens computed in this step


def image_tokens(model: ModelSpec, width_px: int, height_px: int) -> int:
    """Tokens of one image after resizing to the nearest multiple of the token edge (Qwen2.5-VL)."""
    if model.vision is None:
        return 0
    edge = model.vision.pixels_per_token
    w = max(edge, round(width_px / edge) * edge)
    h = max(edge, round(height_px / edge) * edge)
    return (w // edge) * (h // edge)


@dataclass(frozen=True)
class CostModel:
    model: ModelSpec
    hw: HardwareSpec
    tp: int = 1

    @property
    def flops_per_s(self) -> float:
        return self.hw.bf16_tflops * 1e12 * self.hw.compute_efficiency * self.tp

    @property
    def bytes_per_s(self) -> float:
        return self.hw.hbm_tb_s * 1e12 * self.hw.hbm_efficiency * self.tp

    def attention_flops(self, start: int, tokens: int) -> float:
        # QK^T and AV for `tokens` new queries over a causal context starting at `start`.
        m = self.model
        avg_ctx = start + tokens / 2
        return 4.0 * m.n_layers * m.n_heads * m.head_dim * tokens * avg_ctx

    def allreduce_s(self, tokens: int) -> float:
        if self.tp == 1 or tokens == 0:
            return 0.0
        m = self.model
        per_allreduce = tokens * m.hidden_size * m.dtype_bytes * 2 * (self.tp - 1) / self.tp
        return 2 * m.n_layers * per_allreduce / (self.hw.nvlink_gb_s * 1e9)

    def step_seconds(self, decode_contexts: list[int], prefill: list[PrefillChunk],
                     encoder_tokens: int = 0) -> float:
        """Duration of one continuous-batching step."""
        m = self.model
        n_tokens = len(decode_contexts) + sum(c.tokens for c in prefill)
        if n_tokens == 0 and encoder_tokens == 0:
            return 0.0
        flops = 2.0 * m.params_b * 1e9 * n_tokens
        flops += sum(self.attention_flops(c.start, c.tokens) for c in prefill)
        flops += sum(self.attention_flops(ctx, 1) for ctx in decode_contexts)
        bytes_read = m.weight_bytes if n_tokens else 0.0
        bytes_read += m.kv_bytes_per_token * sum(decode_contexts)
        compute_s = flops / self.flops_per_s
        memory_s = bytes_read / self.bytes_per_s
        return (max(compute_s, memory_s) + self.allreduce_s(n_tokens)
                + self.encode_seconds(encoder_tokens) + self.hw.step_overhead_ms / 1e3)

    def encode_seconds(self, image_tokens_total: int) -> float:
        """Vision tower compute for images worth `image_tokens_total` LM tokens (4 patches per token)."""
        if image_tokens_total == 0 or self.model.vision is None:
            return 0.0
        patches = image_tokens_total * 4
        return 2.0 * self.model.vision.params_b * 1e9 * patches / self.flops_per_s

    def kv_bytes(self, tokens: int) -> int:
        return self.model.kv_bytes_per_token * tokens

    def embedding_bytes(self, image_tokens_total: int) -> int:
        if self.model.vision is None:
            return 0
        return image_tokens_total * self.model.vision.embed_dim * self.model.dtype_bytes


def link_bytes_per_s(hw: HardwareSpec, transport: str, rdma_interfaces: int = 1) -> float:
    if transport == "rdma":
        return hw.rdma_nic_gbit_s / 8 * 1e9 * hw.rdma_efficiency * max(1, rdma_interfaces)
    return hw.tcp_gb_s * 1e9


def transfer_seconds(hw: HardwareSpec, transport: str, n_bytes: int, rdma_interfaces: int = 1) -> float:
    latency_ms = hw.rdma_latency_ms if transport == "rdma" else hw.tcp_latency_ms
    return n_bytes / link_bytes_per_s(hw, transport, rdma_interfaces) + latency_ms / 1e3


def chunk_prefill(remaining: list[tuple[int, int]], budget: int) -> list[tuple[int, PrefillChunk]]:
    """Pack prefill chunks FCFS into a token budget. `remaining` holds (computed, prompt_len) per
    waiting sequence; returns (index, chunk) for those scheduled this step."""
    out: list[tuple[int, PrefillChunk]] = []
    for i, (done, total) in enumerate(remaining):
        if budget <= 0:
            break
        n = min(total - done, budget)
        if n <= 0:
            continue
        out.append((i, PrefillChunk(start=done, tokens=n)))
        budget -= n
    return out

