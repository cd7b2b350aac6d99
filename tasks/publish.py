"""Publish a results directory to MLflow, one piece at a time, from the files alone.

The flow publishes each configuration as it finishes and the comparison at the end; when MLflow is
unreachable nothing is lost — `state.json` remembers what is still pending and `epdbench sync RUN`
publishes it later from the same files. Each piece is published once (no duplicate runs).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

from epdbench.analysis.metrics import summarize
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, load_spec
from epdbench.specs.workload import hash_prompt_hashes, plan_cells
from epdbench.tasks.results import read_records, write_json
from epdbench.tasks.tracking import Tracker, default_tracking_uri

STATE = "state.json"
PARENT_ARTIFACTS = ("report.md", "report.html", "summary.csv", "summary_trials.csv", "summary.parquet",
                    "records.parquet", "spec.yaml", "calibration.json", "outcome.json")


def load_state(rdir: Path) -> dict:
    path = rdir / STATE
    state = json.loads(path.read_text()) if path.exists() else {}
    state.setdefault("mlflow_parent", None)
    state.setdefault("published", [])
    state.setdefault("parent_published", False)
    return state


def save_state(rdir: Path, state: dict) -> None:
    write_json(rdir / STATE, state)


def resolve_tracking_uri(explicit: str | None, spec: ExperimentSpec) -> str:
    return explicit or spec.tracking.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def config_outcome(rdir: Path, name: str) -> dict:
    """ok / error / router of a configuration, and its transport and stage verdicts, from evidence/."""
    ev = rdir / "evidence" / name
    out = json.loads((ev / "outcome.json").read_text()) if (ev / "outcome.json").exists() else {}
    for key in ("transport", "stages"):
        f = ev / f"{key}.json"
        out[key] = json.loads(f.read_text()) if f.exists() else {}
    return out


def roles_text(config: ConfigurationSpec) -> str:
    return " + ".join(f"{r.replicas}×{r.role} TP{r.tp}" + (f" {r.rdma_interfaces}×RDMA" if r.rdma_interfaces else "")
                      for r in config.roles)


def evidence_ok(outcome: dict, target: str) -> bool:
    """Ran, and its evidence holds; `emulated` counts only on the simulator target."""
    good = {"verified", "not-applicable"} | ({"emulated"} if target == "sim" else set())
    return (bool(outcome.get("ok")) and outcome["transport"].get("verdict") in good
            and outcome["stages"].get("verdict") in good)


def start_comparison(tracker: Tracker, spec: ExperimentSpec, run: str, rdir: Path, trigger: str,
                     flow_run_id: str | None) -> str:
    return tracker.start_comparison(
        run, tags={"epdbench.target": spec.target.kind, "epdbench.spec": spec.name, "epdbench.trigger": trigger,
                   "epdbench.prefect_flow_run_id": flow_run_id or "", "epdbench.results_dir": str(rdir.resolve())},
        params={"configurations": ",".join(c.name for c in spec.configurations),
                "suites": ",".join(s.name for s in spec.suites), "seed": spec.seed, "trials": spec.trials,
                "model": spec.model.name, "hardware": spec.hardware.gpu})


def publish_configuration(tracker: Tracker, parent: str, spec: ExperimentSpec, config: ConfigurationSpec,
                          rdir: Path) -> str:
    """A configuration run with its evidence, and one cell run per recorded cell × trial."""
    o = config_outcome(rdir, config.name)
    t, st = o["transport"], o["stages"]
    run_id = tracker.log_configuration(
        parent, config.name,
        tags={"epdbench.status": "ok" if o.get("ok") else "failed",
              "epdbench.transport_verdict": t.get("verdict", "none"),
              "epdbench.stages_verdict": st.get("verdict", "none")},
        params={"topology": config.topology, "roles": roles_text(config), "gpus": config.gpus,
                "tp": ",".join(f"{r.role}={r.tp}" for r in config.roles), "transport": config.kv_transport,
                "connectors": "MooncakeConnector" if config.kv_transport != "none" else "none",
                "router": o.get("router", ""),
                "image": "epdbench-sim" if spec.target.kind == "sim" else spec.target.kubernetes.engine.image,
                "engine_args": spec.engine.model_dump_json(), "error": o.get("error") or ""},
        metrics={"transport_verified": 1.0 if t.get("verdict") == "verified" else 0.0,
                 "stages_verified": 1.0 if st.get("verdict") == "verified" else 0.0,
                 "kv_throughput_min_mb_s": t.get("throughput_mb_s_min"),
                 "kv_throughput_max_mb_s": t.get("throughput_mb_s_max"),
                 "failed_transfers": t.get("failed_transfers"),
                 "evidence_ok": 1.0 if evidence_ok(o, spec.target.kind) else 0.0,
                 "stages_fraction_seen_min": min((f for f in st.get("fraction_seen", {}).values() if f is not None),
                                                 default=None)})
    records = read_records(rdir / "records.parquet")
    records = records[records["config"] == config.name]
    cells = {(c.suite, c.workload, c.concurrency, c.stream): c for c in plan_cells(spec)}
    for _, row in summarize(records, {config.name: config.gpus}).iterrows():
        cell = cells.get((row["suite"], row["workload"], row["concurrency"], row["stream"]))
        mine = records[(records["suite"] == row["suite"]) & (records["workload"] == row["workload"])
                       & (records["concurrency"] == row["concurrency"]) & (records["stream"] == row["stream"])
                       & (records["trial"] == row["trial"])].sort_values("index")
        tracker.log_cell(run_id, f"{config.name}:{row['suite']}:{row['workload']}:c{row['concurrency']}"
                                 + ("" if row["stream"] == "main" else f":{row['stream']}"),
                         tags={"epdbench.config": config.name, "epdbench.suite": row["suite"]},
                         params={"suite": row["suite"], "cell": row["workload"], "concurrency": row["concurrency"],
                                 "stream": row["stream"], "n_measured": cell.n_measured if cell else "",
                                 "n_warmup": cell.n_warmup if cell else "", "seed": spec.seed,
                                 "trial": row["trial"],
                                 "prompt_set_hash": hash_prompt_hashes(list(mine["prompt_hash"]))},
                         summary=row.to_dict())
    ev = rdir / "evidence" / config.name
    if ev.exists():
        tracker.log_artifacts(run_id, ev, "evidence")
    if (rdir / "manifests" / config.name).exists():   # kubernetes target only
        tracker.log_artifacts(run_id, rdir / "manifests" / config.name, "manifests")
    tracker.finish(run_id, bool(o.get("ok")))
    return run_id


def publish_comparison(tracker: Tracker, parent: str, rdir: Path, all_verified: bool, all_ok: bool) -> None:
    for name in PARENT_ARTIFACTS:
        tracker.log_artifacts(parent, rdir / name)
    if (rdir / "plots").exists():
        tracker.log_artifacts(parent, rdir / "plots", "plots")
    tracker.set_tags(parent, {"epdbench.all_verified": all_verified})
    tracker.finish(parent, ok=all_ok)


def sync_results(rdir: Path, tracking_uri: str | None) -> str:
    """Publish whatever a run could not publish (MLflow was down); idempotent."""
    spec = load_spec(str(rdir / "spec.yaml"))
    outcome = json.loads((rdir / "outcome.json").read_text()) if (rdir / "outcome.json").exists() else None
    state = load_state(rdir)
    tracker = Tracker(resolve_tracking_uri(tracking_uri, spec), spec.tracking.experiment)
    if not state["mlflow_parent"]:
        trigger = (outcome or {}).get("trigger", "cli")
        state["mlflow_parent"] = start_comparison(tracker, spec, rdir.name, rdir, trigger, None)
        save_state(rdir, state)
    done = []
    for config in spec.configurations:
        if config.name in state["published"] or not (rdir / "evidence" / config.name / "outcome.json").exists():
            continue
        publish_configuration(tracker, state["mlflow_parent"], spec, config, rdir)
        state["published"].append(config.name)
        save_state(rdir, state)
        done.append(config.name)
    if outcome and not state["parent_published"]:
        publish_comparison(tracker, state["mlflow_parent"], rdir, outcome["all_verified"],
                           all(c["ok"] for c in outcome["configs"].values()))
        state["parent_published"] = True
        save_state(rdir, state)
        done.append("comparison")
    if not done:
        return f"{rdir}: already in MLflow (run {state['mlflow_parent']})"
    return f"{rdir}: published {', '.join(done)} to {tracker.run_url(state['mlflow_parent'])}"


def cells_done(rdir: Path, spec: ExperimentSpec, config: str) -> set[tuple[str, int]]:
    """(cell id, trial) of cells whose measured requests are all recorded — skipped on resume."""
    records = read_records(rdir / "records.parquet")
    if records.empty:
        return set()
    want = {c.cell_id: c.n_measured for c in plan_cells(spec)}
    m = records[(records["config"] == config) & (records["phase"] == "measured")]
    counts = m.groupby(["cell", "trial"]).size()
    return {(cell, int(trial)) for (cell, trial), n in counts.items() if n >= want.get(cell, 10 ** 9)}

