"""Prometheus text parsing and per-suite counter deltas (pure)."""
from __future__ import annotations

import math
import re

SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")
LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')

# Counters whose per-suite deltas are reported: key -> (metric name, label filter or None).
DELTA_COUNTERS = {
    "requests_finished": ("vllm:request_success_total", None),
    "prompt_tokens": ("vllm:prompt_tokens_total", None),
    "generation_tokens": ("vllm:generation_tokens_total", None),
    "prompt_tokens_local_compute": ("vllm:prompt_tokens_by_source_total", ("source", "local_compute")),
    "prompt_tokens_local_cache_hit": ("vllm:prompt_tokens_by_source_total", ("source", "local_cache_hit")),
    "prompt_tokens_external_kv_transfer": ("vllm:prompt_tokens_by_source_total", ("source", "external_kv_transfer")),
    "prefix_cache_queries": ("vllm:prefix_cache_queries_total", None),
    "prefix_cache_hits": ("vllm:prefix_cache_hits_total", None),
    "mm_cache_queries": ("vllm:mm_cache_queries_total", None),
    "mm_cache_hits": ("vllm:mm_cache_hits_total", None),
    # MooncakeConnector's bytes and times are histograms per transfer (vLLM 0.33 mooncake/stats.py), on the sending
    # side; its failures counters.
    "mooncake_bytes_transferred": ("vllm:mooncake_bytes_transferred_sum", None),
    "mooncake_failed_transfers": ("vllm:mooncake_num_failed_transfers_total", None),
    "mooncake_failed_recvs": ("vllm:mooncake_num_failed_recvs_total", None),
    "mooncake_transfers": ("vllm:mooncake_xfer_time_seconds_count", None),
    # NixlConnector's are histograms too (nixl/stats.py): bytes per transfer and transfer time, on the reading side.
    "nixl_bytes_transferred": ("vllm:nixl_bytes_transferred_sum", None),
    "nixl_transfers": ("vllm:nixl_xfer_time_seconds_count", None),
    "nixl_failed_transfers": ("vllm:nixl_num_failed_transfers_total", None),
    # The engine core's own request histograms (vllm/v1/metrics/loggers.py), as sums and counts: a window's mean
    # time per request (analysis.truth_rows.engine_means_of_deltas), per role.
    **{f"{key}_{part}": (f"{name}_{part}", None) for key, name in (
        ("engine_queue_s", "vllm:request_queue_time_seconds"), ("engine_prefill_s", "vllm:request_prefill_time_seconds"),
        ("engine_decode_s", "vllm:request_decode_time_seconds"), ("engine_ttft_s", "vllm:time_to_first_token_seconds"),
        ("engine_tpot_s", "vllm:request_time_per_output_token_seconds")) for part in ("sum", "count")},
    "router_prefill_requests": ("vllm_router_pd_prefill_requests_total", None),
    "router_decode_requests": ("vllm_router_pd_decode_requests_total", None),
    "router_processed_requests": ("vllm_router_processed_requests_total", None),
    "proxy_encode_legs": ("epdbench_proxy_legs_total", ("leg", "encode")),
    "proxy_prefill_legs": ("epdbench_proxy_legs_total", ("leg", "prefill")),
    "proxy_decode_legs": ("epdbench_proxy_legs_total", ("leg", "decode")),
    "proxy_direct_legs": ("epdbench_proxy_legs_total", ("leg", "direct")),
}


def parse_prometheus(text: str) -> list[tuple[str, dict, float]]:
    out = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        if not m:
            continue
        try:
            value = float(m.group(3))
        except ValueError:
            continue
        labels = dict(LABEL.findall(m.group(2) or ""))
        out.append((m.group(1), labels, value))
    return out


def counter_values(text: str) -> dict[str, float]:
    """Sum of each tracked counter over all label sets (after the optional label filter)."""
    samples = parse_prometheus(text)
    out: dict[str, float] = {}
    for key, (name, flt) in DELTA_COUNTERS.items():
        vals = [v for n, lbl, v in samples if n == name and (flt is None or lbl.get(flt[0]) == flt[1])]
        if vals:
            out[key] = sum(v for v in vals if not math.isnan(v))
    return out


def counter_deltas(before: str, after: str) -> dict[str, float]:
    """after − before for every tracked counter present after (absent before counts as 0)."""
    b, a = counter_values(before), counter_values(after)
    return {k: a[k] - b.get(k, 0.0) for k in a}


def hit_rate(hits: float | None, queries: float | None) -> float | None:
    if not queries:
        return None
    return (hits or 0.0) / queries


def cache_by_role(metrics_delta: dict[str, dict[str, float]]) -> dict[str, dict[str, float | None]]:
    """Per role, what the caches served over a window: prefix-cache hits over queried prompt tokens,
    encoder (multimodal) cache hits over queried items, and prompt tokens received by KV transfer.
    Roles whose counters show no cache activity are left out."""
    out: dict[str, dict[str, float | None]] = {}
    for role, d in metrics_delta.items():
        view = {
            "prefix_queries": d.get("prefix_cache_queries") or 0.0,
            "prefix_hit_rate": hit_rate(d.get("prefix_cache_hits"), d.get("prefix_cache_queries")),
            "mm_queries": d.get("mm_cache_queries") or 0.0,
            "mm_hit_rate": hit_rate(d.get("mm_cache_hits"), d.get("mm_cache_queries")),
            "kv_transfer_tokens": d.get("prompt_tokens_external_kv_transfer") or 0.0,
        }
        if view["prefix_queries"] or view["mm_queries"] or view["kv_transfer_tokens"]:
            out[role] = view
    return out
