"""tasks/sim/engine_times.py: a spec's cells in virtual time with their engines' own step timings from the spans of
every measured request — for lone requests (concurrency 1) exactly the step laws' (physics.lone, through
analysis.engine_steps.lone_engine_cells), chunked prefills and images included."""
from __future__ import annotations

import pytest

from epdbench.analysis.engine_steps import ENGINE_FIT_METRICS, ENGINE_MEANS, engine_figures, lone_engine_cells
from epdbench.analysis.truth import parse_workload
from epdbench.specs.models import load_spec
from epdbench.specs.suites import FixedSuite
from epdbench.tasks.sim.engine_times import simulate_cells


def small_truth_spec(budget: int):
    """vllm-truth's fixed shapes at concurrency 1 and 4, 3 measured requests a cell, with a token budget per step of
    `budget`."""
    spec = load_spec("vllm-truth")
    suites = [FixedSuite(name=s.name, shapes=s.shapes, concurrencies=[1, 4], n_warmup=1, n_measured=3)
              for s in spec.suites if isinstance(s, FixedSuite)]
    return spec.model_copy(update={"suites": suites,
                                   "engine": spec.engine.model_copy(update={"max_num_batched_tokens": budget})})


@pytest.mark.parametrize("budget", [8192, 2048])     # one prefill step each; several, the image's in the first
def test_lone_requests_spend_what_the_step_laws_say(budget):
    spec = small_truth_spec(budget)
    cells = simulate_cells(spec)
    assert (cells["engine_requests"] == 3).all() and cells[list(ENGINE_MEANS)].notna().all().all()
    lone = cells[cells["concurrency"] == 1].reset_index(drop=True)
    shapes = lone.assign(image_px=[parse_workload(w)[0] for w in lone["workload"]], output_tokens=128,
                         prompt_tokens=lone["prompt_tokens_mean"])
    laws = lone_engine_cells(spec, shapes)
    served = engine_figures(lone.assign(output_tokens=128))
    for metric in ENGINE_FIT_METRICS:
        assert served[metric].to_numpy() == pytest.approx(laws[metric].to_numpy(), rel=1e-9), metric
    assert (lone["engine_queue_ms_mean"] == 0).all()
    # engine TTFT: from the API server's receipt, so tokenizing (and an image's preprocessing) come before prefill
    assert (lone["engine_ttft_ms_mean"] > lone["engine_prefill_ms_mean"]).all()


def test_requests_that_share_the_engine_wait_and_stretch_each_others_steps():
    cells = simulate_cells(small_truth_spec(8192)).set_index(["workload", "concurrency"])
    for workload in ("8192/128", "1792px+400/128"):
        lone, shared = cells.loc[(workload, 1)], cells.loc[(workload, 4)]
        assert shared["engine_queue_ms_mean"] > 0
        assert shared["engine_tpot_ms_mean"] > lone["engine_tpot_ms_mean"]
