"""analysis/pareto.py: points per shape, the frontier with its noise rule, cost and energy per token — from
hand-made summary rows whose answer can be read off."""
from __future__ import annotations

import random

import pandas as pd
import pytest

from epdbench.analysis.pareto import (CONTAMINATED, DOMINATED, FRONTIER, POINT_COLUMNS, UNPLACED, cost_usd_per_mtok,
                                      dominates, frontier_configs, interactivity, pareto_points)


def row(config, tpot_ms, per_gpu, concurrency=1, workload="512/64", suite="fixed", stream="main", trial=0, **extra):
    return {"config": config, "suite": suite, "workload": workload, "concurrency": concurrency, "stream": stream,
            "trial": trial, "tpot_p50_ms": tpot_ms, "output_tok_s_per_gpu": per_gpu, "requests_ok": 8,
            "requests_total": 8, "n_ttft_samples": 8, "n_itl_samples": 504, "timing": "modelled",
            "contaminated": False, **extra}


def status(points: pd.DataFrame) -> dict[tuple[str, int], str]:
    return {(r["config"], r["concurrency"]): r["status"] for r in points.to_dict("records")}


def test_interactivity_is_tokens_per_second_one_user_sees():
    assert interactivity(10.0) == 100.0 and interactivity(4) == 250.0
    assert interactivity(None) is None and interactivity(0.0) is None and interactivity(float("nan")) is None


def test_the_obvious_frontier():
    # a: 100 tok/s/user at 50 tok/s/GPU (c=1), 50 at 200 (c=8); b is behind a at each load by far more than the
    # noise; c is the most interactive of all, at little throughput
    points = pareto_points(pd.DataFrame([row("a", 10, 50), row("a", 20, 200, 8), row("b", 12.5, 40),
                                         row("b", 25, 150, 8), row("c", 5, 20)]))
    assert list(points.columns) == POINT_COLUMNS
    assert status(points) == {("a", 1): FRONTIER, ("a", 8): FRONTIER, ("b", 1): DOMINATED, ("b", 8): DOMINATED,
                              ("c", 1): FRONTIER}
    by = dict(zip(zip(points["config"], points["concurrency"]), points["dominated_by"]))
    assert by[("b", 1)] == "a c=1" and by[("b", 8)] == "a c=8" and by[("a", 1)] is None
    assert frontier_configs(points) == {"fixed": {("512/64", "main"): ["a", "c"]}}
    a8 = points[(points["config"] == "a") & (points["concurrency"] == 8)].iloc[0]
    assert a8["tok_s_per_user"] == 50.0 and a8["output_tok_s_per_gpu"] == 200.0


def test_a_lead_within_the_noise_dominates_nothing_and_a_tie_stays():
    # one trial: throughput per GPU has the run-to-run floor of 8% on each side, TPOT p50 1%
    close = pareto_points(pd.DataFrame([row("a", 10, 100), row("b", 10, 105)]))
    assert status(close) == {("a", 1): FRONTIER, ("b", 1): FRONTIER}
    tie = pareto_points(pd.DataFrame([row("a", 10, 100), row("b", 10, 100)]))
    assert set(tie["status"]) == {FRONTIER}
    apart = pareto_points(pd.DataFrame([row("a", 10, 100), row("b", 10, 130)]))    # 30% apart: beyond 8% + 8%
    assert status(apart) == {("a", 1): DOMINATED, ("b", 1): FRONTIER}


def test_a_lead_within_the_noise_on_one_axis_does_not_save_a_point_behind_beyond_it_on_the_other():
    # a is 0.5% more interactive (inside TPOT's 1% floor) but has a third of b's throughput per GPU
    points = pareto_points(pd.DataFrame([row("a", 9.95, 100), row("b", 10, 300)]))
    assert status(points) == {("a", 1): DOMINATED, ("b", 1): FRONTIER}
    # 20% more interactive is beyond the noise: then both are on the frontier
    points = pareto_points(pd.DataFrame([row("a", 8, 100), row("b", 10, 300)]))
    assert set(points["status"]) == {FRONTIER}


def test_the_sample_ci_of_tpot_widens_the_band():
    # 10 vs 11 ms is 10% apart, beyond the 1% floor; a cell whose own median CI reaches across is a tie on x
    wide = {"tpot_p50_ms_sample_ci95_lo": 8.0, "tpot_p50_ms_sample_ci95_hi": 12.5}
    assert status(pareto_points(pd.DataFrame([row("a", 10, 100), row("b", 11, 100)])))[("b", 1)] == DOMINATED
    assert set(pareto_points(pd.DataFrame([row("a", 10, 100, **wide), row("b", 11, 100)]))["status"]) == {FRONTIER}


def test_repeated_trials_judge_by_their_confidence_intervals():
    def trials(config, values):
        return [row(config, 10, v, trial=t) for t, v in enumerate(values)]
    noisy = pareto_points(pd.DataFrame(trials("a", [100, 160, 40]) + trials("b", [120, 125, 118])))
    assert set(noisy["status"]) == {FRONTIER} and set(noisy["trials"]) == {3}     # a's CI spans b's
    tight = pareto_points(pd.DataFrame(trials("a", [100, 101, 99]) + trials("b", [120, 121, 119])))
    assert status(tight) == {("a", 1): DOMINATED, ("b", 1): FRONTIER}
    a = tight[tight["config"] == "a"].iloc[0]
    assert a["output_tok_s_per_gpu_lo"] == pytest.approx(100 - 2.484, abs=1e-3)     # t(2) = 4.303 × 1/√3
    assert a["output_tok_s_per_gpu_hi"] == pytest.approx(100 + 2.484, abs=1e-3)


def test_a_contaminated_cell_neither_joins_the_frontier_nor_pushes_a_point_off_it():
    points = pareto_points(pd.DataFrame([row("a", 10, 100), row("b", 2, 900, contaminated=True)]))
    assert status(points) == {("a", 1): FRONTIER, ("b", 1): CONTAMINATED}
    assert frontier_configs(points) == {"fixed": {("512/64", "main"): ["a"]}}


def test_a_cell_without_tpot_or_gpus_is_not_placed_but_keeps_its_cost():
    points = pareto_points(pd.DataFrame([row("a", None, 100), row("b", 10, None), row("c", 10, 50)]), 3.6)
    assert status(points) == {("a", 1): UNPLACED, ("b", 1): UNPLACED, ("c", 1): FRONTIER}
    a = points[points["config"] == "a"].iloc[0]
    assert a["tok_s_per_user"] is None and a["cost_usd_per_mtok"] == pytest.approx(10.0)


def test_each_shape_and_stream_has_its_own_frontier_and_rates_of_one_shape_share_one():
    points = pareto_points(pd.DataFrame([
        row("a", 10, 100, workload="512/64@2/s", suite="rate"), row("b", 10, 50, workload="512/64@4/s", suite="rate"),
        row("b", 5, 900, workload="4096/64@2/s", suite="rate"),            # other work: dominates nothing above
        row("a", 10, 100, suite="mixed", stream="steady"), row("b", 10, 500, suite="mixed", stream="burst")]))
    assert frontier_configs(points) == {"rate": {("512/64", "main"): ["a"], ("4096/64", "main"): ["b"]},
                                        "mixed": {("512/64", "steady"): ["a"], ("512/64", "burst"): ["b"]}}
    assert points.loc[points["workload"] == "512/64@4/s", "dominated_by"].iloc[0] == "a 2 req/s (≤1 in flight)"


def test_cost_per_million_output_tokens():
    # $3.60 per GPU-hour is $0.001 per GPU-second: at 1000 tok/s per GPU, $1 per million tokens
    assert cost_usd_per_mtok(3.6, 1000.0) == pytest.approx(1.0)
    # 2 GPUs at $2 an hour serving 500 tok/s together: $4/h over 1.8 M tokens an hour
    assert cost_usd_per_mtok(2.0, 500.0 / 2) == pytest.approx(4.0 / 1.8)
    assert cost_usd_per_mtok(0.0, 1000.0) == 0.0
    assert cost_usd_per_mtok(None, 1000.0) is None and cost_usd_per_mtok(3.6, None) is None
    assert cost_usd_per_mtok(3.6, 0.0) is None


def test_points_carry_cost_only_with_a_price_and_energy_only_where_the_gpus_were_read():
    summary = pd.DataFrame([row("a", 10, 250), row("b", 20, 500, 8)])
    priced = pareto_points(summary, 1.8)
    assert priced["cost_usd_per_mtok"].tolist() == pytest.approx([2.0, 1.0])
    assert pareto_points(summary)["cost_usd_per_mtok"].tolist() == [None, None]
    assert priced["energy_j_per_token"].tolist() == [None, None]
    read = pd.DataFrame([row("a", 10, 250, energy_j_per_token=0.25), row("b", 20, 500, 8, energy_j_per_token=None)])
    assert pareto_points(read)["energy_j_per_token"].tolist() == [0.25, None]


def test_an_empty_summary_gives_no_points():
    points = pareto_points(pd.DataFrame())
    assert points.empty and list(points.columns) == POINT_COLUMNS and frontier_configs(points) == {}


def test_random_clouds_always_keep_an_undominated_frontier():
    rng = random.Random(7)
    for _ in range(200):
        rows = [row(f"c{i}", rng.uniform(5, 50), rng.uniform(10, 1000), concurrency=k)
                for i in range(4) for k in (1, 4, 16)]
        points = pareto_points(pd.DataFrame(rows)).to_dict("records")
        front = [p for p in points if p["status"] == FRONTIER]
        assert front
        for p in points:
            assert (p["status"] == DOMINATED) == (p["dominated_by"] is not None)
        marks = {(r["config"], r["concurrency"]): r for r in rows}
        for p in front:
            me = {**marks[(p["config"], p["concurrency"])], "tok_s_per_user": p["tok_s_per_user"], "trials": 1}
            for q in points:
                other = {**marks[(q["config"], q["concurrency"])], "tok_s_per_user": q["tok_s_per_user"], "trials": 1}
                assert not dominates(other, me)
