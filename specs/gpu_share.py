"""Every engine of a configuration on one GPU (target.local.gpu_share): each engine's share of the GPU's memory,
its --gpu-memory-utilization (pure).

vLLM sizes an engine by that fraction of the GPU's whole memory: at start it requires that much to be free
(vllm/v1/worker/utils.py `request_memory`), then gives its KV cache what the fraction leaves after the weights, the
profiling run's peak activations and the CUDA graphs (gpu_worker.py `determine_available_memory`), and refuses to
start if that cannot hold one max_model_len sequence (kv_cache_utils.py `check_enough_kv_cache_memory`; an encode
engine, which holds no KV cache, is not checked). Engines sharing a GPU therefore need shares that each hold their
engine and that fit the GPU together, with every process's CUDA context (outside vLLM's fraction) beside them.

Each engine's least share: its weights (the whole model, or the vision tower alone on an encode engine with
--mm-encoder-only), an allowance for the profiling run and CUDA graphs, and on a language-model engine the KV of
one max_model_len sequence. A role's share given in target.local.gpu_shares is taken as it is; what the GPU has
beyond the others goes to the KV caches of the remaining language-model engines, equally; no computed share exceeds
engine.gpu_memory_utilization.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:      # specs.models checks a spec's shares with these functions
    from epdbench.specs.models import ConfigurationSpec, ExperimentSpec

GB = 1e9
# Per engine process, outside vLLM's fraction: the CUDA context and library workspaces (CUDA context and cuBLAS took
# 0.62 GB on an H100 80GB HBM3 with torch 2.11+cu130, 2026-12-05), rounded up for NCCL and UCX's.
CONTEXT_GB = 0.75
# vLLM's profiling run and CUDA graphs of a language-model engine: the dummy batch of max_num_batched_tokens, the
# sampler's logits, and the vision tower's dummy encode of its largest image (Qwen2.5-VL-7B at 16,384 image tokens:
# about 2.5 GB of activations), plus the graphs' pool. An allowance, not a measurement: the engine's own
# "Available KV cache memory" line says what was left.
LM_RESERVE_GB = 4.0
# An encode engine's (eager, no KV cache): the vision tower's dummy encode and the encoder cache.
ENCODER_RESERVE_GB = 3.5
# The shares together leave this fraction of the GPU to the CUDA contexts, the allocator's slack and an engine
# whose profiled peak runs over its allowance.
FILL = 0.92
SHARE_STEP = 0.01            # shares are rounded down to this


@dataclass(frozen=True)
class EngineNeed:
    replica: str             # prefill-0
    role: str
    least_gb: float          # weights + reserve (+ one max_model_len sequence's KV)
    holds_kv: bool


def weights_gb(spec: "ExperimentSpec", role: str) -> float:
    """Weights an engine of this role loads: the vision tower alone on an encode engine with --mm-encoder-only,
    else the language model and the vision tower."""
    m = spec.model
    vision = m.vision.params_b if m.vision else 0.0
    if role == "encode" and spec.target.local.encode_vision_only:
        return vision * m.dtype_bytes
    return (m.params_b + vision) * m.dtype_bytes


def engine_needs(spec: "ExperimentSpec", config: "ConfigurationSpec") -> list[EngineNeed]:
    kv_gb = spec.engine.max_model_len * spec.model.kv_bytes_per_token / GB
    out = []
    for r in config.roles:
        holds_kv = r.role != "encode"
        least = weights_gb(spec, r.role) + (LM_RESERVE_GB + kv_gb if holds_kv else ENCODER_RESERVE_GB)
        out += [EngineNeed(f"{r.role}-{i}", r.role, least, holds_kv) for i in range(r.replicas)]
    return out


def _floor(x: float) -> float:
    return round(math.floor(x / SHARE_STEP + 1e-9) * SHARE_STEP, 4)


def _ceil(x: float) -> float:
    return round(math.ceil(x / SHARE_STEP - 1e-9) * SHARE_STEP, 4)


def gpu_shares(spec: "ExperimentSpec", config: "ConfigurationSpec") -> dict[str, float]:
    """Role -> --gpu-memory-utilization of each of its engines on the shared GPU; ValueError (one line naming the
    configuration and the fix) when the engines cannot fit."""
    hbm = spec.hardware.hbm_gb
    needs = engine_needs(spec, config)
    room = hbm * FILL - CONTEXT_GB * len(needs)
    least = sum(n.least_gb for n in needs)
    where = f"configuration {config.name}: {len(needs)} engine{'s' * (len(needs) > 1)} on one {hbm:g} GB GPU"
    if least > room:
        parts = ", ".join(f"{n.replica} {n.least_gb:.1f}" for n in needs)
        raise ValueError(f"{where} need at least {least:.1f} GB ({parts}; weights, profiling reserve and one "
                         f"{spec.engine.max_model_len}-token sequence's KV) of the {room:.1f} GB they may share: "
                         "lower engine.max_model_len, drop a role, or use a GPU with more memory (hardware.hbm_gb)")
    cap = spec.engine.gpu_memory_utilization
    given = spec.target.local.gpu_shares
    shares = {n.role: given[n.role] for n in needs if n.role in given}
    for n in needs:              # an engine without a KV cache gets its least share, rounded up
        if not n.holds_kv and n.role not in shares:
            shares[n.role] = min(_ceil(n.least_gb / hbm), cap)
    rest = [n for n in needs if n.role not in shares]
    left = room - sum(shares[n.role] * hbm for n in needs if n.role in shares)
    for n in rest:               # what is left, equally, to the KV caches
        shares[n.role] = min(_floor(left / len(rest) / hbm), cap)
    for n in needs:
        if shares[n.role] * hbm < n.least_gb:
            raise ValueError(f"{where}: {n.role}'s share {shares[n.role]:.2f} ({shares[n.role] * hbm:.1f} GB) cannot "
                             f"hold its engine ({n.least_gb:.1f} GB): raise target.local.gpu_shares.{n.role}")
    total = sum(shares[n.role] for n in needs)
    if total * hbm > room + 1e-6:
        raise ValueError(f"{where}: the shares add up to {total:.2f} of the GPU ({total * hbm:.1f} GB), more than "
                         f"the {room:.1f} GB the engines may share: lower target.local.gpu_shares")
    return shares


def kv_cache_bytes(spec: "ExperimentSpec", config: "ConfigurationSpec") -> dict[str, int]:
    """Role -> --kv-cache-memory-bytes of each engine that holds a KV cache, when the engines start together
    (target.local.start_together): its share of the GPU less its weights and LM_RESERVE_GB, in whole MiB, so the engine
    stays inside its share without vLLM's memory profiling. vLLM's share is of the GPU's whole memory as CUDA reports
    it, at least hardware.hbm_gb, so an engine so sized stays within it. Each share already holds one
    max_model_len sequence's KV beside the weights and the reserve (gpu_shares refuses one that cannot)."""
    shares = gpu_shares(spec, config)
    mib = 2 ** 20
    return {n.role: round((shares[n.role] * spec.hardware.hbm_gb - weights_gb(spec, n.role) - LM_RESERVE_GB) * GB)
            // mib * mib for n in engine_needs(spec, config) if n.holds_kv}
