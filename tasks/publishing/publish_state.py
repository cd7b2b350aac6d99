"""Where publishing stands: the deterministic keys of MLflow runs, `state.json`, and the fingerprints
that say what is pending (pure reads of the results folder).

Keys. Every run epdbench creates carries the tag `epdbench.key` and is found by it before anything is created
(`Tracker.ensure_run`):
    comparison      <run>
    configuration   <run>/<config>
    cell            <run>/<config>/<suite>/<workload>/c<concurrency>/<stream>/t<trial>
e.g. `tiny-sim-20260101-120000/pd-tcp/fixed/4096/32/c4/main/t0`. `<run>` is the run's name as first recorded in
`state.json` ("run"), so a resumed run (whose flow is handed the folder's name) and `sync` use the key of the
first attempt; a folder without it (old state files) takes outcome.json's "run", else the folder's name.
Configuration and cell keys extend the key of the comparison run they are published under. Runs logged before
keys existed are adopted (tagged with their key) instead of duplicated: the comparison run named in state.json,
a configuration run under it with the same `epdbench.config`, a cell run under that with the same params.

Pending is computed. `state.json` holds, for the MLflow store it refers to ("store": tracking URI and
experiment; another store starts from nothing), a fingerprint of what was published:
    published[config]    sha256 of evidence/<config>/outcome.json, transport.json, stages.json and cells.json
                         (verdicts, cell noise and the figures logged from them) and of that configuration's rows in
                         records.parquet (their
                         count and, sorted by request id: cell, trial, phase, ok, status, prompt hash, send time,
                         TTFT, E2E, output tokens)
    parent_published     sha256 of outcome.json without its mlflow_* / tracking_uri fields, and of the other
                         files of the comparison run (summary.csv, summary_trials.csv, summary.parquet,
                         goodput.csv, records.parquet, report.md, report.html, spec.yaml, calibration.json, plots/,
                         and profile.yaml and pareto.csv when there are)
A piece is pending when its fingerprint differs from the one recorded. The old format (a list of names,
a boolean) loads as "fingerprint unknown", i.e. pending.
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pyarrow.parquet as pq

from epdbench.specs.models import ExperimentSpec
from epdbench.tasks.rundir.results import read_records, write_json
from epdbench.tasks.publishing.tracking import default_tracking_uri

STATE = "state.json"
PARENT_ARTIFACTS = ("report.md", "report.html", "summary.csv", "summary_trials.csv", "summary.parquet",
                    "goodput.csv", "records.parquet", "spec.yaml", "calibration.json", "outcome.json")
# files the comparison run carries only when the folder has them, in its fingerprint only then (so folders
# without one keep the fingerprint they were published with): the calibration profile of `compare --profile`
PROFILE_FILE = "profile.yaml"
# and pareto.csv, the Pareto points of reports written since it was added
OPTIONAL_ARTIFACTS = (PROFILE_FILE, "pareto.csv")
# outcome.json fields about MLflow itself: written after publishing, so not part of what is published
MLFLOW_OUTCOME_FIELDS = ("mlflow_pending", "mlflow_run_id", "mlflow_url", "tracking_uri")
RECORD_FINGERPRINT_COLUMNS = ["request_id", "cell", "trial", "phase", "ok", "status", "prompt_hash", "send_ns",
                              "ttft_ms", "e2e_ms", "output_tokens"]


# --- keys ----------------------------------------------------------------------------------------------

def config_key(run: str, config: str) -> str:
    return f"{run}/{config}"


def cell_key(run: str, config: str, suite: str, workload: str, concurrency, stream: str, trial) -> str:
    return f"{run}/{config}/{suite}/{workload}/c{int(concurrency)}/{stream}/t{int(trial)}"


def store_id(tracking_uri: str, experiment: str) -> str:
    return f"{tracking_uri} experiment={experiment}"


# --- state ---------------------------------------------------------------------------------------------

def read_json(path: Path):
    """A JSON file of the folder, or None when absent or unreadable."""
    try:
        return json.loads(path.read_text()) if path.exists() else None
    except (OSError, ValueError):
        return None


def load_state(rdir: Path, run: str | None = None, store: str | None = None) -> dict:
    """state.json, tolerant of older formats. `run` names a run whose state has no name yet; `store`
    (see store_id) is where this process publishes: state recorded for another store is dropped."""
    rdir = Path(rdir)
    raw = read_json(rdir / STATE)
    state = dict(raw) if isinstance(raw, dict) else {}
    if not state.get("run"):
        outcome = read_json(rdir / "outcome.json")
        state["run"] = (outcome or {}).get("run") or run or rdir.name
    state.setdefault("mlflow_parent", None)
    published = state.get("published")
    if isinstance(published, list):                      # old format: names, fingerprint unknown
        published = {name: None for name in published}
    state["published"] = dict(published) if isinstance(published, dict) else {}
    if not isinstance(state.get("parent_published"), str):   # old format: a boolean
        state["parent_published"] = None
    state.setdefault("store", None)
    if store is not None:
        if state["store"] not in (None, store):
            state.update(mlflow_parent=None, published={}, parent_published=None)
        state["store"] = store
    return state


def save_state(rdir: Path, state: dict) -> None:
    write_json(Path(rdir) / STATE, state)


def resolve_tracking_uri(explicit: str | None, spec: ExperimentSpec) -> str:
    return explicit or spec.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


# --- fingerprints --------------------------------------------------------------------------------------

def _digest(*parts) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _file_digest(path: Path) -> str | None:
    if not path.is_file():
        return None
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _records(rdir: Path, records=None):
    return read_records(Path(rdir) / "records.parquet") if records is None else records


def config_fingerprint(rdir: Path, name: str, records=None) -> str:
    """What a configuration run is made of: its evidence outcome and verdicts, and its records."""
    ev = Path(rdir) / "evidence" / name
    rec = _records(rdir, records)
    mine = rec[rec["config"] == name][RECORD_FINGERPRINT_COLUMNS].sort_values("request_id", kind="stable")
    rows = mine.astype(object).where(mine.notna(), None).values.tolist()
    spans = Path(rdir) / "traces" / f"{name}.parquet"    # its traced requests' spans (tasks.rundir.traces)
    span_ids = (sorted(pq.read_table(spans, columns=["span_id"]).column("span_id").to_pylist())
                if spans.exists() else [])
    return _digest(read_json(ev / "outcome.json"), read_json(ev / "transport.json"),
                   read_json(ev / "stages.json"), read_json(ev / "cells.json"), len(rows), rows,
                   *([span_ids] if span_ids else []))


def comparison_fingerprint(rdir: Path) -> str:
    """What the comparison run is made of: outcome.json (without its MLflow fields) and the files it carries."""
    rdir = Path(rdir)
    outcome = read_json(rdir / "outcome.json")
    if isinstance(outcome, dict):
        outcome = {k: v for k, v in outcome.items() if k not in MLFLOW_OUTCOME_FIELDS}
    files = {name: _file_digest(rdir / name) for name in PARENT_ARTIFACTS if name != "outcome.json"}
    files.update({name: _file_digest(rdir / name) for name in OPTIONAL_ARTIFACTS if (rdir / name).is_file()})
    plots = rdir / "plots"
    if plots.is_dir():
        files.update({f"plots/{p.relative_to(plots)}": _file_digest(p) for p in sorted(plots.rglob("*"))
                      if p.is_file()})
    return _digest(outcome, files)


def folder_configs(rdir: Path, spec: ExperimentSpec | None = None) -> list[str]:
    """Configurations present in the folder (an evidence/<config>/outcome.json), in the spec's order."""
    ev = Path(rdir) / "evidence"
    present = {p.parent.name for p in ev.glob("*/outcome.json")} if ev.is_dir() else set()
    order = [c.name for c in spec.configurations] if spec else []
    return [n for n in order if n in present] + sorted(present - set(order))


def config_pending(state: dict, rdir: Path, name: str, records=None) -> bool:
    return state["published"].get(name) != config_fingerprint(rdir, name, records)


def comparison_pending(state: dict, rdir: Path) -> bool:
    return (Path(rdir) / "outcome.json").exists() and state.get("parent_published") != comparison_fingerprint(rdir)


def pending(state: dict, rdir: Path, spec: ExperimentSpec | None = None) -> list[str]:
    """What MLflow lacks or holds stale: "comparison" and configuration names (JSON-able; empty when none)."""
    records = _records(rdir)
    out = ["comparison"] if comparison_pending(state, rdir) else []
    return out + [n for n in folder_configs(rdir, spec) if config_pending(state, rdir, n, records)]
