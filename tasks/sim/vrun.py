"""A spec run in virtual time: every configuration, suite, cell and trial served by sim.vcluster on a
virtual-time loop (sim.vloop), offered by the same load generator logic as a real run (tasks.load.loadgen: closed
loop, first-wave spread, bursts, open-loop arrivals, warm-up then measured, mixed streams), recorded in the
results folder's record format and summarised by analysis.metrics — so its figures mean what a run's do.

No HTTP, no sleeping, no host clock: deterministic for the spec's seed, and as fast as the host can step the
engines. The HTTP simulator and this share the engine, cost model and caches (benchmarks/simulator/vtime_agreement.py
measures how far they agree).

With a span sink, the traced requests (spec.tracing, as a run samples them) get the client span a run's load
generator opens (the record's `trace`) and the simulator's spans (sim.vcluster), all on the virtual clock as epoch
ns from one anchor per deployment (the wall clock when it started, unless given).
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import pandas as pd

from epdbench.analysis.metrics import summarize
from epdbench.otlp import new_span_id, new_trace_id
from epdbench.sim.vcluster import Refused, TraceContext, VirtualCluster
from epdbench.sim.vloop import VirtualTimeLoop, run as run_loop
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.specs.workload import Calibration, Cell, build_requests, calibration_keys, plan_cells
from epdbench.tasks.load.calibrate import fit_calibration
from epdbench.tasks.load.loadgen import LoadGenerator, Record, _fill, records_as_dicts
from epdbench.tasks.load.sse import StreamTiming

RUN = "virtual"
REQUEST_CACHE_CELLS = 64      # cells whose synthesised requests a process keeps (calibrate and whatif re-run cells)
_REQUESTS: dict[tuple, list] = {}


def cell_requests(spec: ExperimentSpec, cell: Cell, trial: int, calibration: Calibration) -> list:
    """specs.workload.build_requests, kept per process for the last REQUEST_CACHE_CELLS cells: what a cell's
    requests are depends on the seed, the model and the suites (never on hardware or deployment), and
    synthesising long prompts costs more than serving them in virtual time. Which of them are traced follows
    spec.tracing, part of the key too."""
    key = (spec.seed, spec.model.model_dump_json(), tuple(s.model_dump_json() for s in spec.suites), cell, trial,
           tuple(sorted(calibration.fits.items())), spec.tracing.model_dump_json())
    if key not in _REQUESTS:
        if len(_REQUESTS) >= REQUEST_CACHE_CELLS:
            _REQUESTS.pop(next(iter(_REQUESTS)))
        _REQUESTS[key] = build_requests(spec, cell, trial, calibration=calibration, stand_in_images=True)
    return _REQUESTS[key]


class VirtualLoadGenerator(LoadGenerator):
    """tasks.load.loadgen.LoadGenerator whose requests go to a VirtualCluster instead of over HTTP; its clock is
    the virtual loop's. A traced request, when the cluster has a span sink, gets its client span (`trace`, epoch
    ns from the cluster's anchor) and passes its context on, as a run's traceparent."""

    def __init__(self, cluster: VirtualCluster, spec: ExperimentSpec, loop: VirtualTimeLoop, tag: str = RUN):
        super().__init__("virtual://", spec.model.name, spec.request_timeout_s, clock=loop.time_ns, run_tag=tag)
        self.cluster = cluster
        self.modelled_scale = 1.0    # token times are the engine's modelled ones, on this same clock
        self.sent = 0

    async def __aenter__(self) -> VirtualLoadGenerator:
        self.session = None
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    async def send(self, session, req, scheduled_ns: int) -> Record:
        self.sent += 1
        rid = f"epd-{self.run_tag}-{req.phase[0]}{req.index}-{self.sent}"
        send_ns = self.clock()
        rec = Record(rid, req.index, req.phase, req.api, req.target_prompt_tokens, req.max_tokens, req.prompt_hash,
                     req.image_px, req.image_hash, scheduled_ns, send_ns, send_ns / 1e9)
        t = StreamTiming()
        ends: list[float] = []          # each token's stamp (loop seconds), as the cluster hands it over
        trace = None
        if req.traced and self.cluster.spans is not None:
            rec.trace = [new_trace_id(), new_span_id(), self.cluster.anchor_ns + send_ns, 0]
            trace = TraceContext(rec.trace[0], rec.trace[1], req.api)
        try:
            prompt = self.cluster.parse(req.api, req.payload)
            rec.status = 200
            async with asyncio.timeout(self.timeout_s):     # in this task: no task per request
                n_prompt, cached = await self.cluster.generate(rid, prompt, ends, trace)
            t.usage = {"prompt_tokens": n_prompt, "completion_tokens": len(ends),
                       "prompt_tokens_details": {"cached_tokens": cached}}
            t.saw_done = True
        except Refused as e:
            rec.status, t.error = 400, f"HTTP 400: {e}"
        except asyncio.TimeoutError:
            t.error = f"timeout after {self.timeout_s:g}s"
        stamps = [round(end_s * 1e9) - send_ns for end_s in ends]
        t.chunk_offsets_ns = t.chunk_modelled_ns = stamps
        t.chunk_tokens = [1] * len(stamps)
        t.done_ns = self.clock() - send_ns
        _fill(rec, t)
        if rec.trace is not None:
            rec.trace[3] = self.cluster.anchor_ns + send_ns + t.done_ns
        return rec


def prompt_calibration(spec: ExperimentSpec) -> Calibration:
    """Prompt synthesis calibrated against the simulator's own tokenizer, as a run calibrates against the
    endpoint's /tokenize (flows.compare.calibrate_prompts)."""
    keys = calibration_keys(spec)
    counter = _Counter(spec)
    return fit_calibration(counter, spec.model.name, keys)


class _Counter:
    """Token count of a request body by the simulator's tokenizer (what POST /tokenize answers)."""

    def __init__(self, spec: ExperimentSpec):
        self.spec = spec

    def __call__(self, body: dict) -> int:
        async def count() -> int:
            cluster = VirtualCluster(self.spec, self.spec.configurations[0])
            return len(cluster.parse("chat" if "messages" in body else "completions", body, check=False).ids)
        return run_loop(count())


def simulate_configuration(spec: ExperimentSpec, config: ConfigurationSpec, calibration: Calibration,
                           on_cell: Callable[[str, Cell, int], None] | None = None) -> list[dict]:
    """Every cell and trial of the spec on one configuration, on a fresh deployment (caches empty), in the
    order a run measures them; returns record rows (tasks.rundir.results.RECORD_SCHEMA)."""
    rows: list[dict] = []

    def keep(cell: Cell, trial: int, cell_rows: list[dict]) -> None:
        rows.extend(cell_rows)
        if on_cell:
            on_cell(config.name, cell, trial)

    serve_configuration(spec, config, calibration, keep)
    return rows


def serve_configuration(spec: ExperimentSpec, config: ConfigurationSpec, calibration: Calibration,
                        keep: Callable[[Cell, int, list[dict]], None], run: str = RUN,
                        observe: Callable[[VirtualCluster], None] | None = None,
                        spans: Callable[[list[dict]], None] | None = None, anchor_ns: int | None = None) -> None:
    """Serve every cell and trial of the spec on one fresh deployment in virtual time, handing each cell's record
    rows (labelled `run`) to `keep` as it ends (a mixed window's cells together, in stream order); `observe`, if
    given, sees the cluster before and after (VirtualCluster.seen kept per replica). With `spans`, the traced
    requests' spans (tasks.load.otlp_receiver's form, resource included) go to it as each leg ends — a cell's all
    before its rows reach `keep` — and their records carry their client span (`trace`); virtual second 0 is
    `anchor_ns` (default: the wall clock now)."""
    loop = VirtualTimeLoop()
    anchor = time.time_ns() if anchor_ns is None else anchor_ns

    def rows_of(cell: Cell, trial: int, recs: list[Record]) -> list[dict]:
        return [{**r, "run": run, "trial": trial, "config": config.name, "suite": cell.suite,
                 "cell": cell.cell_id, "workload": cell.workload, "stream": cell.stream,
                 "concurrency": cell.concurrency} for r in records_as_dicts(recs)]

    async def go() -> None:
        cluster = VirtualCluster(spec, config, spans, anchor)
        if observe:
            for rep in cluster.all():
                rep.seen = set()
        cluster.start()
        try:
            tag = RUN if run == RUN else f"{RUN}-{config.name}"     # a comparison's: unique in its folder, the same
                                                                    # when a resumed attempt serves the cell again
            async with VirtualLoadGenerator(cluster, spec, loop, tag) as lg:
                for suite in spec.suites:
                    cells = [c for c in plan_cells(spec) if c.suite == suite.name]
                    for trial in range(spec.trials):
                        if cells and cells[0].kind == "mixed":
                            requests = [cell_requests(spec, c, trial, calibration) for c in cells]
                            recs = await lg.run_streams([(r, c.concurrency) for r, c in zip(requests, cells)])
                            for cell, cell_recs in zip(cells, recs):
                                keep(cell, trial, rows_of(cell, trial, cell_recs))
                            continue
                        for cell in cells:
                            requests = cell_requests(spec, cell, trial, calibration)
                            keep(cell, trial, rows_of(cell, trial, await lg.run_cell(requests, cell.concurrency)))
            if observe:
                observe(cluster)
        finally:
            await cluster.stop()

    run_loop(go(), loop)


def simulate_records(spec: ExperimentSpec, on_cell: Callable[[str, Cell, int], None] | None = None) -> pd.DataFrame:
    """Records of every configuration of the spec, in virtual time."""
    calibration = prompt_calibration(spec)
    rows = [row for config in spec.configurations for row in simulate_configuration(spec, config, calibration, on_cell)]
    return pd.DataFrame(rows)


def simulate_summary(spec: ExperimentSpec, on_cell: Callable[[str, Cell, int], None] | None = None) -> pd.DataFrame:
    """The summary (summary.csv's columns) of the spec run in virtual time."""
    return summarize(simulate_records(spec, on_cell), {c.name: c.gpus for c in spec.configurations})
