"""Physical cost model of one engine step, one KV transfer and one image encode.

Pure functions of the model and hardware figures in the spec. The GPU operators (GEMMs, attention, decode steps,
the vision tower) follow one of two laws, by hardware.op_laws:
- measured (the default): interpolated from operator timings measured on a GPU, by default an H200's
  (physics/data/gpu_ops_h200.csv, benchmarks/gpu/gpu_ops.py), scaled to the node's datasheet figures — for the
  presets' H100 the same compute, memory-bound parts at 3.35 instead of 4.8 TB/s (physics.oplaws,
  physics.measured); a model the timings lack keeps the roofline below;
- roofline, as follows.
- Prefill is compute-bound: 2·P FLOPs per token plus causal attention, over achievable FLOP/s × TP.
- Decode is bandwidth-bound: weights plus the KV of every running sequence read once per step,
  over achievable HBM bandwidth × TP.
- A step costs the larger of the two (roofline; measured: its operators' laws), plus TP all-reduces over NVLink,
  plus a fixed overhead.
- A TP all-reduce, two per layer per step: measured (two H200s, NCCL; hardware.op_laws measured), else a ring as
  NCCL models it: its latency for the ring's 2·(TP−1) steps, plus 2·(TP−1)/TP of the activations over the
  per-direction NVLink bandwidth (physics.allreduce).
- A KV transfer costs a setup (over Mooncake TCP per transfer and per descriptor, measured) and its bytes over
  the sending pod's link, whose bandwidth the transfers in flight share (sim.link).
- An image costs the FLOPs of the vision tower as Qwen2.5-VL builds it (patch embedding, blocks attending within
  windows or over the whole image, gated MLPs, patch merger), or reading the tower's weights if longer.
- Every API server a request passes tokenizes its prompt text on the CPU first: a cost per text token (measured).
- Before that, the API server's CPU decodes and preprocesses each image: a fixed cost plus one per pixel (less
  for an image whose processed output vLLM's processor cache holds: it is only decoded and hashed).
- The KV cache holds what GPU memory leaves after the weights; the encoder cache what vLLM allots it.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from epdbench.physics import allreduce
from epdbench.physics.measured import EngineLaws, engine_laws
from epdbench.specs.node import EngineSpec, HardwareSpec, ModelSpec, VisionSpec

RGB_CHANNELS = 3   # Qwen2.5-VL vision_config.in_channels


@dataclass(frozen=True)
class PrefillChunk:
    start: int   # tokens of this prompt already computed
    tokens: int  # tokens computed in this step


# The image processor's smallest image (Qwen2.5-VL preprocessor_config.json min_pixels: 3136 = 56²); the largest is
# VisionSpec.max_pixels.
MIN_IMAGE_PIXELS = 3136


def image_tokens(model: ModelSpec, width_px: int, height_px: int) -> int:
    """Tokens of one image as the Qwen2-VL image processor resizes it (transformers' `smart_resize`): each side
    to the nearest multiple of the token edge, then, outside [min_pixels, max_pixels], both sides scaled by one
    factor to fit (down: floored to the edge; up: ceiled) — an image over max_pixels is shrunk, not charged in
    full."""
    if model.vision is None:
        return 0
    edge = model.vision.pixels_per_token
    w = max(edge, round(width_px / edge) * edge)
    h = max(edge, round(height_px / edge) * edge)
    if w * h > model.vision.max_pixels:
        beta = math.sqrt(width_px * height_px / model.vision.max_pixels)
        w = max(edge, math.floor(width_px / beta / edge) * edge)
        h = max(edge, math.floor(height_px / beta / edge) * edge)
    elif w * h < MIN_IMAGE_PIXELS:
        beta = math.sqrt(MIN_IMAGE_PIXELS / (width_px * height_px))
        w = math.ceil(width_px * beta / edge) * edge
        h = math.ceil(height_px * beta / edge) * edge
    return (w // edge) * (h // edge)


def max_mm_item_tokens(model: ModelSpec, max_model_len: int) -> int:
    """Tokens of the largest multimodal item, as vLLM 0.33 computes them for the Qwen2-VL family
    (vllm/model_executor/models/qwen2_vl.py `get_mm_max_tokens_per_item`): an image of max_pixels, or a video
    of as many frame pairs of that size as fit in max_model_len (at least one, at most 7:
    `_MAX_FRAMES_PER_VIDEO = 14` frames, two per temporal patch)."""
    if model.vision is None:
        return 0
    image = model.vision.max_pixels // model.vision.pixels_per_token ** 2
    video = image * max(1, min(7, max_model_len // image))
    return max(image, video)


def token_grid(tokens: int) -> tuple[int, int]:
    """Rows and columns of LM tokens of an image known by its token count: the squarest grid (the workloads'
    images are square; only the windowed attention, under 1% of the tower's FLOPs, depends on the shape)."""
    rows = max(1, math.isqrt(tokens))
    return rows, -(-tokens // rows)


def _window_pairs(v: VisionSpec, rows: int, cols: int) -> int:
    """Σ over attention windows of (patches in the window)², for an image of rows × cols LM tokens: windows of
    window_size px tile the token grid from its corner, the last row and column of windows cut short
    (vLLM qwen2_5_vl.py `get_window_index_thw`; 112 px = 4×4 tokens = 8×8 patches)."""
    edge = max(1, v.window_size // v.spatial_merge_size // v.patch_size)   # window edge in LM tokens

    def squares(n: int) -> int:          # Σ over the windows along one edge of (their tokens along it)²
        return edge * edge * (n // edge) + (n % edge) ** 2
    return v.spatial_merge_size ** 4 * squares(rows) * squares(cols)


def vision_flops(v: VisionSpec, rows: int, cols: int) -> float:
    """FLOPs of the vision tower on one image of rows × cols LM tokens, as vLLM runs Qwen2.5-VL's
    (vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionTransformer; one temporal patch per image):
    - patch embedding: a linear map of each patch's 3 · temporal · patch² pixels to hidden_size;
    - per block and patch: qkv (hidden → 3·hidden) and output projection (hidden → hidden), the gated MLP
      (hidden → 2·intermediate, intermediate → hidden); attention QKᵀ and AV, 4 · hidden FLOPs per pair of
      patches that attend: within each window (pairs grow with the image's area) or, in the
      fullatt_block_indexes blocks, over the whole image (pairs grow with its area squared);
    - patch merger per LM token: merge² patches (merge²·hidden) → merge²·hidden → out_hidden_size (embed_dim).
    Norms, activations and rotary embeddings are left out (a few FLOPs per element, not per weight)."""
    d, m = v.hidden_size, v.spatial_merge_size
    tokens = rows * cols
    patches = tokens * m * m
    embed = 2 * RGB_CHANNELS * v.temporal_patch_size * v.patch_size ** 2 * d
    block = 2 * (3 * d * d + d * d + 3 * d * v.intermediate_size)
    merged = m * m * d
    merger = 2 * (merged * merged + merged * v.embed_dim)
    full = len(v.fullatt_block_indexes)
    attention = 4 * d * (full * patches ** 2 + (v.depth - full) * _window_pairs(v, rows, cols))
    return float(patches * (embed + v.depth * block) + tokens * merger + attention)


def image_preprocess_seconds(hw: HardwareSpec, sizes: Iterable[tuple[int, int]],
                             cached: Iterable[tuple[int, int]] = ()) -> float:
    """API-server CPU time on images of these (width, height) before their request reaches the engine: per image,
    hardware.image_preprocess_ms plus image_preprocess_ms_per_mp per megapixel; for the `cached` ones, whose
    processed output vLLM's multimodal processor cache holds, image_decode_ms_per_mp instead (they are still
    decoded and hashed). Figures from benchmarks/serving/image_preprocess.py."""
    full = sum(hw.image_preprocess_ms + hw.image_preprocess_ms_per_mp * w * h / 1e6 for w, h in sizes)
    hits = sum(hw.image_preprocess_ms + hw.image_decode_ms_per_mp * w * h / 1e6 for w, h in cached)
    return (full + hits) / 1e3


# vLLM's API server tokenizes through AsyncMicrobatchTokenizer(batch_wait_timeout_s=0.002), vllm/utils/async_utils.py:
# a prompt waits this long for others to batch with before its batch is tokenized (sim.apiserver)
TOKENIZER_BATCH_WAIT_S = 0.002


def tokenize_seconds(hw: HardwareSpec, text_tokens: int, prompts: int = 1) -> float:
    """API-server CPU time to tokenize `prompts` prompts of `text_tokens` text tokens in all (image placeholders are
    expanded by the multimodal processor, not the BPE): hardware.tokenize_us_per_token each, from
    benchmarks/serving/tokenize_cost.py, and hardware.request_render_ms per prompt (0 unless fitted)."""
    return (hw.tokenize_us_per_token * max(0, text_tokens) / 1e6
            + hw.request_render_ms * max(0, prompts) / 1e3)


def output_seconds(hw: HardwareSpec, tokens: int) -> float:
    """API-server CPU time to hand `tokens` generated tokens to their clients: per token, vLLM's output processor
    (incremental detokenization, the RequestOutput) and the OpenAI server's SSE chunk, hardware.output_us_per_token
    each, from benchmarks/serving/output_cost.py."""
    return hw.output_us_per_token * max(0, tokens) / 1e6


def encoder_cache_tokens(model: ModelSpec, engine: EngineSpec) -> int:
    """Encoder cache size of one engine in image tokens: vLLM 0.33 gives it max_num_batched_tokens, raised to the
    largest multimodal item (vllm/v1/core/encoder_cache_manager.py `compute_mm_encoder_budget`)."""
    if model.vision is None:
        return 0
    return max(engine.encoder_cache_tokens or engine.max_num_batched_tokens,
               max_mm_item_tokens(model, engine.max_model_len))


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
        """The step's TP all-reduces: two per layer (after attention and after the MLP) of the tokens' activations,
        each by physics.allreduce (measured on two H200s where the measurement has this TP; NCCL's ring constants
        and the datasheet's NVLink otherwise)."""
        if self.tp == 1 or tokens == 0:
            return 0.0
        m = self.model
        return 2 * m.n_layers * allreduce.seconds(self.hw, self.tp, tokens * m.hidden_size * m.dtype_bytes)

    def decode_attention_flops(self, n: int, context_sum: int) -> float:
        """attention_flops of `n` decodes, one query each over its context, the contexts adding up to `context_sum`."""
        m = self.model
        return 4.0 * m.n_layers * m.n_heads * m.head_dim * (context_sum + 0.5 * n)

    def step_seconds(self, decode_contexts: list[int], prefill: list[PrefillChunk],
                     encoder_images: Sequence[int] = (), pass_fixed: bool = True) -> float:
        """Duration of one continuous-batching step; `encoder_images` are the LM tokens of each image it encodes
        (without the vision pass's fixed time where `pass_fixed` is false: a step before it spent it, sim.engine)."""
        if not prefill and not any(encoder_images):
            return self.decode_step_seconds(len(decode_contexts), sum(decode_contexts))
        m = self.model
        n_tokens = len(decode_contexts) + sum(c.tokens for c in prefill)
        if n_tokens == 0 and not any(encoder_images):
            return 0.0
        if self.laws is not None:
            gpu = self.laws.step_s(decode_contexts, prefill) if n_tokens else 0.0
            return (gpu + self.allreduce_s(n_tokens) + self.encode_seconds(encoder_images, pass_fixed)
                    + self.hw.step_overhead_ms / 1e3)
        flops = 2.0 * m.params_b * 1e9 * n_tokens
        flops += sum(self.attention_flops(c.start, c.tokens) for c in prefill)
        flops += self.decode_attention_flops(len(decode_contexts), sum(decode_contexts))
        bytes_read = m.weight_bytes if n_tokens else 0.0
        bytes_read += self.kv_bytes_held_per_token * sum(decode_contexts)
        compute_s = flops / self.flops_per_s
        memory_s = bytes_read / self.bytes_per_s
        return (max(compute_s, memory_s) + self.allreduce_s(n_tokens)
                + self.encode_seconds(encoder_images, pass_fixed) + self.hw.step_overhead_ms / 1e3)

    @functools.cached_property
    def laws(self) -> EngineLaws | None:
        """The measured operator laws of this engine (physics.measured), or None: the roofline."""
        return engine_laws(self.model, self.hw, self.tp)

    def decode_step_seconds(self, n: int, context_sum: int) -> float:
        """step_seconds of a step of `n` decodes whose contexts add up to `context_sum` and nothing else
        (decode_law); sim.fused evaluates the same law for a run of such steps."""
        return self.decode_law(n)(context_sum) if n else 0.0

    def decode_law(self, n: int):
        """A decode-only step of `n` sequences as a function of their context sum S, kept per n. Measured: the
        decode-step law (physics.measured). Roofline: the larger of compute a + b·S (weights' FLOPs and one
        query's attention over each context, decode_attention_flops) and memory c + d·S (the weights and every
        context's KV read once, replicated KV heads on every GPU that holds them). Plus TP all-reduces and the
        step overhead."""
        law = self._decode_laws.get(n)
        if law is None:
            tail = self.allreduce_s(n) + self.hw.step_overhead_ms / 1e3
            if self.laws is not None:
                gpu = self.laws.decode_fn(n)

                def law(s: float) -> float:
                    return gpu(s) + tail
            else:
                m = self.model
                attention = 4.0 * m.n_layers * m.n_heads * m.head_dim
                a = (2.0 * m.params_b * 1e9 * n + attention * 0.5 * n) / self.flops_per_s
                b, c = attention / self.flops_per_s, m.weight_bytes / self.bytes_per_s
                d = self.kv_bytes_held_per_token / self.bytes_per_s

                def law(s: float) -> float:
                    return max(a + b * s, c + d * s) + tail
            self._decode_laws[n] = law
        return law

    @functools.cached_property
    def _decode_laws(self) -> dict:
        return {}

    @property
    def vision_pass_s(self) -> float:
        """The fixed time of a vision pass beside its law (hardware.vision_pass_ms; 0 unless fitted)."""
        return self.hw.vision_pass_ms / 1e3 if self.model.vision is not None else 0.0

    def encode_seconds(self, image_tokens: int | Iterable[int], pass_fixed: bool = True) -> float:
        """One vision-tower pass over images of these LM-token counts (an int: one image). Measured: the vision
        tower's law (physics.measured: a fixed cost per pass, what grows with the pass's tokens, each image's
        full attention, the launch floor). Roofline: their FLOPs
        (vision_flops) at the achievable FLOP/s, or reading the tower's weights once at the achievable HBM
        bandwidth if that is longer (the roofline of a step). Each image attends only within itself (vLLM's
        cu_seqlens), so full attention grows with each image's area squared, not with the batch's. Plus
        hardware.vision_pass_ms per pass (0 unless fitted)."""
        v = self.model.vision
        counts = [image_tokens] if isinstance(image_tokens, int) else [n for n in image_tokens if n]
        if v is None or not any(counts):
            return 0.0
        fixed = self.vision_pass_s if pass_fixed else 0.0      # 0 unless fitted (calibrate --engine-steps)
        if self.laws is not None and self.laws.has_vision:
            return self.laws.encode_s([n for n in counts if n]) + fixed
        flops = sum(vision_flops(v, *token_grid(n)) for n in counts if n)
        weights = v.params_b * 1e9 * self.model.dtype_bytes
        return max(flops / self.flops_per_s, weights / self.bytes_per_s) + fixed

    def kv_bytes(self, tokens: int) -> int:
        """KV bytes of `tokens` tokens on this engine's TP group (kv_bytes_held_per_token): what a KV transfer into
        this engine moves."""
        return self.kv_bytes_held_per_token * tokens

    @property
    def kv_descriptors(self) -> int:
        """Descriptors of one KV transfer as vLLM's MooncakeConnector sends it (mooncake_connector.py
        `_build_transfer_params`): one per layer and K/V region for each run of blocks contiguous on both sides. A
        sequence's blocks are taken as one run (a fragmented cache has more); vLLM's example metrics line
        "Avg number of descriptors=56.0" is 2 × 28 layers of Qwen2.5-VL-7B."""
        return 2 * self.model.n_layers

    def nixl_descriptors(self, tokens: int) -> int:
        """Descriptors of one KV READ as vLLM's NixlConnector posts it (nixl/base_worker.py `_get_block_descs_ids`):
        one per KV region (layer and K/V) and block, no merging of contiguous blocks."""
        return 2 * self.model.n_layers * max(1, math.ceil(tokens / KV_BLOCK_TOKENS))

    def kv_capacity_tokens(self, gpu_memory_utilization: float) -> int:
        """KV cache of one engine in tokens: the memory vLLM may use on its TP GPUs (HBM × gpu_memory_utilization
        × TP) less the weights, over the KV bytes of one token — times the copies of each KV head when TP exceeds
        their number (QKVParallelLinear then replicates them: every GPU holds one). (vLLM's profiling run also
        subtracts the peak activations and CUDA graphs, which this leaves out.)"""
        total = self.hw.hbm_gb * 1e9 * gpu_memory_utilization * self.tp
        return max(0, int((total - self.model.weight_bytes) / self.kv_bytes_held_per_token))

    @functools.cached_property
    def kv_bytes_held_per_token(self) -> int:
        """KV bytes one token takes on the engine's TP GPUs together (ModelSpec.kv_bytes_per_token_at)."""
        return self.model.kv_bytes_per_token_at(self.tp)

    def start_problem(self, engine: EngineSpec) -> str | None:
        """Why vLLM would refuse to start this engine, in its words (check_enough_kv_cache_memory,
        vllm/v1/core/kv_cache_utils.py), or None: the memory left for the KV cache (kv_capacity_tokens, on each
        GPU; vLLM checks it before any num_gpu_blocks_override) must be positive and hold one max_model_len
        sequence. The estimate errs both ways, by a few GB each: vLLM also subtracts the profiled activations and
        CUDA graphs (left out here), and takes the GPU's memory as torch reports it (an H100 "80 GB": 79.2 GiB,
        85.0e9 B, where hardware.hbm_gb is 80e9 B). A case within a few GB of the limit may go either way; a
        published vLLM log of a 32B model with Qwen3-32B's KV shape on one H100 at 32768 tokens reads 8.00 GiB
        needed, 4.46 GiB available, where this says 5.96."""
        tokens = self.kv_capacity_tokens(engine.gpu_memory_utilization)
        if tokens <= 0:
            return ("No available memory for the cache blocks. Try increasing `gpu_memory_utilization` when "
                    "initializing the engine.")
        if tokens >= engine.max_model_len:
            return None
        per_gpu = self.kv_bytes_held_per_token / self.tp / 2 ** 30     # GiB per token on each GPU
        return (f"To serve at least one request with the models's max seq len ({engine.max_model_len}), "
                f"({engine.max_model_len * per_gpu:.2f} GiB KV cache is needed, which is larger than the available "
                f"KV cache memory ({tokens * per_gpu:.2f} GiB). Based on the available memory, the estimated maximum "
                f"model length is {tokens // KV_BLOCK_TOKENS * KV_BLOCK_TOKENS}. Try increasing "
                "`gpu_memory_utilization` or decreasing `max_model_len` when initializing the engine.")

    def embedding_bytes(self, image_tokens_total: int) -> int:
        if self.model.vision is None:
            return 0
        return image_tokens_total * self.model.vision.embed_dim * self.model.dtype_bytes


# How Mooncake's TCP transport moves a batch of transfer requests (kvcache-ai/Mooncake snapshot 3b5a594,
# 2026-08-22, mooncake-transfer-engine/src/transport/tcp_transport/, plus PR #3569, in v0.3.13, which turns the
# connection pool on by default; the installed 0.3.13.post1 behaves so):
# - `TcpTransport::submitTransfer` makes one Slice per request (`prepareTransfer`): TCP does not cut a request
#   into slices as RDMA does (MC_SLICE_SIZE); each request goes whole over one connection. vLLM's
#   MooncakeConnector sends a request's KV as one batch of CostModel.kv_descriptors requests.
# - `startTransfer` → `enqueuePooledTransfer` (tcp_transport_lane_impl.h): requests to one peer queue, first come
#   first served (`runGroupPump` hands the queue's front to an idle lane), for MC_TCP_LANES_PER_PEER (4) kept
#   connections (lanes) per peer. On its lane a ClientSession (tcp_transport_session_impl.h) writes a 17-byte
#   header and the body in async_writes of MC_TCP_SLICE_SIZE (64 KiB, `getChunkSize`), and completes when the
#   receiver's 8-byte status frame says the last chunk landed (protocol v2). With MC_TCP_ENABLE_CONNECTION_POOL=0
#   each request opens a connection of its own instead (`getConnection`, in the submitting thread).
# - Threads: one per engine (`install` starts `TcpTransport::worker`, running the engine's asio io_context): every
#   lane's writes, and every accepted session's reads (`TcpContext::doAccept`, `ServerSession::readBody`), are
#   handlers on that one thread, interleaved chunk by chunk.
# benchmarks/transport/mooncake_tcp.py measured it with the real engine (2026-12-01): a setup per transfer and per
# further descriptor (HardwareSpec.tcp_setup_ms, tcp_descriptor_ms); transfers in flight neither add up nor serialise
# but share (aggregate throughput flat, all end together after about N times one alone); to one peer only 4 at a time
# (the 5th waits for a lane), so two KV transfers of 56 descriptors to one peer go one after the other, and to
# two peers share. RDMA (rdma_transport.cpp, worker_pool.cpp) cuts requests into 64 KiB slices posted over queue
# pairs of endpoints kept per peer: one latency per transfer, no lanes; its transfers share the NICs.

MOONCAKE_TCP_LANES_PER_PEER = 4   # tcp_transport.h ConnectionLaneState::lanes_per_peer (MC_TCP_LANES_PER_PEER)
KV_BLOCK_TOKENS = 16              # vLLM's KV cache block on CUDA: CacheConfig.DEFAULT_BLOCK_SIZE (vllm/config/cache.py)
# NIXL over UCX (NixlConnector): the decode READs the prefill's blocks, one descriptor per region and block
# (CostModel.nixl_descriptors), all posted as one transfer request. Over TCP UCX emulates each remote read with
# active messages on its tcp lanes (the `rma_am` lanes its endpoint lines show): a setup per transfer, measured with
# the real NIXL 1.5.1 / UCX 1.23.0 by benchmarks/transport/nixl_ucx.py (HardwareSpec ucx_tcp_setup_ms); a cost per
# further descriptor was not resolvable above the noise there (ucx_tcp_descriptor_ms 0: UCX pipelines them). Over RDMA
# each descriptor is a work request posted in the same batch: one latency per transfer (rdma_latency_ms, as Mooncake's).
# UCX keeps no per-peer queue of transfers (no lanes).


def link_bytes_per_s(hw: HardwareSpec, transport: str, rdma_interfaces: int = 1) -> float:
    if transport == "rdma":
        return hw.rdma_nic_gbit_s / 8 * 1e9 * hw.rdma_efficiency * max(1, rdma_interfaces)
    return hw.tcp_gb_s * 1e9


def setup_seconds(hw: HardwareSpec, transport: str, descriptors: int = 1, connector: str = "mooncake") -> float:
    """The part of one transfer that moves no bytes over the link: over TCP the engine's setup per transfer and per
    further descriptor (Mooncake's or UCX's, by `connector`), plus the network's latency per transfer; over RDMA one
    latency per transfer."""
    if transport == "rdma":
        return hw.rdma_latency_ms / 1e3
    setup, per_descriptor = ((hw.ucx_tcp_setup_ms, hw.ucx_tcp_descriptor_ms) if connector == "nixl"
                             else (hw.tcp_setup_ms, hw.tcp_descriptor_ms))
    return (setup + (max(1, descriptors) - 1) * per_descriptor + hw.tcp_latency_ms) / 1e3


def peer_lanes(transport: str, descriptors: int = 1, connector: str = "mooncake") -> int:
    """How many of the sending engine's lanes to one peer a transfer holds while it runs: over Mooncake TCP one per
    descriptor, at most MC_TCP_LANES_PER_PEER (the peer's further transfers wait, first come first served);
    RDMA and UCX have no such lanes (0)."""
    return min(max(1, descriptors), MOONCAKE_TCP_LANES_PER_PEER) if transport == "tcp" and connector == "mooncake" \
        else 0


def kv_descriptors(cost: "CostModel", connector: str, tokens: int) -> int:
    """Descriptors of one request's KV transfer under the connector (MooncakeConnector: per region; NixlConnector:
    per region and block)."""
    return cost.nixl_descriptors(tokens) if connector == "nixl" else cost.kv_descriptors


def transfer_seconds(hw: HardwareSpec, transport: str, n_bytes: int, rdma_interfaces: int = 1,
                     descriptors: int = 1, connector: str = "mooncake") -> float:
    """One transfer alone on the sending pod's link: its setup, then its bytes at the link's bandwidth. Transfers
    in flight together share the bandwidth (sim.link.Link)."""
    return (setup_seconds(hw, transport, descriptors, connector)
            + n_bytes / link_bytes_per_s(hw, transport, rdma_interfaces))


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

