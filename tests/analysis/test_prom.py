"""analysis/prom.py: counter deltas from Prometheus text and the per-role cache view."""
import pytest

from epdbench.analysis.prom import cache_by_role, counter_deltas, hit_rate

BEFORE = """# HELP vllm:prefix_cache_queries_total Prefix cache queries, in terms of number of queried tokens.
# TYPE vllm:prefix_cache_queries_total counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 0.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 1000.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 0.0
"""
AFTER = """vllm:prefix_cache_queries_total{engine="0",model_name="m"} 10036.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 8192.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 2844.0
vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_cache_hit"} 8192.0
vllm:mm_cache_queries_total{engine="0",model_name="m"} 2.0
vllm:mm_cache_hits_total{engine="0",model_name="m"} 1.0
"""


def test_counter_deltas_filter_labels_and_treat_new_counters_as_zero_before():
    d = counter_deltas(BEFORE, AFTER)
    assert d["prefix_cache_queries"] == 9036 and d["prefix_cache_hits"] == 8192
    assert d["prompt_tokens_local_compute"] == 1844 and d["prompt_tokens_local_cache_hit"] == 8192
    assert d["mm_cache_queries"] == 2 and d["mm_cache_hits"] == 1      # absent before: counted from 0
    assert "mooncake_bytes_transferred" not in d                       # absent after: not reported


def test_hit_rate_needs_queries():
    assert hit_rate(5, 10) == 0.5 and hit_rate(None, 10) == 0.0
    assert hit_rate(3, 0) is None and hit_rate(None, None) is None


def test_cache_by_role_keeps_roles_with_cache_activity():
    view = cache_by_role({
        "encode": {"mm_cache_queries": 40.0, "mm_cache_hits": 38.0, "prompt_tokens": 180_760.0},
        "prefill": {"prefix_cache_queries": 180_760.0, "prefix_cache_hits": 155_648.0},
        "decode": {"prefix_cache_queries": 180_760.0, "prefix_cache_hits": 155_648.0,
                   "prompt_tokens_external_kv_transfer": 25_072.0},
        "router": {"router_processed_requests": 40.0},
    })
    assert list(view) == ["encode", "prefill", "decode"]
    assert view["encode"]["mm_hit_rate"] == pytest.approx(0.95) and view["encode"]["prefix_hit_rate"] is None
    assert view["prefill"]["prefix_hit_rate"] == pytest.approx(155_648 / 180_760) and view["prefill"]["mm_queries"] == 0
    assert view["decode"]["kv_transfer_tokens"] == 25_072


def test_kv_connector_histograms_are_read_as_vllm_0_33_exposes_them():
    # vLLM 0.33's MooncakeConnector and NixlConnector stats (kv_connector/v1/{mooncake,nixl}/stats.py) are
    # prometheus_client histograms per transfer; rendered here by the same client, so the text is the real one
    prometheus_client = pytest.importorskip("prometheus_client")

    def exposition(transfers: list[float]) -> str:
        registry = prometheus_client.CollectorRegistry()
        for connector in ("mooncake", "nixl"):
            size = prometheus_client.Histogram(f"vllm:{connector}_bytes_transferred", "bytes per transfer",
                                               ["model_name", "engine"], registry=registry,
                                               buckets=tuple(2 ** (10 + i) for i in range(1, 25, 2)))
            took = prometheus_client.Histogram(f"vllm:{connector}_xfer_time_seconds", "transfer time",
                                               ["model_name", "engine"], registry=registry)
            for n in transfers:
                size.labels("m", "0").observe(n)
                took.labels("m", "0").observe(0.01)
        return prometheus_client.generate_latest(registry).decode()
    d = counter_deltas(exposition([1e6]), exposition([1e6, 4e6, 5e6]))
    assert (d["mooncake_transfers"], d["mooncake_bytes_transferred"]) == (2, 9e6)
    assert (d["nixl_transfers"], d["nixl_bytes_transferred"]) == (2, 9e6)
