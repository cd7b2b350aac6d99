"""Whether MLflow equals a results folder: one comparison run, one run per configuration and per cell,
matching statuses and metric values. Reads only; tests and `sync` use it."""
from __future__ import annotations

import math
from pathlib import Path

from epdbench.analysis.metrics import METRIC_KEYS
from epdbench.specs.models import load_spec
from epdbench.tasks.publishing.publish import cell_spans, cells_of, config_outcome
from epdbench.tasks.publishing.traces import existing_traces
from epdbench.tasks.rundir.traces import read_spans, traces_path
from epdbench.tasks.publishing.publish_state import config_key, folder_configs, load_state, read_json
from epdbench.tasks.rundir.results import read_records
from epdbench.tasks.rundir.resume import noise_of
from epdbench.tasks.publishing.tracking import KEY_TAG, PARENT_TAG, Tracker


def _same(a, b) -> bool:
    fa = math.nan if a is None else float(a)
    fb = math.nan if b is None else float(b)
    if math.isnan(fa) or math.isnan(fb):
        return math.isnan(fa) and math.isnan(fb)
    return math.isclose(fa, fb, rel_tol=1e-9, abs_tol=1e-9)


def mlflow_matches_results(tracker_or_uri, rdir: Path) -> list[str]:
    """The differences between MLflow and a results folder (empty when MLflow equals the folder): one
    comparison run for the run's key (FINISHED/FAILED as outcome.json says, once it exists), one configuration
    run per configuration in the folder (status as its outcome says), one FINISHED cell run per (config, cell,
    trial) of records.parquet with the folder's metric values and one MLflow trace per traced request of the cell
(traces/<config>.parquet), and no other run under them. Reads only."""
    rdir = Path(rdir)
    spec = load_spec(str(rdir / "spec.yaml"))
    if isinstance(tracker_or_uri, Tracker):
        tracker = tracker_or_uri
    else:
        try:
            tracker = Tracker(str(tracker_or_uri), spec.tracking.experiment, create=False)
        except LookupError as e:
            return [str(e)]
    run = load_state(rdir)["run"]
    diffs: list[str] = []
    comparisons = tracker.find(run, deleted=False)
    if len(comparisons) != 1:
        diffs.append(f"comparison {run!r}: {len(comparisons)} runs, expected 1")
    outcome = read_json(rdir / "outcome.json")
    configs = folder_configs(rdir, spec)
    records = read_records(rdir / "records.parquet")
    if not comparisons:
        return diffs + [f"configuration {n}: no run (no comparison run)" for n in configs]
    parent = comparisons[0]
    pid = parent.info.run_id
    if isinstance(outcome, dict):
        want = "FINISHED" if all(c.get("ok") for c in outcome.get("configs", {}).values()) else "FAILED"
        if parent.info.status != want:
            diffs.append(f"comparison {run!r}: status {parent.info.status}, expected {want}")
        if (rdir / "report.md").exists() and "report.md" not in {a.path for a in tracker.client.list_artifacts(pid)}:
            diffs.append(f"comparison {run!r}: report.md not among its artifacts")
    wanted = {config_key(run, n): n for n in configs}
    for r in tracker.children(pid, "configuration"):
        if r.data.tags.get(KEY_TAG) not in wanted:
            diffs.append(f"configuration run {r.info.run_id} ({r.data.tags.get('epdbench.config')}, key "
                         f"{r.data.tags.get(KEY_TAG)!r}) under the comparison: not in the folder")
    for key, name in wanted.items():
        runs = tracker.find(key, deleted=False)
        if len(runs) != 1:
            diffs.append(f"configuration {name}: {len(runs)} runs, expected 1")
            if not runs:
                continue
        cr = runs[0]
        ok = bool(config_outcome(rdir, name).get("ok"))
        want = "FINISHED" if ok else "FAILED"
        if cr.info.status != want:
            diffs.append(f"configuration {name}: status {cr.info.status}, expected {want}")
        if cr.data.tags.get("epdbench.status") != ("ok" if ok else "failed"):
            diffs.append(f"configuration {name}: tag epdbench.status {cr.data.tags.get('epdbench.status')!r}, "
                         f"expected {'ok' if ok else 'failed'!r}")
        if cr.data.tags.get(PARENT_TAG) != pid:
            diffs.append(f"configuration {name}: parent {cr.data.tags.get(PARENT_TAG)}, expected {pid}")
        cells = cells_of(records, run, name, noise=noise_of(rdir, [name]))
        spans = read_spans(traces_path(rdir, name))
        found: dict[str, list] = {}
        for c in tracker.children(cr.info.run_id, "cell"):
            found.setdefault(c.data.tags.get(KEY_TAG) or f"(no key) {c.info.run_id}", []).append(c)
        for ckey, runs_ in found.items():
            if ckey not in cells:
                diffs.append(f"cell run {ckey!r}: no such cell in the folder's records")
        for ckey, (row, _) in cells.items():
            runs_ = found.get(ckey, [])
            if len(runs_) != 1:
                diffs.append(f"cell {ckey!r}: {len(runs_)} runs, expected 1")
                if not runs_:
                    continue
            c = runs_[0]
            if c.info.status != "FINISHED":
                diffs.append(f"cell {ckey!r}: status {c.info.status}, expected FINISHED")
            for m in METRIC_KEYS:
                if not _same(row.get(m), c.data.metrics.get(m)):
                    diffs.append(f"cell {ckey!r}: {m} {c.data.metrics.get(m)} in MLflow, {row.get(m)} in the folder")
            want_traces = set(cell_spans(spans, row)["trace_id"]) if len(spans) else set()
            have_traces = set(existing_traces(tracker.client, tracker.experiment_id, c.info.run_id))
            if have_traces != want_traces:
                diffs.append(f"cell {ckey!r}: {len(have_traces)} traces in MLflow, {len(want_traces)} in the folder "
                             f"({len(have_traces - want_traces)} not in the folder, {len(want_traces - have_traces)} "
                             "missing)")
    return diffs
