"""A spec's cells in virtual time with their engines' own step timings: the summary a run's summary.csv has, and
per cell the mean queue, prefill, decode, TTFT and time per output token its engines report (as vLLM's /metrics
histograms do: analysis.engine_steps), from the spans of every measured request."""
from __future__ import annotations

import pandas as pd

from epdbench.analysis.engine_steps import engine_means
from epdbench.analysis.metrics import CELL_KEYS, summarize
from epdbench.specs.models import ExperimentSpec
from epdbench.specs.tracing import TracingSpec
from epdbench.tasks.sim.vrun import prompt_calibration, serve_configuration

EVERY_REQUEST = TracingSpec.model_fields["per_cell"].metadata[-1].le     # the most requests a cell traces


def simulate_cells(spec: ExperimentSpec) -> pd.DataFrame:
    """The summary of `spec` run in virtual time (tasks.sim.vrun), with the engine means (ENGINE_MEANS and
    engine_requests) of each cell joined on: every measured request traced (up to the tracing limit per cell,
    spread evenly beyond it)."""
    traced = spec.model_copy(update={"tracing": TracingSpec(enabled=True, per_cell=EVERY_REQUEST)})
    calibration = prompt_calibration(traced)
    rows: list[dict] = []
    spans: list[dict] = []
    for config in traced.configurations:
        serve_configuration(traced, config, calibration, lambda cell, trial, cell_rows: rows.extend(cell_rows),
                            spans=spans.extend, anchor_ns=0)
    records = pd.DataFrame(rows)
    summary = summarize(records, {c.name: c.gpus for c in spec.configurations})
    return summary.merge(engine_means(spans, records), on=CELL_KEYS, how="left")
