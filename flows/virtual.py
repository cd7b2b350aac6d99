"""One configuration measured in virtual time (`compare --clock virtual`): every suite's cells served by the
simulator's engines on a virtual-time loop (tasks.sim.vrun), each cell's records appended and its ledger entry
written as it ends, as a real-clock run does, with its traced requests' spans (traces/<config>.parquet, through the
run's trace collector, as a real-clock run writes them); then the evidence of what the model did (tasks.evidence)."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
from prefect import task
from prefect.cache_policies import NO_CACHE

from epdbench.analysis.metrics import summarize
from epdbench.flows.suite import announce_cell, cell_status, say
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.specs.workload import Calibration, Cell
from epdbench.tasks import evidence
from epdbench.tasks.load.otlp_receiver import TraceCollector
from epdbench.tasks.rundir.traces import traces_path
from epdbench.tasks.rundir.resume import record_attempt
from epdbench.tasks.rundir.results import append_records
from epdbench.tasks.sim.vrun import prompt_calibration, serve_configuration

# Virtual time has no host between the model and its clock: no client lag, no emulation lag.
VIRTUAL_NOISE = {"loop_lag_p99_ms": 0.0, "emulation_lag_p99_ms": 0.0, "emit_lag_p99_ms": 0.0}

VIRTUAL_ROUTER = "modelled in virtual time (vllm-router's round robin; its PD and the EPD proxy's legs)"


class Interrupted(Exception):
    """The run was interrupted between two cells (the caller's `stop` said so)."""


def virtual_calibration(spec: ExperimentSpec) -> dict:
    """Prompt synthesis calibrated against the simulator's own tokenizer, as calibration.json keeps it."""
    return {k: list(v) for k, v in prompt_calibration(spec).fits.items()}


@task(name="run-virtually", cache_policy=NO_CACHE, retries=0)
def run_virtually(spec: ExperimentSpec, config: ConfigurationSpec, run: str, rdir: str, calibration: dict,
                  skip: frozenset = frozenset(), progress=None, stop=None) -> tuple[list[dict], dict]:
    """Every cell and trial of one configuration on a fresh virtual deployment, in a run's order. A cell in
    `skip` ((cell id, trial) recorded by an earlier attempt) is served again, as the deployment's caches must
    see it, but neither recorded nor announced: virtual time is deterministic, so it is the same cell. `stop()`
    True ends the run between cells (Interrupted). Returns the cells (as flows.suite.run_suite's) and what
    the deployment saw (tasks.evidence.virtual_observation) with every row it served per suite, skipped cells'
    included (its counters count them too). With tracing on, each recorded cell's spans are appended to
    traces/<config>.parquet after its records and before its ledger entry (a cell done is a cell traced)."""
    path = Path(rdir) / "records.parquet"
    traces = TraceCollector(traces_path(Path(rdir), config.name)) if spec.tracing.enabled else None
    cal = Calibration({k: tuple(v) for k, v in calibration.items()})
    items: list[dict] = []
    seen: dict = {"served": {}}

    def keep(cell: Cell, trial: int, rows: list[dict]) -> None:
        if stop is not None and stop():
            raise Interrupted
        seen["served"].setdefault(cell.suite, []).extend(rows)
        if (cell.cell_id, trial) in skip:
            if traces is not None:
                traces.discard(rows)
            return
        append_records(path, rows)
        if traces is not None and traces.add_records(rows):
            traces.flush(0)
        status, reason = cell_status(rows, spec.max_failed_fraction, [])
        record_attempt(Path(rdir), config.name, cell.cell_id, trial, status, reason, VIRTUAL_NOISE)
        noise = {(config.name, cell.cell_id, trial): VIRTUAL_NOISE}
        summary = summarize(pd.DataFrame(rows), noise=noise).iloc[0].to_dict()
        announce_cell(config.name, cell, trial, summary, status, reason)
        if progress:
            progress.cell_done()
        items.append({"cell": cell, "trial": trial, "rows": rows, "status": status, "reason": reason})

    def observe(cluster) -> None:
        seen.update(evidence.virtual_observation(cluster))

    if skip:
        say(f"  [{config.name}] {len(skip)} cell(s) already recorded: served again in virtual time for the "
            "caches, not recorded twice (resume)")
    serve_configuration(spec, config, cal, keep, run, observe, traces.receive if traces is not None else None)
    return items, seen

