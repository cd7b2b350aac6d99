"""The served model, the GPU node and vLLM's engine limits."""
from __future__ import annotations

from pydantic import Field

from epdbench.specs.base import Strict


class VisionSpec(Strict):
    params_b: float = Field(gt=0, title="Vision encoder parameters (billions)",
                            description="Parameter count of the vision tower, from the model config.")
    pixels_per_token: int = Field(28, ge=1, title="Pixels per image token (edge)",
                                  description="Edge length in pixels covered by one image token "
                                              "(Qwen2.5-VL: 14-px patches merged 2x2 = 28).")
    embed_dim: int = Field(gt=0, title="Image embedding width",
                           description="Width of one image token's embedding handed to the language model.")


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

    @property
    def weight_bytes(self) -> float:
        return self.params_b * 1e9 * self.dtype_bytes


class HardwareSpec(Strict):
    gpu: str = Field(title="GPU", description="GPU model of the node, e.g. H100-SXM5-80GB.")
    gpus_per_node: int = Field(8, ge=1, le=16, title="GPUs on the node",
                               description="A configuration may not use more GPUs than this.")
    bf16_tflops: float = Field(gt=0, title="Peak dense BF16 TFLOP/s per GPU", description="From the datasheet.")
    hbm_tb_s: float = Field(gt=0, title="HBM bandwidth (TB/s) per GPU", description="From the datasheet.")
    hbm_gb: float = Field(80, gt=0, title="HBM capacity (GB) per GPU",
                          description="From the datasheet; bounds the KV cache (and so the prefix cache).")
    nvlink_gb_s: float = Field(gt=0, title="NVLink bandwidth (GB/s) per GPU",
                               description="From the datasheet; carries tensor-parallel all-reduces.")
    compute_efficiency: float = Field(0.5, gt=0, le=1, title="Achievable fraction of peak FLOP/s",
                                      description="Model FLOPs utilisation assumed for prefill (compute-bound).")
    hbm_efficiency: float = Field(0.8, gt=0, le=1, title="Achievable fraction of HBM bandwidth",
                                  description="Assumed for decode (bandwidth-bound).")
    step_overhead_ms: float = Field(1.0, ge=0, title="Per-step overhead (ms)",
                                    description="Scheduling and launch overhead of one engine step.")
    tcp_gb_s: float = Field(gt=0, title="KV transfer bandwidth over TCP (GB/s)",
                            description="Effective Mooncake TCP transport bandwidth between pods of the node.")
    tcp_latency_ms: float = Field(0.5, ge=0, title="TCP transfer latency (ms)",
                                  description="Fixed cost per KV transfer over TCP (connection, handshake, copies).")
    rdma_nic_gbit_s: float = Field(gt=0, title="RDMA NIC line rate (Gbit/s)",
                                   description="Per interface, e.g. 400 for ConnectX-7 NDR.")
    rdma_efficiency: float = Field(0.8, gt=0, le=1, title="Achievable fraction of RDMA line rate",
                                   description="Applied to the sum of the interfaces of the sending pod.")
    rdma_latency_ms: float = Field(0.05, ge=0, title="RDMA transfer latency (ms)",
                                   description="Fixed cost per KV transfer over RDMA.")


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
