"""One suite of one configuration on Kubernetes, measured inside the cluster: the suite's load generator Job
(tasks.k8s.loadgen) measures the cells not yet recorded; its records are appended and each cell attempt's end
written to the ledger, as run_suite does for the runner's own load generator. A log that comes back cut short
keeps the requests it holds; cells without their closing line are failed in the ledger (a resume measures them
again), and the configuration fails with the reason."""
from __future__ import annotations

from pathlib import Path

from prefect import task
from prefect.cache_policies import NO_CACHE

from epdbench.analysis.metrics import summarize
from epdbench.flows.suite import announce_cell, cell_status, say
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, spec_to_yaml
from epdbench.specs.workload import plan_cells
from epdbench.tasks.k8s.loadgen import run_loadgen_job
from epdbench.tasks.rundir.results import append_records
from epdbench.tasks.rundir.resume import record_attempt

RECORD_FIELDS = ("request_id", "index", "phase", "api", "target_prompt_tokens", "max_tokens", "prompt_hash", "image_px",
                 "image_hash", "scheduled_ns", "send_ns", "send_wall_s", "status", "ok", "error", "ttft_ms", "e2e_ms",
                 "done_ms", "prompt_tokens", "output_tokens", "cached_tokens", "chunk_offsets_ns", "chunk_tokens",
                 "timing", "chunk_arrival_ns", "trace")


class LoadgenIncomplete(RuntimeError):
    """The in-cluster load generator's output could not be read back whole."""


@task(name="run-suite-in-cluster", cache_policy=NO_CACHE, retries=0)
def run_suite_in_cluster(dep, version: str, spec: ExperimentSpec, suite: str, config: ConfigurationSpec, run: str,
                         records_path: str, calibration: dict, skip: frozenset = frozenset(), progress=None,
                         timeout_s: float = 3600.0, traces=None) -> list[dict]:
    """`dep` the served KubeDeployment: its API client, and its run label, which the Job and its ConfigMap carry
    so teardown deletes them with the rest of the configuration. With `traces` (a TraceCollector pulling from the
    collector beside the router), each cell's traced requests' spans are appended after its records."""
    import pandas as pd

    cells = [c for c in plan_cells(spec) if c.suite == suite]
    todo = [f"{c.cell_id}#t{t}" for t in range(spec.trials) for c in cells if (c.cell_id, t) not in skip]
    if not todo:
        say(f"  [{config.name}] {suite}: already recorded, skipped (resume)")
        if progress:
            progress.cell_done(len(cells) * spec.trials)
        return []
    placement = spec.target.kubernetes.loadgen.placement
    say(f"  [{config.name}] {suite}: measured by a load generator Job in the cluster ({placement}), "
        f"{len(todo)} cell(s)")
    only = None if len(todo) == len(cells) * spec.trials else todo
    result = run_loadgen_job(dep.api, spec, config, dep.run, suite, spec_to_yaml(spec), calibration, version,
                             timeout_s, only=only, say=lambda line: say(f"  [{config.name}] {line}"))
    rdir = Path(records_path).parent
    by_id = {c.cell_id: c for c in cells}
    done: list[dict] = []
    for key in todo:
        cell_id, trial = key.rsplit("#t", 1)
        cell, trial = by_id[cell_id], int(trial)
        rows = [{**{k: r.get(k) for k in RECORD_FIELDS}, "run": run, "trial": trial, "config": config.name,
                 "suite": cell.suite, "cell": cell.cell_id, "workload": cell.workload, "stream": cell.stream,
                 "concurrency": cell.concurrency}
                for r in result.records if r.get("cell") == cell_id and r.get("trial") == trial]
        if rows:
            append_records(Path(records_path), rows)
            if traces is not None and traces.add_records(rows):
                traces.flush()
        noise = result.noise.get((cell_id, trial))
        if noise is None or not result.complete:
            record_attempt(rdir, config.name, cell_id, trial, "failed",
                           f"load generator output incomplete; {len(rows)} finished requests kept")
            continue
        status, reason = cell_status(rows, spec.max_failed_fraction, [])
        if getattr(dep, "telemetry", None) is not None:   # the GPUs over the cell's window (the Job's clock)
            noise = {**noise, **dep.telemetry.cell(rows)}
        record_attempt(rdir, config.name, cell_id, trial, status, reason, noise)
        summary = summarize(pd.DataFrame(rows), noise={(config.name, cell_id, trial): noise}).iloc[0].to_dict()
        announce_cell(config.name, cell, trial, summary, status, reason)
        if progress:
            progress.cell_done()
        done.append({"cell": cell, "trial": trial, "rows": rows, "status": status, "reason": reason})
    if not result.complete:
        raise LoadgenIncomplete(f"{suite}: {result.problem}")
    return done
