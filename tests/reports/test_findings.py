"""reports/findings.py: the one-line regression verdict and the limitations, from data."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.samples import EarlyStops, PromptFit
from epdbench.reports.findings import (cache_text, early_stop_line, gpu_budget_line, prompt_line, regression_line, reuse_view,
                                       target_line,
                              trials_line)


def check(regressions: int, improvements: int, flagged: list[str]) -> dict:
    return {"status": "regression" if regressions else "within-noise", "runs": [{}] * 7,
            "overall": {"regressions": regressions, "improvements": improvements, "flagged": flagged}}


def test_regression_line_for_every_outcome():
    assert regression_line(None) == "Regression check: not run."
    assert regression_line({"status": "unavailable", "error": "MLflow down"}) == \
        "Regression check: history unavailable (MLflow down)."
    assert regression_line({"status": "no-history"}) == "Regression check: no earlier run of this spec on this target yet."
    assert regression_line(check(0, 0, [])) == \
        "Regression check against the last 7 run(s): 0 regression(s), 0 improvement(s) beyond noise."
    many = [f"pd-tcp fixed 512/256 c={c} itl_p99_ms regression +40.0% vs median of 7 runs" for c in range(7)]
    line = regression_line(check(7, 0, many))
    assert line.count("regression +40.0%") == 5 and line.endswith("; and 2 more.")


def test_limitation_lines_state_the_data():
    assert gpu_budget_line([{"name": "a", "gpus": 6}, {"name": "b", "gpus": 6}]) == \
        "Equal GPU budgets (a 6, b 6 GPUs): absolute numbers compare directly."
    assert trials_line(3).startswith("3 trials per cell: tables show the mean ± the 95% confidence interval")
    assert prompt_line(PromptFit(40, 3, 3 / 1047, [])) == [
        "Measured prompt lengths are within 3 tokens (0.3%) of their targets over 40 measured requests."]
    stops = EarlyStops(100, 12, [("epd", "mm", "1k/128", 8, 12, 24)])
    assert early_stop_line(stops) == ("12 of 100 measured requests stopped before max_tokens (epd mm 1k/128 c=8: "
                                      "12/24): their cells count fewer output tokens.")


def cache(rate_prefix, rate_mm, role_mm="encode", role_prefix="prefill", kv=0.0):
    out = {role_prefix: {"prefix_queries": 180_760.0, "prefix_hit_rate": rate_prefix, "mm_queries": 0.0,
                         "mm_hit_rate": None, "kv_transfer_tokens": kv}}
    out.setdefault(role_mm, {"prefix_queries": 0.0, "prefix_hit_rate": None, "kv_transfer_tokens": 0.0})
    out[role_mm].update({"mm_queries": 40.0, "mm_hit_rate": rate_mm})
    return out


def agg_rows(rows):
    return pd.DataFrame([{"config": c, "suite": s, "workload": "reuse-8k:1792px+400/64", "concurrency": 8,
                          "stream": "main", "ttft_p50_ms": t} for c, s, t in rows])


def test_cache_text_names_each_role_and_what_its_caches_served():
    text = cache_text(cache(0.82, 0.9, kv=25_072.0))
    assert text == ("prefill: prefix-cache hits 82% of 180,760 prompt tokens, 25,072 prompt tokens received by KV "
                    "transfer; encode: encoder-cache hits 90% of 40 images")
    assert cache_text({}) is None


def test_reuse_view_sets_each_reused_cell_against_its_unique_image_control():
    meta = {"reuse_suites": ["mm-reuse"]}
    agg = agg_rows([("aggregated", "mm-reuse", 122.4), ("aggregated", "mm-unique", 878.6),
                    ("epd", "mm-reuse", 66.1), ("epd", "mm-unique", 730.6)])
    verdicts = {"aggregated": {"suites": {"mm-reuse": {"cache": cache(0.82, 0.95, "server", "server")},
                                          "mm-unique": {"cache": cache(0.0, 0.0, "server", "server")}}},
                "epd": {"suites": {"mm-reuse": {"cache": cache(0.82, 0.9)}, "mm-unique": {"cache": cache(0.0, 0.0)}}}}
    view = reuse_view(meta, agg, verdicts)
    assert view["controlled"] and view["controls"] == ["mm-unique"] and view["suites"] == ["mm-reuse"]
    agg_row, epd_row = view["rows"]
    assert (agg_row["ttft"], agg_row["control_ttft"], agg_row["gain"]) == ("122.4", "878.6", "7.2× lower")
    assert agg_row["encoder"] == "95% (server) vs 0%" and agg_row["prefix"] == "82% (server) vs 0%"
    assert (epd_row["gain"], epd_row["encoder"], epd_row["prefix"]) == ("11.1× lower", "90% (encode) vs 0%",
                                                                        "82% (prefill) vs 0%")


def test_reuse_view_without_a_control_still_shows_the_cache_hits():
    view = reuse_view({"reuse_suites": ["mm-reuse"]}, agg_rows([("epd", "mm-reuse", 66.1)]),
                      {"epd": {"suites": {"mm-reuse": {"cache": cache(0.82, 0.9)}}}})
    assert not view["controlled"] and view["rows"][0]["control_ttft"] == "—" and view["rows"][0]["gain"] == "—"
    assert view["rows"][0]["encoder"] == "90% (encode)"
    assert reuse_view({"reuse_suites": []}, agg_rows([("epd", "mm-reuse", 66.1)]), {}) is None
    assert reuse_view({}, pd.DataFrame(), {}) is None      # an older run's meta has no reuse_suites


def test_a_kubernetes_run_measured_from_outside_says_the_api_server_hop_is_in_every_figure():
    outside = target_line({"target": "kubernetes", "client": "service-proxy"})
    assert "through the API server's service proxy" in outside and "in every TTFT and ITL figure" in outside
    assert "a port-forward" in target_line({"target": "kubernetes", "client": "port-forward"})
    inside = target_line({"target": "kubernetes", "client": "in-cluster", "client_placement": "router-node"})
    assert "outside the cluster" not in inside and "inside the cluster as a Job on the router's node" in inside
    assert target_line({"target": "sim", "client": "loopback"}).startswith("Simulator run")
