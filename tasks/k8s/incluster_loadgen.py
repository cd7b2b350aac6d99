"""`epdbench loadgen`: the load generator of one suite of one configuration, as it runs inside the cluster
(a Job next to the router): the same seeded requests as the runner's own path (spec, trial and prompt
calibration give the same prompt hashes), sent to the router's Service, every finished request written to
stdout at once in the wire format of tasks/load/loadgen_wire.py, each cell's client lag after it, and the count
and checksum line at the end.
"""
from __future__ import annotations

import asyncio
from dataclasses import asdict
from typing import Callable

from epdbench.analysis.noise import samples_p99_ms
from epdbench.specs.models import ExperimentSpec
from epdbench.specs.workload import Calibration, build_requests, plan_cells
from epdbench.tasks.load.loadgen import LoadGenerator
from epdbench.tasks.load.loadgen_wire import LoadgenOutput
from epdbench.tasks.load.looplag import LoopLag


async def run_suite_lines(spec: ExperimentSpec, suite: str, url: str, calibration: dict | None, run: str,
                          write: Callable[[str], None], only: set[str] | None = None) -> int:
    """Measure every cell and trial of `suite` against `url` (or only the `cell#tN` in `only`), writing wire
    lines; returns the records written."""
    cells = [c for c in plan_cells(spec) if c.suite == suite]
    if not cells:
        raise ValueError(f"suite {suite!r} is not in spec {spec.name} (suites: "
                         f"{', '.join(s.name for s in spec.suites)})")
    cal = Calibration({k: tuple(v) for k, v in (calibration or {}).items()})
    out = LoadgenOutput()
    batches = [cells] if cells[0].kind == "mixed" else [[c] for c in cells]
    async with LoadGenerator(url, spec.model.name, spec.request_timeout_s, run_tag=run[-8:],
                             processes=spec.client_processes) as lg:
        for trial in range(spec.trials):
            for batch in batches:
                if only is not None and not any(f"{c.cell_id}#t{trial}" in only for c in batch):
                    continue
                requests = [build_requests(spec, c, trial, calibration=cal) for c in batch]
                cell_of = {r.prompt_hash: c.cell_id for c, reqs in zip(batch, requests) for r in reqs}

                def on_record(rec) -> None:
                    write(out.record(cell_of.get(rec.prompt_hash, batch[0].cell_id), trial, asdict(rec)))
                async with LoopLag() as lag:
                    if batch[0].kind == "mixed":
                        await lg.run_streams([(r, c.concurrency) for r, c in zip(requests, batch)], on_record)
                    else:
                        await lg.run_cell(requests[0], batch[0].concurrency, on_record)
                samples = [*lag.samples_s, *lg.take_worker_lag()]
                for c in batch:
                    write(out.cell(c.cell_id, trial, {"loop_lag_p99_ms": samples_p99_ms(samples)}))
    write(out.end())
    return out.records


def run_loadgen(spec: ExperimentSpec, suite: str, url: str, calibration: dict | None, run: str,
                only: set[str] | None = None) -> int:
    return asyncio.run(run_suite_lines(spec, suite, url, calibration, run, lambda line: print(line, flush=True), only))
