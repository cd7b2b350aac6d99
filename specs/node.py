"""The served model, the GPU node and vLLM's engine limits."""
from __future__ import annotations

import functools
import hashlib
from typing import Literal

from pydantic import Field, model_validator

from epdbench.physics.gpu_ops import GpuOpsError, parse_ops_csv
from epdbench.specs.base import Strict


class VisionSpec(Strict):
    """The vision tower. The structure's defaults are Qwen2.5-VL-7B-Instruct's config.json `vision_config` (the
    same in the 3B and 72B models but for out_hidden_size), as vLLM builds it
    (vllm/model_executor/models/qwen2_5_vl.py Qwen2_5_VisionTransformer)."""
    params_b: float = Field(gt=0, title="Vision encoder parameters (billions)",
                            description="Parameter count of the vision tower, from the model config (Qwen2.5-VL-7B: "
                                        "0.67): its weights are read once per encoder pass.")
    pixels_per_token: int = Field(28, ge=1, title="Pixels per image token (edge)",
                                  description="Edge length in pixels covered by one image token "
                                              "(Qwen2.5-VL: 14-px patches merged 2x2 = 28).")
    embed_dim: int = Field(gt=0, title="Image embedding width",
                           description="Width of one image token's embedding handed to the language model "
                                       "(config vision_config.out_hidden_size, the LM's hidden size: 3584).")
    patch_size: int = Field(14, ge=1, title="Patch edge (px)",
                            description="vision_config.patch_size: the patch embedding's spatial kernel.")
    temporal_patch_size: int = Field(2, ge=1, title="Frames per patch",
                                     description="vision_config.temporal_patch_size: an image is repeated to fill "
                                                 "the patch embedding's temporal kernel.")
    spatial_merge_size: int = Field(2, ge=1, title="Patches merged per token (edge)",
                                    description="vision_config.spatial_merge_size: the patch merger joins "
                                                "merge×merge patches into one LM token.")
    depth: int = Field(32, ge=1, title="Vision blocks", description="vision_config.depth: transformer blocks.")
    hidden_size: int = Field(1280, ge=1, title="Vision hidden size", description="vision_config.hidden_size.")
    intermediate_size: int = Field(3420, ge=1, title="Vision MLP width",
                                   description="vision_config.intermediate_size of each block's gated (SiLU) MLP.")
    window_size: int = Field(112, ge=1, title="Attention window (px)",
                             description="vision_config.window_size: a windowed block attends within squares of "
                                         "this edge (112 px = 8×8 patches).")
    fullatt_block_indexes: tuple[int, ...] = Field((7, 15, 23, 31), title="Full-attention blocks",
                                                   description="vision_config.fullatt_block_indexes: the blocks "
                                                               "that attend over the whole image; the others "
                                                               "attend within windows.")
    max_pixels: int = Field(12_845_056, ge=1, title="Largest image (pixels)",
                            description="The image processor's max_pixels (Qwen2.5-VL preprocessor_config.json: "
                                        "12845056, i.e. 16384 tokens): bounds vLLM's largest multimodal item, "
                                        "hence its encoder cache size.")

    @model_validator(mode="after")
    def _structure_agrees(self) -> VisionSpec:
        if self.pixels_per_token != self.patch_size * self.spatial_merge_size:
            raise ValueError(f"pixels_per_token {self.pixels_per_token} is not patch_size × spatial_merge_size "
                             f"({self.patch_size} × {self.spatial_merge_size})")
        if any(not 0 <= i < self.depth for i in self.fullatt_block_indexes):
            raise ValueError(f"fullatt_block_indexes {list(self.fullatt_block_indexes)} must lie in 0..depth-1 "
                             f"({self.depth - 1})")
        return self


class ModelSpec(Strict):
    name: str = Field(title="Model", description="Hugging Face model id served by every configuration.")
    params_b: float = Field(gt=0, title="Language-model parameters (billions)",
                            description="Parameters read per decode step and multiplied per prefill token.")
    n_layers: int = Field(gt=0, title="Layers", description="Transformer layers (model config num_hidden_layers).")
    hidden_size: int = Field(gt=0, title="Hidden size", description="Model config hidden_size.")
    n_heads: int = Field(gt=0, title="Attention heads", description="Model config num_attention_heads.")
    n_kv_heads: int = Field(gt=0, title="KV heads", description="Model config num_key_value_heads (GQA).")
    head_dim: int = Field(gt=0, title="Head dimension", description="Model config head_dim.")
    dtype_bytes: int = Field(2, ge=1, le=4, title="Bytes per weight/KV element",
                             description="2 for bf16/fp16.")
    chat_overhead_tokens: int = Field(23, ge=0, title="Chat template tokens",
                                      description="Tokens the chat template adds around one user message.")
    vision: VisionSpec | None = Field(None, title="Vision tower",
                                      description="Present for multimodal models; absent for text-only ones.")

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.n_layers * self.n_kv_heads * self.head_dim * self.dtype_bytes

    def kv_bytes_per_token_at(self, tp: int) -> int:
        """KV bytes one token takes on a TP group of `tp` GPUs together: kv_bytes_per_token, times the copies of
        each KV head when TP exceeds their number (vLLM's QKVParallelLinear then replicates them: every GPU holds
        one). What a decode engine reads per token and step, and what a KV transfer into an engine of this TP
        moves: every rank receives its own shard once (vLLM mooncake_connector.py `_compute_sender_transfer_plan`:
        at equal TP each prefill rank sends its whole shard to its peer, replicated heads included; across TP
        sizes each receiving rank gets its heads from one sender)."""
        return self.kv_bytes_per_token * max(1, tp // self.n_kv_heads)

    def tp_problem(self, tp: int) -> str | None:
        """Why vLLM refuses to shard this model over `tp` GPUs, or None. vLLM's ModelConfig
        (verify_with_parallel_config) needs TP to divide num_attention_heads ("Total number of attention heads
        (28) must be divisible by tensor parallel size (3)"); QKVParallelLinear (model_executor/layers/linear.py)
        splits the KV heads over TP, so TP divides them, or from TP = their number on replicates them, so their
        number divides TP. (The vision tower's heads are split likewise; for Qwen2.5-VL its 16 heads admit
        every TP the language model does.)"""
        if self.n_heads % tp:
            return f"vLLM needs it to divide the model's {self.n_heads} attention heads"
        if (self.n_kv_heads % tp) if tp < self.n_kv_heads else (tp % self.n_kv_heads):
            return (f"vLLM splits the model's {self.n_kv_heads} KV heads over TP (or replicates them), so one of "
                    "the two must divide the other")
        return None

    def valid_tps(self, most: int) -> list[int]:
        """The TP sizes up to `most` that vLLM accepts for this model."""
        return [tp for tp in range(1, most + 1) if self.tp_problem(tp) is None]

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes


TOKENIZE_US_PER_TOKEN = 0.91   # benchmarks/serving/tokenize_cost.py, see HardwareSpec.tokenize_us_per_token
# vLLM 0.33.0's own output path (msgpack decode of the engine core's outputs, OutputProcessor with incremental
# detokenization, the chat stream generator with continuous usage, as epdbench asks) per generated token, measured
# by benchmarks/serving/output_cost.py on 2026-12-02 on this project's 2-core VM: 44.1, 33.6, 31.9, 36.1 µs at 1, 8, 64
# and 256 requests per step (median of 5 runs each); the median at 8 and more. Host CPUs differ: re-measure.
OUTPUT_US_PER_TOKEN = 33.6
# The HTTP simulator's host time per exchange of a request's path (vllm-router or the EPD proxy, aiohttp API
# servers, loopback), from benchmarks/simulator/vtime_agreement.py on smoke (2026-12-02): TTFT over HTTP minus virtual
# at concurrency 1, per exchange (aggregated 1, PD and text-only EPD 3, EPD with an image 5), median 3.3 ms.
REQUEST_HOP_MS = 3.3
# Mooncake TCP's fixed costs, measured with the real transfer engine (mooncake-transfer-engine-non-cuda
# 0.3.13.post1) over loopback by benchmarks/transport/mooncake_tcp.py on 2026-12-01, on this project's 2-core AMD EPYC
# VM (Linux 6.18, load average 0.7): the intercept of one transfer's time against its size (64 KiB to 512 MiB), and the
# slope of a transfer's time against its number of descriptors (1 to 128, at 1 MiB and 16 MiB: 0.032, 0.035 ms).
TCP_SETUP_MS = 0.064
TCP_DESCRIPTOR_MS = 0.034
# NIXL over UCX TCP's fixed costs, measured with the real NIXL 1.5.1 (nixl-cu12 wheel, bundling UCX 1.23.0) over
# loopback by benchmarks/transport/nixl_ucx.py (UCX_TLS=tcp) on 2026-12-01, same VM, three runs: the intercept of one
# READ's time against its size (64 KiB to 256 MiB; fits 0.032, 0.022, 0.005 ms: the median), and the slope of a READ's
# time against its descriptors (1 to 1024 at 16 and 64 MiB, 16 KiB to 64 KiB each): -0.033 to +0.015 ms, no cost
# resolvable above the noise (UCX pipelines the descriptors of one request), so none is modelled. Loopback moved
# 460-540 MB/s per READ (Mooncake's engine 1.3-1.8 GB/s on the same host): a figure of this host's CPU, not of a
# link; the link stays hardware.tcp_gb_s.
UCX_TCP_SETUP_MS = 0.022
UCX_TCP_DESCRIPTOR_MS = 0.0


@functools.lru_cache(maxsize=16)
def _csv_gpus(text: str) -> tuple[str, ...]:
    """The GPUs a gpu_ops CSV names (physics.gpu_ops.parse_ops_csv: GpuOpsError on a bad cell)."""
    return tuple(sorted({r.gpu for r in parse_ops_csv(text, "op_timings.csv")}))


class OperatorTimings(Strict):
    """Operator timings measured on a GPU by benchmarks/gpu/gpu_ops.py, carried whole: the measured operator laws
    (hardware.op_laws) are derived from them (physics.oplaws). `epdbench calibrate --ops CSV` writes them into
    a profile."""
    source: str = Field(title="Source", description="The gpu_ops CSV the timings were read from.")
    gpu: str = Field(title="Measured GPU", description="The GPU the CSV's rows name (its gpu column).")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", title="CSV digest", description="sha256 of the CSV's text.")
    bf16_tflops: float | None = Field(None, gt=0, title="Measured GPU's peak dense BF16 TFLOP/s",
                                      description="From its datasheet: the laws' compute-bound parts scale by "
                                                  "this node's figure over it. Absent: the node's own "
                                                  "(bf16_tflops), the timings being taken as made on it.")
    hbm_tb_s: float | None = Field(None, gt=0, title="Measured GPU's HBM bandwidth (TB/s)",
                                   description="From its datasheet: the laws' memory-bound parts scale by this "
                                               "node's figure over it. Absent: the node's own (hbm_tb_s).")
    csv: str = Field(title="CSV", description="The CSV's text, as benchmarks/gpu/gpu_ops.py wrote it.")

    @model_validator(mode="after")
    def _csv_agrees(self) -> OperatorTimings:
        try:
            gpus = _csv_gpus(self.csv)
        except GpuOpsError as e:
            raise ValueError(str(e)) from None
        if hashlib.sha256(self.csv.encode()).hexdigest() != self.sha256:
            raise ValueError("sha256 is not the digest of csv: the timings were edited; write them again with "
                             "epdbench calibrate --ops")
        if gpus != (self.gpu,):
            raise ValueError(f"gpu {self.gpu!r} is not the GPU of the CSV's rows ({', '.join(gpus)})")
        return self


class HardwareSpec(Strict):
    gpu: str = Field(title="GPU", description="GPU model of the node, e.g. H100-SXM5-80GB.")
    gpus_per_node: int = Field(8, ge=1, le=16, title="GPUs on the node",
                               description="A configuration may not use more GPUs than this.")
    bf16_tflops: float = Field(gt=0, title="Peak dense BF16 TFLOP/s per GPU", description="From the datasheet.")
    hbm_tb_s: float = Field(gt=0, title="HBM bandwidth (TB/s) per GPU", description="From the datasheet.")
    hbm_gb: float = Field(80, gt=0, title="HBM capacity (GB) per GPU",
                          description="From the datasheet; bounds the KV cache (and so the prefix cache).")
    nvlink_gb_s: float = Field(gt=0, title="NVLink bandwidth (GB/s) per GPU",
                               description="From the datasheet, both directions together (H100 SXM5: 900); "
                                           "a ring all-reduce moves data at half of it in each direction.")
    allreduce_latency_us: float = Field(6.6, ge=0, title="All-reduce base latency (µs)",
                                        description="Fixed cost of one all-reduce: NCCL's base latency of the "
                                                    "ring algorithm, LL protocol (src/graph/tuning.cc "
                                                    "baseLatencies, same in NCCL 2.21 to 2.30).")
    nvlink_hop_latency_us: float = Field(0.6, ge=0, title="All-reduce latency per ring step over NVLink (µs)",
                                         description="Added per step of the ring (2·(TP−1) steps per all-reduce): "
                                                     "NCCL's hwLatencies[NVLINK][Ring][LL] (src/graph/tuning.cc, "
                                                     "same in NCCL 2.21 to 2.30).")
    op_laws: Literal["measured", "roofline"] = Field(
        "measured", title="Operator laws",
        description="How the cost model times GEMMs, attention, decode steps and the vision tower. measured: "
                    "interpolated from operator timings measured on a GPU (op_timings; by default an H200's, "
                    "physics/data/gpu_ops_h200.csv), scaled to this node's datasheet figures (physics.oplaws); a "
                    "model they lack keeps the roofline. roofline: FLOPs and bytes over the datasheet figures × "
                    "compute_efficiency and hbm_efficiency.")
    op_timings: OperatorTimings | None = Field(
        None, title="Operator timings",
        description="The gpu_ops measurement the measured laws come from; absent: the H200's checked in with "
                    "epdbench (physics/data/gpu_ops_h200.csv). A profile of `epdbench calibrate --ops` sets it.")
    measured_compute_factor: float = Field(1.0, gt=0, le=10, title="Measured compute speed factor",
                                           description="Speed of the measured laws' compute-bound parts as a "
                                                       "multiple of the measurement's, scaled to this node (1: as "
                                                       "measured); op_laws measured only. epdbench calibrate "
                                                       "fits it.")
    measured_hbm_factor: float = Field(1.0, gt=0, le=10, title="Measured memory speed factor",
                                       description="Speed of the measured laws' memory-bound parts as a multiple "
                                                   "of the measurement's, scaled to this node (1: as measured); "
                                                   "op_laws measured only. epdbench calibrate fits it.")
    measured_vision_factor: float = Field(1.0, gt=0, le=10, title="Measured vision tower speed factor",
                                          description="Speed of the vision tower's passes as a multiple of the "
                                                      "measured law's (its GPU time scaled to this node, its launch "
                                                      "floor and gap): a pass takes the law's time divided by it (1: "
                                                      "as measured); op_laws measured only. epdbench calibrate "
                                                      "--engine-steps fits it from the engine's own prefill times.")
    vision_pass_ms: float = Field(0.0, ge=0, title="Vision pass fixed time (ms)",
                                  description="Time of each vision-tower pass beyond its measured law, whatever its "
                                              "images' size: what the engine does around the tower's kernels (its "
                                              "inputs' preparation and transfer, the eager launches of the "
                                              "placement and rotary indices). 0 (not modelled) until fitted: "
                                              "`calibrate --engine-steps` fits it, with measured_vision_factor, to "
                                              "an engine's own prefill times of images of several sizes "
                                              "(analysis.engine_steps).")
    compute_efficiency: float = Field(0.5, gt=0, le=1, title="Achievable fraction of peak FLOP/s",
                                      description="Model FLOPs utilisation assumed for prefill (compute-bound) by "
                                                  "the roofline laws (op_laws roofline, or a model the measured "
                                                  "laws lack).")
    hbm_efficiency: float = Field(0.8, gt=0, le=1, title="Achievable fraction of HBM bandwidth",
                                  description="Assumed for decode (bandwidth-bound) by the roofline laws (op_laws "
                                              "roofline, or a model the measured laws lack).")
    step_overhead_ms: float = Field(1.0, ge=0, title="Per-step overhead (ms)",
                                    description="Scheduling and launch overhead of one engine step.")
    # Measured by benchmarks/serving/image_preprocess.py on the development host (AMD EPYC, one thread; Python 3.11,
    # Pillow 13, numpy 2.4): the load generator's PNG and JPEG images of 224 to 2240 px, fitted on relative error,
    # 0 + 35.1 to 37.3 ms/Mpx over six runs (PNG alone 40-42, JPEG 32-35; no fixed part above 0 was found), of
    # which decode and hash 9.3 to 9.7 ms/Mpx over three (PNG 16-16.5, JPEG 7.7-8).
    # Host CPUs differ: re-measure on yours (or fit them with epdbench calibrate).
    image_preprocess_ms: float = Field(0.0, ge=0, title="Image preprocessing per image (ms)",
                                       description="API-server CPU time per image before the request reaches the "
                                                   "engine, fixed part: base64 and image decode, the multimodal "
                                                   "hash, resize, rescale, normalise and patchify (vLLM's media "
                                                   "loader and the Qwen2-VL image processor). Measured with "
                                                   "benchmarks/serving/image_preprocess.py.")
    image_preprocess_ms_per_mp: float = Field(36.0, ge=0, title="Image preprocessing per megapixel (ms)",
                                              description="API-server CPU time per image that grows with its "
                                                          "pixels (as sent), per 10⁶ px. Measured with "
                                                          "benchmarks/serving/image_preprocess.py.")
    image_decode_ms_per_mp: float = Field(9.5, ge=0, title="Image decode and hash per megapixel (ms)",
                                          description="The part of image_preprocess_ms_per_mp an image still costs "
                                                      "when vLLM's multimodal processor cache holds its processed "
                                                      "output: base64 and image decode and the multimodal hash "
                                                      "(resize, normalise and patchify are skipped). Measured with "
                                                      "benchmarks/serving/image_preprocess.py.")
    # Measured with benchmarks/serving/tokenize_cost.py (2026-12-02, this 2-core machine, tokenizers 0.23.3, Qwen's
    # 151,643-rank byte-level BPE with Qwen2's pre-tokenizer): 0.91–0.93 µs per token on the load generator's
    # prompts over three runs (fit over 128–8192 tokens; no fixed part above 0), 1.16 on English prose. Host CPUs
    # differ: re-measure.
    tokenize_us_per_token: float = Field(TOKENIZE_US_PER_TOKEN, ge=0, title="Prompt tokenization per token (µs)",
                                         description="API-server CPU time per text token of a prompt before the "
                                                     "request reaches the engine, on every replica the request "
                                                     "passes (each vLLM API server tokenizes what it is sent): "
                                                     "Hugging Face tokenizers' byte-level BPE, as vLLM runs it "
                                                     "for Qwen2/Qwen2.5. Measured with "
                                                     "benchmarks/serving/tokenize_cost.py.")
    request_render_ms: float = Field(0.0, ge=0, title="Request rendering per prompt (ms)",
                                     description="API-server CPU time per prompt besides its text tokens' BPE, in "
                                                 "the same serial tokenizer batch: the chat template, the request's "
                                                 "set-up and its hand-off to the engine core. 0 (not modelled) until "
                                                 "fitted: `calibrate --engine-steps` fits it, with "
                                                 "tokenize_us_per_token and image_preprocess_ms_per_mp, to an "
                                                 "engine's own TTFT less its queue and prefill times "
                                                 "(analysis.engine_steps).")
    output_us_per_token: float = Field(OUTPUT_US_PER_TOKEN, ge=0, title="Output path per generated token (µs)",
                                       description="API-server CPU time per generated token on its way to the "
                                                   "client, on the replica that streams it: vLLM's output "
                                                   "handler (incremental detokenization, the RequestOutput) and "
                                                   "the OpenAI server's SSE chunk, one token after another on "
                                                   "the API server's event loop, each step's tokens after the "
                                                   "step ends. Measured with benchmarks/serving/output_cost.py running "
                                                   "vLLM's own code.")
    request_hop_ms: float = Field(REQUEST_HOP_MS, ge=0, title="Host time per HTTP exchange on the path (ms)",
                                  description="What one exchange of a request's path costs outside the engines: a "
                                              "leg from the client or router to a replica's API server (routing, "
                                              "HTTP, JSON, validation), or a KV or encoder-output pull's "
                                              "handshake. The virtual-time core charges it; the HTTP simulator "
                                              "and a real deployment spend it for real. Default measured on the "
                                              "HTTP simulator's own path with benchmarks/simulator/vtime_agreement.py.")
    tcp_gb_s: float = Field(gt=0, title="KV transfer bandwidth over TCP (GB/s)",
                            description="Effective Mooncake TCP transport bandwidth out of one pod, a figure of "
                                        "the pod network: the pod's transfers in flight share it.")
    tcp_setup_ms: float = Field(TCP_SETUP_MS, ge=0, title="Mooncake TCP setup per transfer (ms)",
                                description="What Mooncake's TCP transport spends on a transfer besides moving its "
                                            "bytes (submission, request header, the receiver's acknowledgement, "
                                            "completion): measured on loopback by "
                                            "benchmarks/transport/mooncake_tcp.py.")
    tcp_descriptor_ms: float = Field(TCP_DESCRIPTOR_MS, ge=0, title="Mooncake TCP setup per further descriptor (ms)",
                                     description="Added by each descriptor of a transfer after the first (each is a "
                                                 "request of its own on the peer's connection lanes): measured by "
                                                 "benchmarks/transport/mooncake_tcp.py. vLLM's MooncakeConnector "
                                                 "sends a request's KV as one descriptor per layer and K/V.")
    ucx_tcp_setup_ms: float = Field(UCX_TCP_SETUP_MS, ge=0, title="UCX TCP setup per transfer (ms)",
                                    description="What NIXL over UCX's TCP transport spends on one READ besides moving "
                                                "its bytes: measured on loopback by "
                                                "benchmarks/transport/nixl_ucx.py.")
    ucx_tcp_descriptor_ms: float = Field(UCX_TCP_DESCRIPTOR_MS, ge=0,
                                         title="UCX TCP cost per further descriptor (ms)",
                                         description="Added by each descriptor of a READ after the first (UCX "
                                                     "emulates remote reads over TCP with active messages): "
                                                     "benchmarks/transport/nixl_ucx.py resolved none above its noise "
                                                     "(0). vLLM's NixlConnector reads one descriptor per layer, K/V "
                                                     "and block.")
    tcp_latency_ms: float = Field(0.0, ge=0, title="TCP network latency per transfer (ms)",
                                  description="What the pod network adds once per KV transfer over TCP beyond "
                                              "tcp_setup_ms and tcp_descriptor_ms, which loopback measured without "
                                              "a network. 0: between two pods of one node (veth pairs and a "
                                              "bridge, as the CNI bridge plugin joins them) "
                                              "benchmarks/transport/pod_network.py resolved none (intercepts −0.013 "
                                              "to −0.009 ms against loopback). "
                                              "Across nodes, set it or let `epdbench calibrate` fit it (it probes a "
                                              "zero latency up to 1 s).")
    rdma_nic_gbit_s: float = Field(gt=0, title="RDMA NIC line rate (Gbit/s)",
                                   description="Per interface, e.g. 400 for ConnectX-7 NDR.")
    rdma_efficiency: float = Field(0.73, gt=0, le=1, title="Achievable fraction of RDMA line rate",
                                   description="Applied to the sum of the interfaces of the sending pod. 0.73: "
                                               "the bandwidth fitted to the KV transfer times Mooncake published "
                                               "for vLLM between two H800 nodes (8 × ConnectX-7 RoCE, 200 Gbit/s "
                                               "each), over their line rate "
                                               "(benchmarks/transport/mooncake_rdma_published.py).")
    rdma_latency_ms: float = Field(0.38, ge=0, title="RDMA latency per transfer (ms)",
                                   description="Fixed cost once per KV transfer over RDMA (Mooncake's RDMA endpoints "
                                               "are kept per peer, so descriptors add none): posting its 64 KiB "
                                               "slices and the last completion. 0.38 (95 % interval 0.34–0.42): the "
                                               "intercept of the same fit, over transfers of 20 MiB to 4.5 GiB "
                                               "(benchmarks/transport/mooncake_rdma_published.py); calibrate it from "
                                               "a run.")


GPU_BLOCK_TOKENS = 16     # vLLM's default KV cache block on GPUs (CacheConfig.block_size)
CPU_BLOCK_TOKENS = 128    # vLLM's CPU build when none is given (vllm/platforms/cpu.py, 0.32)


class EngineSpec(Strict):
    max_num_batched_tokens: int = Field(8192, ge=16, title="Token budget per step",
                                        description="vLLM max_num_batched_tokens: decodes plus prefill chunk.")
    max_num_seqs: int = Field(256, ge=1, title="Max running sequences", description="vLLM max_num_seqs.")
    max_model_len: int = Field(32768, ge=64, title="Max model length", description="vLLM --max-model-len.")
    enable_prefix_caching: bool = Field(True, title="Prefix caching",
                                        description="vLLM automatic prefix caching (on by default in vLLM; the "
                                                    "Encode role never prefills).")
    gpu_memory_utilization: float = Field(0.9, gt=0, le=1, title="GPU memory utilisation",
                                          description="vLLM --gpu-memory-utilization: weights plus KV cache.")
    num_gpu_blocks_override: int | None = Field(None, ge=1, title="KV cache blocks (override)",
                                                description="vLLM --num-gpu-blocks-override: KV cache blocks of "
                                                            "16 tokens, instead of what GPU memory leaves after "
                                                            "the weights (vLLM: 'used for testing preemption').")
    block_size: int | None = Field(None, ge=1, le=1024, title="KV cache block (tokens)",
                                   description="vLLM --block-size: tokens per KV cache block. KV moves between "
                                               "engines in whole blocks, so the KV volume check rounds each "
                                               "request's tokens up to it. None: vLLM's default (16 on GPUs, 128 on "
                                               "its CPU build: vllm/platforms/cpu.py).")
    encoder_cache_tokens: int | None = Field(None, ge=1, title="Encoder cache size (tokens)",
                                             description="Encoder outputs kept per engine, in image tokens, before "
                                                         "vLLM raises it to the largest multimodal item. Unset: "
                                                         "max_num_batched_tokens, as vLLM 0.33, which has no flag "
                                                         "for it (encoder_cache_manager.py "
                                                         "compute_mm_encoder_budget).")
