"""Fitting the simulator's constants (analysis.fit) with a synthetic predictor whose figures are a known
function of the constants: no simulator, each fit in well under a second. The synthetic law is a roofline's, so
the specs fitted run on the roofline laws (hardware.op_laws roofline), whose efficiencies it reads; under the
measured laws the measured speed factors take their place."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from epdbench.analysis import dfo, fit
from epdbench.specs.models import load_spec, select_configurations
from epdbench.specs.workload import plan_cells

# (suite, workload, input tokens, output tokens, concurrency, image megapixels): the smoke spec's fixed cells
# and its image cell.
CELLS = [("fixed", "512/64", 512, 64, 1, 0.0), ("fixed", "512/64", 512, 64, 8, 0.0),
         ("fixed", "4096/64", 4096, 64, 1, 0.0), ("fixed", "4096/64", 4096, 64, 8, 0.0),
         ("mm-context", "1k:560px+624/64", 1024, 64, 4, 0.3136)]
HIDDEN = {"compute_efficiency": 0.35, "hbm_efficiency": 0.6, "step_overhead_ms": 2.0, "tcp_gb_s": 1.5,
          "tcp_latency_ms": 4.0, "rdma_efficiency": 0.5, "rdma_latency_ms": 1.0, "image_preprocess_ms_per_mp": 60.0,
          "request_hop_ms": 5.0}


def synthetic_summary(spec) -> pd.DataFrame:
    """A summary whose figures follow a roofline-like law of the hardware constants (ms, tok/s)."""
    hw = spec.hardware
    rows = []
    for c in spec.configurations:
        for suite, workload, n_in, n_out, conc, mpx in CELLS:
            prefill = n_in * 0.01 / hw.compute_efficiency + hw.step_overhead_ms
            if c.kv_transport == "tcp":
                link = n_in * 0.05 / hw.tcp_gb_s + hw.tcp_latency_ms
            elif c.kv_transport == "rdma":
                link = n_in * 0.05 / (40 * hw.rdma_efficiency) + hw.rdma_latency_ms
            else:
                link = 0.0
            hops = 1 if c.topology == "aggregated" else 3        # legs and pulls on the request's path
            ttft = (prefill * (1 + 0.4 * (conc - 1)) + link + mpx * hw.image_preprocess_ms_per_mp
                    + hops * hw.request_hop_ms)
            tpot = 4.0 / hw.hbm_efficiency * (1 + 0.02 * conc) + hw.step_overhead_ms
            e2e_s = (ttft + tpot * (n_out - 1)) / 1e3
            rows.append({"config": c.name, "suite": suite, "workload": workload, "concurrency": conc,
                         "stream": "main", "trial": 0, "ttft_p50_ms": ttft, "ttft_p95_ms": ttft * 1.2,
                         "tpot_p50_ms": tpot, "itl_p99_ms": tpot * 1.5, "output_tok_s": conc * n_out / e2e_s,
                         "req_s": conc / e2e_s})
    return pd.DataFrame(rows)


def roofline(name: str):
    """Preset `name` on the roofline laws, whose efficiencies the synthetic law reads."""
    spec = load_spec(name)
    return spec.model_copy(update={"hardware": spec.hardware.model_copy(update={"op_laws": "roofline"})})


@pytest.fixture(scope="module")
def smoke():
    return select_configurations(roofline("smoke"), ["aggregated", "pd-tcp", "pd-rdma"])


def run_of(spec, values: dict) -> pd.DataFrame:
    return synthetic_summary(fit.spec_with(spec, values))


def test_fitting_recovers_the_hidden_constants(smoke):
    observed = fit.observed_cells(run_of(smoke, HIDDEN))
    result = fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=100)
    # smoke runs every role at TP 1; on the roofline laws the measured factors act on nothing
    assert set(result.left) == {"allreduce_latency_us", *fit.LAW_CONSTANTS["measured"]}
    for name, hidden in HIDDEN.items():
        assert result.values[name] == pytest.approx(hidden, rel=0.03), name
    assert result.loss < 1e-4 < result.start_loss
    assert all(e < 0.01 for e in fit.relative_errors(observed, result.predicted).values())


def test_a_table_with_only_some_metric_columns_is_fitted_on_what_is_there(smoke):
    run = run_of(smoke, HIDDEN)[fit.MATCH_KEYS + ["ttft_p50_ms", "tpot_p50_ms"]]
    observed = fit.observed_cells(run)
    assert list(observed.columns) == ["ttft_p50_ms", "tpot_p50_ms"]
    result = fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=100)
    for name in ("compute_efficiency", "hbm_efficiency", "step_overhead_ms", "tcp_gb_s"):
        assert result.values[name] == pytest.approx(HIDDEN[name], rel=0.05), name
    assert set(fit.relative_errors(observed, result.predicted)) == {"ttft_p50_ms", "tpot_p50_ms"}


def test_missing_cells_and_unknown_cells_are_left_out(smoke):
    run = run_of(smoke, HIDDEN)
    run = run[~((run["config"] == "pd-tcp") & (run["concurrency"] == 8))]
    extra = run.iloc[[0]].assign(workload="999/9")      # a cell the predictor never produces
    observed = fit.observed_cells(pd.concat([run, extra]))
    result = fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=100)
    assert result.values["compute_efficiency"] == pytest.approx(HIDDEN["compute_efficiency"], rel=0.05)
    assert len(fit.matched(observed, result.predicted)) == len(observed) - 1


def test_no_matching_cell_is_an_input_error(smoke):
    run = run_of(smoke, HIDDEN).assign(workload="1/1")
    with pytest.raises(fit.FitInputError, match="no observed cell"):
        fit.fit_constants(smoke, fit.observed_cells(run), synthetic_summary, max_evaluations=20)


def test_constants_no_configuration_uses_are_left_as_in_the_spec():
    spec = select_configurations(roofline("smoke"), ["aggregated"])
    observed = fit.observed_cells(run_of(spec, HIDDEN))
    result = fit.fit_constants(spec, observed, synthetic_summary, max_evaluations=200)
    assert set(result.left) == {"tcp_gb_s", "tcp_latency_ms", "rdma_efficiency", "rdma_latency_ms",
                                "allreduce_latency_us", *fit.LAW_CONSTANTS["measured"]}
    assert all("RDMA" in result.left[n] for n in ("rdma_efficiency", "rdma_latency_ms"))
    assert set(result.values) == {"compute_efficiency", "hbm_efficiency", "step_overhead_ms",
                                  "image_preprocess_ms_per_mp", "request_hop_ms"}   # smoke's image cell tells it


def test_a_spec_with_tp_tcp_and_rdma_configurations_uses_every_free_constant():
    used, left = fit.structural_constants(roofline("pd-text"))
    assert used == [n for n in fit.FREE_CONSTANTS if n not in ("image_preprocess_ms_per_mp",
                                                                *fit.LAW_CONSTANTS["measured"])]
    assert left["image_preprocess_ms_per_mp"] == "no cell of the run sends images"       # pd-text is text only
    used, left = fit.structural_constants(roofline("smoke"))
    assert "tensor-parallel" in left["allreduce_latency_us"] and "image_preprocess_ms_per_mp" in used
    assert fit.sends_images(load_spec("epd-multimodal")) and not fit.sends_images(load_spec("pd-text"))


def test_the_operator_laws_of_the_spec_choose_between_the_efficiencies_and_the_measured_factors():
    used, left = fit.structural_constants(load_spec("pd-text"))       # the default: measured laws
    assert {"measured_compute_factor", "measured_hbm_factor"} <= set(used)
    for name in fit.LAW_CONSTANTS["roofline"]:
        assert left[name] == ("the spec's operators follow the measured laws (hardware.op_laws), not the roofline "
                              "ones it acts on")
    _, left = fit.structural_constants(roofline("pd-text"))
    assert set(fit.LAW_CONSTANTS["measured"]) <= set(left) and not set(fit.LAW_CONSTANTS["roofline"]) & set(left)
    spec = load_spec("pd-text")                                        # a model the timings lack: the roofline
    other = spec.model_copy(update={"model": spec.model.model_copy(update={"name": "acme/Own-32B"})})
    used, left = fit.structural_constants(other)
    assert set(fit.LAW_CONSTANTS["roofline"]) <= set(used) and set(fit.LAW_CONSTANTS["measured"]) <= set(left)


def test_the_engine_constants_are_those_acting_inside_an_engine_the_vision_speed_among_them():
    from epdbench.specs.profile import ENGINE_CONSTANTS

    truth = load_spec("vllm-truth")
    used, left = fit.structural_constants(truth, ENGINE_CONSTANTS)
    assert used == ["measured_compute_factor", "measured_hbm_factor", "measured_vision_factor", "vision_pass_ms",
                    "step_overhead_ms", "tokenize_us_per_token", "request_render_ms", "image_preprocess_ms_per_mp"]
    assert set(left) == {"compute_efficiency", "hbm_efficiency", "allreduce_latency_us"}
    text = truth.model_copy(update={"suites": truth.suites[:1]})
    assert fit.structural_constants(text, ENGINE_CONSTANTS)[1]["measured_vision_factor"] == \
        fit.structural_constants(text, ENGINE_CONSTANTS)[1]["vision_pass_ms"] == "no cell of the run sends images"
    rooflined = fit.structural_constants(roofline("vllm-truth"), ENGINE_CONSTANTS)[1]
    assert "vision tower follows the roofline laws" in rooflined["measured_vision_factor"]
    # a run's client figures cannot tell the tower from the API server's preprocessing: calibrate --from leaves
    # it out, as before it existed
    assert "measured_vision_factor" not in fit.structural_constants(truth)[0] + list(fit.structural_constants(truth)[1])


def test_a_constant_that_moves_no_observed_figure_is_not_fitted(smoke):
    def predictor(spec):   # the RDMA latency does not reach any figure
        return synthetic_summary(fit.spec_with(spec, {"rdma_latency_ms": 1.0}))

    observed = fit.observed_cells(predictor(fit.spec_with(smoke, HIDDEN)))
    result = fit.fit_constants(smoke, observed, predictor, max_evaluations=100)
    assert set(result.left) == {"rdma_latency_ms", "allreduce_latency_us", *fit.LAW_CONSTANTS["measured"]}
    assert "moves no observed figure" in result.left["rdma_latency_ms"]
    assert result.effects["rdma_latency_ms"] == 0.0 < result.effects["rdma_efficiency"]


def test_a_latency_the_spec_sets_to_zero_is_searched_from_the_scale_where_the_run_shows_it(smoke):
    """smoke sets tcp_latency_ms to 0 (test_fitting_recovers_the_hidden_constants recovers 4 ms from there); a
    zero latency that moves nothing at any scale is left, saying so, and one that is truly zero stays near it."""
    assert smoke.hardware.tcp_latency_ms == 0

    def blind(spec):   # the TCP latency reaches no figure
        return synthetic_summary(fit.spec_with(spec, {"tcp_latency_ms": 0.001}))
    result = fit.fit_constants(smoke, fit.observed_cells(blind(fit.spec_with(smoke, HIDDEN))), blind,
                               max_evaluations=80)
    assert "sets it to 0 and no value up to 1000 moves an observed figure" in result.left["tcp_latency_ms"]
    assert result.values["compute_efficiency"] == pytest.approx(HIDDEN["compute_efficiency"], rel=0.03)
    zero = {**HIDDEN, "tcp_latency_ms": 0.001}
    result = fit.fit_constants(smoke, fit.observed_cells(run_of(smoke, zero)), synthetic_summary, max_evaluations=80)
    assert result.values["tcp_latency_ms"] < 0.1 and result.loss < 1e-4


def test_the_fit_stays_within_its_budget_and_reports_each_run(smoke):
    observed = fit.observed_cells(run_of(smoke, HIDDEN))
    seen = []
    result = fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=25,
                               on_evaluation=lambda n, budget, loss, best: seen.append((n, budget, loss, best)))
    assert result.evaluations == 25 == len(seen)
    assert [s[0] for s in seen] == list(range(1, 26)) and {s[1] for s in seen} == {25}
    assert all(best <= loss for _, _, loss, best in seen)
    assert [s[3] for s in seen] == sorted((s[3] for s in seen), reverse=True)
    assert result.loss <= min(s[2] for s in seen) + 1e-12


def test_a_budget_too_small_to_probe_is_an_input_error(smoke):
    observed = fit.observed_cells(run_of(smoke, HIDDEN))
    with pytest.raises(fit.FitInputError, match="at least 10 simulator runs"):
        fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=9)


def test_a_budget_spent_on_wide_probes_is_an_input_error(smoke):
    observed = fit.observed_cells(run_of(smoke, HIDDEN))    # rdma_latency_ms (0.05 ms) needs a wide probe
    with pytest.raises(fit.FitInputError, match="ran out while probing the constants.*at least 19"):
        fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=10)


def test_a_shared_cache_spares_the_runs_already_made(smoke):
    observed = fit.observed_cells(run_of(smoke, HIDDEN))
    cache: dict = {}
    first = fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=200, cache=cache)
    again = fit.fit_constants(smoke, observed, synthetic_summary, max_evaluations=200, cache=cache)
    assert 0 < first.evaluations < 200 and again.evaluations == 0     # the first converged
    assert again.values == first.values


def test_loss_is_the_mean_squared_log_ratio_and_a_missing_prediction_is_penalised():
    idx = pd.MultiIndex.from_tuples([("a", "s", "w", 1, "main"), ("a", "s", "w", 2, "main")], names=fit.MATCH_KEYS)
    observed = pd.DataFrame({"ttft_p50_ms": [10.0, 20.0], "req_s": [1.0, np.nan]}, index=idx)
    assert fit.loss(observed, observed * 2) == pytest.approx(math.log(2) ** 2)
    half_missing = (observed * 2).assign(ttft_p50_ms=[20.0, np.nan])
    assert fit.loss(observed, half_missing) == pytest.approx(
        (2 * math.log(2) ** 2 + math.log(fit.MISSING_RATIO) ** 2) / 3)
    errors = fit.relative_errors(observed, observed.assign(ttft_p50_ms=[11.0, 30.0]))
    assert errors == {"ttft_p50_ms": pytest.approx(0.3), "req_s": pytest.approx(0.0)}


def test_observed_cells_average_trials_and_normalise_keys():
    table = pd.DataFrame({"config": ["pd-tcp", "pd-tcp", "pd-tcp"], "suite": ["fixed"] * 3,
                          "workload": ["512/64"] * 3, "concurrency": ["8", 8.0, 1], "stream": ["main"] * 3,
                          "trial": [0, 1, 0], "ttft_p50_ms": [10.0, 20.0, None], "itl_max_ms": [1.0, 1.0, 1.0],
                          "tpot_p50_ms": [5.0, None, 0.0]})
    cells = fit.observed_cells(table)
    assert list(cells.columns) == ["ttft_p50_ms", "tpot_p50_ms"]       # itl_max_ms is not fitted
    assert cells.loc[("pd-tcp", "fixed", "512/64", 8, "main")].tolist() == [15.0, 5.0]
    assert len(cells) == 1                                              # the c1 row has no positive figure


@pytest.mark.parametrize("columns, message", [
    (["config", "suite", "workload", "ttft_p50_ms"], "no key column"),
    (["config", "suite", "workload", "concurrency", "stream", "itl_max_ms"], "no metric column"),
])
def test_a_table_without_keys_or_metrics_is_an_input_error(columns, message):
    table = pd.DataFrame([{c: 1 for c in columns}])
    with pytest.raises(fit.FitInputError, match=message):
        fit.observed_cells(table)


def test_contaminated_cells_are_not_fitted():
    table = pd.DataFrame({"config": ["a", "b"], "contaminated": [True, "False"]})
    assert fit.usable_rows(table)["config"].tolist() == ["b"]


def test_the_spec_is_narrowed_to_what_was_observed_and_unknown_names_are_errors():
    spec = roofline("smoke")
    observed = fit.observed_cells(run_of(select_configurations(spec, ["pd-tcp"]), HIDDEN))
    narrowed = fit.spec_for_cells(spec, observed)
    assert [c.name for c in narrowed.configurations] == ["pd-tcp"]
    assert [s.name for s in narrowed.suites] == ["fixed", "mm-context"]          # not smoke's mixed suite
    with pytest.raises(fit.FitInputError, match="config pd-tcp not in spec"):
        fit.spec_for_cells(select_configurations(spec, ["aggregated"]), observed)
    wrong = fit.observed_cells(run_of(select_configurations(spec, ["pd-tcp"]), HIDDEN).assign(concurrency=3))
    with pytest.raises(fit.FitInputError, match="no observed cell is one the spec runs"):
        fit.spec_for_cells(spec, wrong)


def test_the_holdout_split_is_seeded_and_keeps_every_configuration_in_the_fit():
    keys = [(c, "s", f"w{i}", 1, "main") for c, n in (("a", 7), ("b", 4), ("c", 1)) for i in range(n)]
    cells = pd.MultiIndex.from_tuples(keys, names=fit.MATCH_KEYS)
    held = fit.holdout_mask(cells, seed=3)
    assert (held == fit.holdout_mask(cells, seed=3)).all()
    assert any((fit.holdout_mask(cells, seed=s) != held).any() for s in range(4, 10))
    configs = np.array([k[0] for k in keys])
    assert [int((~held & (configs == c)).sum()) for c in "abc"] == [4, 2, 1]
    assert [int((held & (configs == c)).sum()) for c in "abc"] == [3, 2, 0]


def test_the_search_minimises_a_nonlinear_least_squares_problem_within_its_box():
    target = np.array([0.3, -0.2])

    def f(x):   # residuals of a curved valley whose minimum, zero, is at `target`
        return np.array([10 * (x[1] - target[1] - (x[0] - target[0]) ** 2), x[0] - target[0], np.exp(x[0]) - 1.35])

    def run(lower):
        points = np.array([[0.0, 0.0], [0.4, 0.0], [0.0, 0.4]])
        return dfo.least_squares_dfo(f, points, np.array([f(p) for p in points]), np.array(lower),
                                     np.array([1.0, 1.0]), radius=0.4, xtol=1e-7, max_radius=math.log(10))

    x, r = run([-1.0, -1.0])
    assert x == pytest.approx(target, abs=1e-3) and r == pytest.approx(f(x))
    x, _ = run([-1.0, 0.0])              # the minimum is outside the box: the search stops at its edge
    assert x[1] == pytest.approx(0.0, abs=1e-9) and 0.0 <= x[1]


def test_the_search_stops_when_its_budget_is_spent():
    calls = []

    def f(x):
        if len(calls) == 3:
            raise dfo.BudgetExhausted
        calls.append(x)
        return np.array([x[0] - 5.0])

    points = np.array([[0.0], [1.0]])
    x, r = dfo.least_squares_dfo(f, points, np.array([[-5.0], [-4.0]]), np.array([-10.0]), np.array([10.0]),
                                 radius=1.0, xtol=1e-3, max_radius=math.log(10))
    assert len(calls) == 3 and r[0] ** 2 == min(float((c[0] - 5.0) ** 2) for c in [*calls, [1.0]])


def test_on_its_grid_the_search_lands_on_the_same_point_whatever_the_last_bits_of_its_steps(monkeypatch):
    """A virtual-time run's figures jump with its constants; the last bits of the step's arithmetic differ between
    machines and library builds. Off the grid, steps moved by 1e-13 end elsewhere; on it, on the same point."""
    def f(x):   # a smooth valley plus a term that jumps with the 12th digit of x, as event order does
        return np.array([x[0] - 0.3, 3 * (x[1] + 0.2), 1e-3 * np.sin(1e12 * x[0]) + 1e-3 * np.cos(1e12 * x[1])])

    solve = dfo.lsq_linear

    def search(grid: float, eps: float) -> np.ndarray:
        signs = np.random.default_rng(7)
        monkeypatch.setattr(dfo, "lsq_linear", lambda *a, **k: type("S", (), {"x": solve(*a, **k).x * (
            1 + eps * signs.choice([-1.0, 1.0], size=a[0].shape[1]))})())
        points = np.array([[0.0, 0.0], [0.4, 0.0], [0.0, 0.4]])
        x, _ = dfo.least_squares_dfo(f, points, np.array([f(p) for p in points]), np.array([-1.0, -1.0]),
                                     np.array([1.0, 1.0]), radius=0.4, xtol=1e-3, max_radius=1.0, grid=grid)
        return x

    assert not np.array_equal(search(0.0, 0.0), search(0.0, 1e-13))
    on_grid = search(fit.GRID, 0.0)
    assert np.array_equal(on_grid, search(fit.GRID, 1e-13)) and np.array_equal(on_grid, search(fit.GRID, -1e-11))
    assert on_grid == pytest.approx([0.3, -0.2], abs=0.01)
    assert np.allclose(on_grid / fit.GRID, np.round(on_grid / fit.GRID))     # a grid point (not the start)


def test_the_fitted_constants_are_what_the_search_evaluated_rounded_to_six_digits(smoke):
    runs = []

    def predict(spec):
        runs.append({n: getattr(spec.hardware, n) for n in HIDDEN})
        return synthetic_summary(spec)

    result = fit.fit_constants(smoke, fit.observed_cells(run_of(smoke, HIDDEN)), predict, 80)
    assert all(float(f"{v:.6g}") == v for v in result.values.values())
    assert any(all(run[n] == v for n, v in result.values.items()) for run in runs)
    # the spec's own constants, exactly (within the search's bounds: a zero latency starts at 1 µs)
    assert runs[0] == {n: float(np.clip(getattr(smoke.hardware, n), *fit.BOUNDS[n])) for n in HIDDEN}


def test_constants_left_at_an_edge_of_the_search_range_are_named():
    assert fit.pinned({"compute_efficiency": 1.0, "hbm_efficiency": 0.05, "rdma_efficiency": 0.7,
                       "step_overhead_ms": 1e-3, "tcp_gb_s": 1e4 * (1 - 1e-4), "tcp_latency_ms": 0.5}) == {
        "compute_efficiency": "upper", "hbm_efficiency": "lower", "tcp_gb_s": "upper"}
    # a latency at 1 µs is one too small to matter, not a bound hit
    assert fit.pinned({"step_overhead_ms": 1e-3, "request_hop_ms": 1e-3}) == {}


def test_several_configurations_are_kept_and_each_ones_unplanned_cells_named():
    spec = load_spec("gpu-qwen25vl")                    # aggregated, pd-mooncake-tcp, pd-nixl-tcp, epd
    keys = [(c, cell.suite, cell.workload, cell.concurrency, cell.stream) for c in ("epd", "aggregated")
            for cell in plan_cells(spec) if cell.suite == "text"]
    keys.append(("epd", "text", "1024/128", 3, "main"))  # a concurrency the spec does not run
    observed = pd.DataFrame({"ttft_p50_ms": 1.0}, index=pd.MultiIndex.from_tuples(keys, names=fit.MATCH_KEYS))
    narrowed = fit.spec_for_cells(spec, observed)
    assert [c.name for c in narrowed.configurations] == ["aggregated", "epd"]       # the spec's order
    assert [s.name for s in narrowed.suites] == ["text"]
    assert fit.unplanned(narrowed, observed) == [("epd", "text", "1024/128", 3, "main")]
