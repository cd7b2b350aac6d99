"""What-if planning, pure parts: which variants are tried, how the rate is searched, which variant wins."""
import math

import pytest

from epdbench.analysis.whatif import (MAX_DOUBLINGS, Point, best_per_configuration, capacity_row, noise_range,
                                      search_rate, table_lines, tp_problem, variants)
from epdbench.specs.models import load_spec


@pytest.fixture(scope="module")
def pd_text():
    return load_spec("pd-text")


def test_variants_keep_each_configuration_and_fit_one_node(pd_text):
    found = variants(pd_text, [1, 2, 3, 4])
    assert all(v.config.gpus <= 8 for v in found)
    assert {v.family for v in found} == {"aggregated", "pd-tcp", "pd-rdma"}
    for base in pd_text.configurations:          # the spec's own shape is always among them
        mine = [v for v in found if v.family == base.name]
        assert any([(r.replicas, r.tp) for r in v.config.roles] == [(r.replicas, r.tp) for r in base.roles]
                   for v in mine)
        assert all(v.config.kv_transport == base.kv_transport for v in mine)
    # TP2 everywhere (the spec's TP): aggregated 1..4 servers; PD prefill + decode replicas within 4 pairs
    assert len([v for v in found if v.family == "aggregated"]) == 4
    assert len([v for v in found if v.family == "pd-tcp"]) == 6
    assert len({v.config.name for v in found}) == len(found)
    assert all(r.rdma_interfaces >= 1 for v in found if v.family == "pd-rdma" for r in v.config.roles)


def test_tp_and_gpu_budget_and_other_transports(pd_text):
    spec = pd_text.model_copy(update={"configurations": [c for c in pd_text.configurations if c.name == "pd-tcp"]})
    found = variants(spec, [1, 2], tps=[1, 2, 4], transports=["tcp", "rdma"], max_gpus=4)
    assert {v.family for v in found} == {"pd-tcp", "pd-rdma"}
    assert all(v.config.gpus <= 4 for v in found)
    assert any(r.tp == 4 for v in variants(spec, [1], tps=[2, 4]) for r in v.config.roles)
    # Qwen3-32B on one H100 leaves 6 GB for a 32768-token sequence's 8 GB of KV: vLLM would not start it
    assert not any(r.tp == 1 for v in found for r in v.config.roles) and tp_problem(spec, 1).startswith("To serve")
    assert tp_problem(spec, 3) == "vLLM needs it to divide the model's 64 attention heads"
    assert variants(spec, [1], tps=[3]) == [v for v in variants(spec, [1]) if v.family == "pd-tcp"][:1]
    rdma = [v for v in found if v.family == "pd-rdma"]
    assert rdma and all(v.config.kv_transport == "rdma" and all(r.rdma_interfaces >= 1 for r in v.config.roles)
                        for v in rdma)
    # the spec's own shape (prefill 1×TP2 + decode 2×TP2, 6 GPUs) exceeds the budget: left out
    assert not any(v.config.gpus > 4 for v in found)


def threshold(capacity: float, n: int = 100, target: float = 0.9):
    """A synthetic system: every request meets the SLO below `capacity`, none above."""
    calls = []

    def evaluate(rate: float) -> Point:
        calls.append(rate)
        return Point(rate, n, n if rate <= capacity else 0, target)
    return evaluate, calls


def test_search_walks_up_the_swept_rates_then_bisects():
    evaluate, calls = threshold(5.0)
    points = search_rate(evaluate, [8, 1, 2, 4], refine=3)
    assert calls[:4] == [1, 2, 4, 8]                   # upwards, stopping at the first failure
    assert len(calls) == 4 + 3
    row = capacity_row(_variant(), points)
    assert 4 <= row["goodput_req_s"] <= 5.0 < row["fails_at_req_s"] <= 8
    assert row["fails_at_req_s"] / row["goodput_req_s"] == pytest.approx(2 ** (1 / 8))   # three halvings in log


def test_search_doubles_past_the_highest_rate_while_all_hold():
    evaluate, calls = threshold(20.0)
    points = search_rate(evaluate, [1, 2], refine=0)
    assert calls == [1, 2, 4, 8, 16, 32]
    row = capacity_row(_variant(), points)
    assert row["goodput_req_s"] == 16 and row["fails_at_req_s"] == 32
    evaluate, calls = threshold(math.inf)
    row = capacity_row(_variant(), search_rate(evaluate, [1], refine=2))
    assert calls == [2 ** k for k in range(MAX_DOUBLINGS + 1)]
    assert row["fails_at_req_s"] is None and "held" in row["note"]


def test_a_variant_failing_the_lowest_rate_is_searched_below_it():
    evaluate, calls = threshold(0.1)
    row = capacity_row(_variant(), search_rate(evaluate, [0.5, 1], refine=3))
    assert calls[:4] == [0.5, 0.25, 0.125, 0.0625]             # halving until one holds, then bisecting
    assert len(calls) == 4 + 3
    assert 0.0625 <= row["goodput_req_s"] <= 0.1 < row["fails_at_req_s"] <= 0.125 and row["note"] == ""


def test_a_variant_failing_far_below_the_lowest_rate_has_no_goodput():
    evaluate, calls = threshold(0.001)
    row = capacity_row(_variant(), search_rate(evaluate, [0.5, 1], refine=3))
    assert calls == [0.5 / 2 ** k for k in range(MAX_DOUBLINGS + 1)]
    assert row["goodput_req_s"] is None and row["goodput_req_s_per_gpu"] is None
    assert f"fails at the lowest rate tried ({0.5 / 2 ** MAX_DOUBLINGS:g} req/s)" in row["note"]


def _variant():
    return variants(load_spec("pd-text"), [1])[0]


def test_a_rate_over_its_itl_p99_bound_is_not_sustained_whatever_its_attainment():
    assert Point(4.0, 10, 10, 0.9, itl_p99_ms=12.0, itl_p99_holds=True).sustained
    assert not Point(4.0, 10, 10, 0.9, itl_p99_ms=80.0, itl_p99_holds=False).sustained
    assert not Point(4.0, 10, 8, 0.9).sustained


def test_a_rates_verdict_carries_its_noise():
    assert Point(2.0, 48, 48, 0.9).surely_holds                          # Wilson 95% low 0.926 ≥ 0.9
    held_by_a_hair = Point(2.0, 48, 44, 0.9)                             # 0.917, but its interval reaches 0.80
    assert held_by_a_hair.sustained and held_by_a_hair.uncertain
    missed_by_a_hair = Point(2.0, 48, 42, 0.9)                           # 0.875, interval up to 0.94
    assert not missed_by_a_hair.sustained and missed_by_a_hair.uncertain
    assert Point(2.0, 48, 30, 0.9).surely_fails                          # interval wholly below the target
    assert Point(2.0, 0, 0, 0.9).surely_fails                            # nothing measured
    # the ITL p99 bound: within noise of it blurs a full attainment; surely over it fails whatever the attainment
    assert Point(2.0, 48, 48, 0.9, 99.0, True, itl_p99_uncertain=True).uncertain
    assert Point(2.0, 48, 44, 0.9, 300.0, False, itl_p99_uncertain=False).surely_fails


def test_capacity_carries_its_noise_range_and_names_the_blurred_rates():
    points = [Point(1.0, 100, 100, 0.9), Point(2.0, 100, 100, 0.9), Point(2.5, 100, 93, 0.9),
              Point(3.0, 100, 80, 0.9), Point(4.0, 100, 0, 0.9)]
    row = capacity_row(_variant(), points)
    assert row["goodput_req_s"] == 2.5 and row["fails_at_req_s"] == 3.0
    assert row["holds_surely_req_s"] == 2.0 and row["fails_surely_req_s"] == 3.0
    assert "too close to the SLO to call at 2.5 req/s" in row["note"]
    assert noise_range(row) == "2–3"
    # nothing surely held: no lower end; nothing surely failed: no upper end
    row = capacity_row(_variant(), [Point(1.0, 20, 19, 0.9), Point(2.0, 20, 17, 0.9), Point(4.0, 20, 0, 0.9)])
    assert row["goodput_req_s"] == 1.0 and row["holds_surely_req_s"] is None and noise_range(row) == "< 4"
    row = capacity_row(_variant(), [Point(1.0, 100, 100, 0.9), Point(2.0, 100, 100, 0.9)])
    assert row["fails_surely_req_s"] is None and noise_range(row) == "≥ 2"


def _row(config, gpus, goodput, holds, fails, roles="r"):
    return {"configuration": config, "variant": f"{config}-{roles}", "roles": roles, "kv_transport": "tcp",
            "gpus": gpus, "goodput_req_s": goodput, "goodput_req_s_per_gpu": goodput / gpus, "fails_at_req_s": fails,
            "holds_surely_req_s": holds, "fails_surely_req_s": fails, "attainment": 1.0, "tie_with": "",
            "variants_within_noise": "", "note": ""}


def test_one_configuration_beats_another_only_beyond_the_noise():
    rows = [_row("pd-rdma", 8, 9.51, 9.51, 10.4), _row("pd-tcp", 6, 5.19, 5.19, 5.66),
            _row("epd", 7, 34.9, 30.0, 38.1), _row("epd-rdma", 7, 34.9, 34.9, 38.1)]
    best = {r["configuration"]: r for r in best_per_configuration(rows)}
    assert best["pd-rdma"]["tie_with"] == "" and best["pd-tcp"]["tie_with"] == ""    # 1.19/GPU surely > 0.943
    assert best["epd"]["tie_with"] == "epd-rdma" and best["epd-rdma"]["tie_with"] == "epd"
    assert best["epd"]["note"].startswith("tied with epd-rdma (neither surely better)")
    assert rows[2]["tie_with"] == ""                                    # the caller's rows are left as they were
    # a capacity with no rate surely failed cannot be beaten: its upper end is unknown
    open_ended = _row("aggregated", 3, 2.0, 2.0, None)
    best = {r["configuration"]: r for r in best_per_configuration([_row("pd-rdma", 8, 9.51, 9.51, 10.4), open_ended])}
    assert best["aggregated"]["tie_with"] == "pd-rdma"
    lines = table_lines(list(best.values()))
    assert "noise range" in lines[0] and any("9.51–10.4" in line for line in lines)
    assert any("≥ 2" in line for line in lines)


def test_the_best_variant_names_the_variants_of_its_configuration_it_does_not_surely_beat():
    """pd-text's pd-tcp (measured 2026-12-02): 2 prefills + 1 decode on 6 GPUs holds 0.865 per GPU surely, where
    2 + 2 on 8 GPUs surely fails (from 0.707) — but 3 + 1 on 8 GPUs fails surely only from 0.917: no finding."""
    rows = [_row("pd-tcp", 6, 5.19, 5.19, 5.66, "p2 d1"), _row("pd-tcp", 8, 5.19, 5.19, 5.66, "p2 d2"),
            _row("pd-tcp", 8, 6.73, 6.73, 7.34, "p3 d1")]
    [best] = best_per_configuration(rows)
    assert best["roles"] == "p2 d1" and best["variants_within_noise"] == "p3 d1"
    assert best["note"] == "1 other variant may do as well"


def test_a_failure_within_noise_is_followed_up_until_one_surely_fails():
    """Past 5 req/s 89 of 100 requests meet the SLO (interval 0.81–0.94 around a 0.9 target: no verdict), past
    12 half do: the search brackets the point estimate as before, then walks on from the highest rate tried
    to bound the noise range from above."""
    calls = []

    def evaluate(rate):
        calls.append(rate)
        return Point(rate, 100, 100 if rate <= 5 else 89 if rate <= 12 else 50, 0.9)
    row = capacity_row(_variant(), search_rate(evaluate, [1, 2, 4, 8], refine=3))
    assert calls[:7] == pytest.approx([1, 2, 4, 8, 8 / 2 ** 0.5, 4 * 2 ** 0.25, 4 * 2 ** 0.375])
    assert calls[7:] == pytest.approx([8 * 2 ** 0.5, 16])             # 11.3 is within noise, 16 surely fails
    assert row["goodput_req_s"] == pytest.approx(4 * 2 ** 0.25) and row["fails_at_req_s"] == pytest.approx(5.19, abs=0.01)
    assert row["holds_surely_req_s"] == row["goodput_req_s"] and row["fails_surely_req_s"] == pytest.approx(16)
    # a failure beyond the noise already: nothing more is tried
    evaluate_sure, sure_calls = threshold(5.0)
    search_rate(evaluate_sure, [1, 2, 4, 8], refine=3)
    assert len(sure_calls) == 7


def test_a_lowest_rate_held_within_noise_is_followed_down_until_one_surely_holds():
    """Up to 0.6 req/s every request meets the SLO; from there to 2, 92 of 100 (held, interval 0.85–0.96: no
    verdict); above, none. The range's lower end comes from rates below the lowest swept."""
    calls = []

    def evaluate(rate):
        calls.append(rate)
        return Point(rate, 100, 100 if rate <= 0.6 else 92 if rate <= 2 else 0, 0.9)
    row = capacity_row(_variant(), search_rate(evaluate, [1, 2, 4], refine=1))
    assert calls == pytest.approx([1, 2, 4, 8 ** 0.5, 1 / 2 ** 0.5, 0.5])     # walk, bisect, then down
    assert row["goodput_req_s"] == 2 and row["fails_surely_req_s"] == pytest.approx(8 ** 0.5)
    assert row["holds_surely_req_s"] == pytest.approx(0.5)
