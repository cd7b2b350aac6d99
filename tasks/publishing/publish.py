"""Publish a results directory to MLflow, one piece at a time, from the files alone.

The flow publishes each configuration as it finishes and the comparison at the end; when MLflow is
unreachable nothing is lost — `state.json` remembers what was published and `epdbench sync RUN`
publishes the rest later from the same files. Publishing is idempotent: retries, `--resume` and `sync`
update the runs they find, never add a second one.

Update, never stale. Re-publishing re-logs metrics (latest wins), overwrites tags (status, verdicts, `epdbench.error`
and `epdbench.router` are tags because they change between attempts), skips params logged with the same value,
sets the status again (FINISHED when the configuration's outcome is ok, FAILED otherwise; a cell run is always
FINISHED; the comparison run is FINISHED when every configuration ran), and re-uploads artifacts to the same
paths. Runs for data no longer in the folder are deleted (MLflow soft delete: hidden from searches and the UI,
restorable): cell runs under a configuration run that are not cells of its records, and configuration runs under
the comparison run for configurations with no `evidence/<config>/outcome.json` — so MLflow equals the folder
(`mlflow_matches_results` checks it).

A failure is never left RUNNING: a configuration or comparison run whose publishing fails is set FAILED with the
whole reason as its tag `epdbench.publish_error` (Tracker.failing; `sync` does the same to the comparison run when
any piece fails), and the error goes on to the caller; publishing it again sets its status anew and removes the
tag. Metric, param and tag keys made of labels are made valid by reports.mlflow_names (Tracker checks each batch).

Keys, state.json and fingerprints: tasks/publishing/publish_state.py; the check that MLflow equals the folder:
tasks/publishing/mlflow_check.py.
"""
from __future__ import annotations

import json
from pathlib import Path

from epdbench.analysis.breakdown import cell_metrics
from epdbench.analysis.metrics import summarize
from epdbench.specs.commands import ec_path, kv_connector_name
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, load_spec, spec_fingerprint
from epdbench.specs.workload import hash_prompt_hashes, plan_cells
from epdbench.tasks.rundir.results import read_records, write_json
from epdbench.tasks.rundir.resume import noise_of
from epdbench.tasks.rundir.traces import TRACES_DIR, read_spans, traces_path
from epdbench.tasks.publishing.traces import flush_traces, publish_cell_traces
from epdbench.tasks.publishing.publish_state import (OPTIONAL_ARTIFACTS, PARENT_ARTIFACTS, cell_key,  # noqa: F401
                                          comparison_fingerprint, config_fingerprint, config_key, folder_configs,
                                          load_state, pending, read_json, resolve_tracking_uri, save_state,
                                          store_id)
from epdbench.reports.environment import engine_image
from epdbench.reports.footing import gpu_footing
from epdbench.reports.mlflow_names import valid_keys
from epdbench.tasks.publishing.mlflow_quiet import failure_reason, is_unreachable
from epdbench.tasks.publishing.tracking import KEY_TAG, Tracker

# --- reading the folder --------------------------------------------------------------------------------

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
    # EPD: the encoder outputs' transport; `not-read` when a cluster's encoder-cache connector is not NIXL's
    ec = outcome["transport"].get("ec") or {"verdict": "not-applicable"}
    return (bool(outcome.get("ok")) and outcome["transport"].get("verdict") in good
            and ec.get("verdict") in good | {"not-read"} and outcome["stages"].get("verdict") in good)


def cells_of(records, run: str, config: str, gpus: int | None = None, noise: dict | None = None) -> dict:
    """cell key → (summary row, that cell's records) of one configuration's records (`noise`: the ledger's
    lag figures, tasks.rundir.resume.noise_of)."""
    records = records[records["config"] == config]
    out = {}
    for _, row in summarize(records, {config: gpus} if gpus else None, noise).iterrows():
        mine = records[(records["suite"] == row["suite"]) & (records["workload"] == row["workload"])
                       & (records["concurrency"] == row["concurrency"]) & (records["stream"] == row["stream"])
                       & (records["trial"] == row["trial"])]
        out[cell_key(run, config, row["suite"], row["workload"], row["concurrency"], row["stream"],
                     row["trial"])] = (row, mine)
    return out


def _legacy_cell_id(run) -> tuple:
    p = run.data.params
    return (p.get("suite"), p.get("cell"), str(p.get("concurrency")), p.get("stream", "main"), str(p.get("trial", 0)))


def _run_key(tracker: Tracker, parent: str, rdir: Path) -> str:
    """The key of the comparison run `parent` (what configuration and cell keys extend)."""
    return tracker.client.get_run(parent).data.tags.get(KEY_TAG) or load_state(rdir)["run"]


# --- publishing ----------------------------------------------------------------------------------------

def start_comparison(tracker: Tracker, spec: ExperimentSpec, run: str, rdir: Path, trigger: str,
                     flow_run_id: str | None, previous: str | None = None) -> str:
    """Find or create the comparison run keyed `run`; `previous` is a run id state.json named before keys
    existed (adopted when it is a comparison run without a key)."""
    def legacy():
        if not previous:
            return None
        try:
            r = tracker.client.get_run(previous)
        except Exception:  # noqa: BLE001 - gone or not visible: create a new one
            return None
        ok = (r.info.lifecycle_stage == "active" and r.info.experiment_id == tracker.experiment_id
              and r.data.tags.get("epdbench.kind") == "comparison" and not r.data.tags.get(KEY_TAG))
        return r if ok else None

    tags = {"epdbench.target": spec.target.kind, "epdbench.clock": "virtual" if spec.virtual else "real",
            "epdbench.spec": spec.name, "epdbench.trigger": trigger,
            "epdbench.spec_fingerprint": spec_fingerprint(spec), "epdbench.results_dir": str(Path(rdir).resolve()),
            "epdbench.gpu_budget": str(spec.cost.gpu_budget or "none")}     # its footing: publish_comparison
    if flow_run_id:
        tags["epdbench.prefect_flow_run_id"] = flow_run_id
    return tracker.start_comparison(
        run, tags=tags,
        params={"configurations": ",".join(c.name for c in spec.configurations),
                "suites": ",".join(s.name for s in spec.suites), "seed": spec.seed, "trials": spec.trials,
                "model": spec.model.name, "hardware": spec.hardware.gpu},
        key=run, adopt=legacy)


def publish_configuration(tracker: Tracker, parent: str, spec: ExperimentSpec, config: ConfigurationSpec,
                          rdir: Path) -> str:
    """The configuration run with its evidence, and one cell run per recorded cell × trial (found or created
    by key; cell runs of cells no longer recorded are deleted). Safe to call again at any point."""
    rdir = Path(rdir)
    o = config_outcome(rdir, config.name)
    t, st = o["transport"], o["stages"]
    run = _run_key(tracker, parent, rdir)

    def legacy_config():
        same = [r for r in tracker.children(parent, "configuration")
                if r.data.tags.get("epdbench.config") == config.name and not r.data.tags.get(KEY_TAG)]
        return same[0] if same else None

    run_id = tracker.log_configuration(
        parent, config.name,
        tags={"epdbench.status": "ok" if o.get("ok") else "failed",
              "epdbench.transport_verdict": t.get("verdict", "none"),
              "epdbench.stages_verdict": st.get("verdict", "none"),
              "epdbench.ec_transport_verdict": (t.get("ec") or {}).get("verdict", "none"),
              "epdbench.router": o.get("router") or "", "epdbench.error": (o.get("error") or "")[:5000]},
        params={"topology": config.topology, "roles": roles_text(config), "gpus": spec.gpus_used(config),
                "budget_scale": spec.cost.budget_scale(config.name),
                "tp": ",".join(f"{r.role}={r.tp}" for r in config.roles), "transport": config.kv_transport,
                "connectors": kv_connector_name(config), "ec_transport": ec_path(spec, config),
                "image": "epdbench-sim" if spec.target.kind == "sim" else engine_image(spec),
                "engine_args": spec.engine.model_dump_json()},
        metrics={"transport_verified": 1.0 if t.get("verdict") == "verified" else 0.0,
                 "stages_verified": 1.0 if st.get("verdict") == "verified" else 0.0,
                 "kv_throughput_min_mb_s": t.get("throughput_mb_s_min"),
                 "kv_throughput_max_mb_s": t.get("throughput_mb_s_max"),
                 "failed_transfers": t.get("failed_transfers"),
                 "evidence_ok": 1.0 if evidence_ok(o, spec.target.kind) else 0.0,
                 "stages_fraction_seen_min": min((f for f in st.get("fraction_seen", {}).values() if f is not None),
                                                 default=None)},
        key=config_key(run, config.name), adopt=legacy_config)
    with tracker.failing(run_id):
        _publish_cells(tracker, run_id, spec, config, rdir, run)
        ev = rdir / "evidence" / config.name
        if ev.exists():
            tracker.log_artifacts(run_id, ev, "evidence")
        if (rdir / "manifests" / config.name).exists():   # kubernetes target only
            tracker.log_artifacts(run_id, rdir / "manifests" / config.name, "manifests")
        tracker.close(run_id, bool(o.get("ok")))
    return run_id


def _publish_cells(tracker: Tracker, run_id: str, spec: ExperimentSpec, config: ConfigurationSpec, rdir: Path,
                   run: str) -> None:
    """One cell run per recorded cell × trial under the configuration run `run_id`; those of cells no longer
    recorded are deleted."""
    keyed: dict[str, list] = {}
    legacy: dict[tuple, list] = {}
    for r in tracker.children(run_id, "cell"):                  # oldest first
        if r.data.tags.get(KEY_TAG):
            keyed.setdefault(r.data.tags[KEY_TAG], []).append(r)
        else:
            legacy.setdefault(_legacy_cell_id(r), []).append(r)
    planned = {(c.suite, c.workload, c.concurrency, c.stream): c for c in plan_cells(spec)}
    records = read_records(rdir / "records.parquet")
    spans = read_spans(traces_path(rdir, config.name))
    noise = noise_of(rdir, [config.name])
    made = 0
    for key, (row, mine) in cells_of(records, run, config.name, spec.gpus_used(config), noise).items():
        cell = planned.get((row["suite"], row["workload"], row["concurrency"], row["stream"]))
        params = {"suite": row["suite"], "cell": row["workload"], "concurrency": row["concurrency"],
                  "stream": row["stream"], "n_measured": cell.n_measured if cell else "",
                  "n_warmup": cell.n_warmup if cell else "", "seed": spec.seed, "trial": row["trial"],
                  "prompt_set_hash": hash_prompt_hashes(list(mine.sort_values("index")["prompt_hash"]))}
        have = keyed.pop(key, []) or legacy.pop(_legacy_cell_id_of(params), [])
        for dup in have[1:]:
            tracker.delete(dup.info.run_id)
        cell_run = tracker.log_cell(run_id, f"{config.name}:{row['suite']}:{row['workload']}:c{row['concurrency']}"
                                    + ("" if row["stream"] == "main" else f":{row['stream']}"),
                                    tags={"epdbench.config": config.name, "epdbench.suite": row["suite"]},
                                    params=params, summary=row.to_dict(), key=key, existing=have[0] if have else None)
        made += publish_cell_traces(tracker.client, tracker.experiment_id, cell_run, cell_spans(spans, row))
        tracker.log_metrics(cell_run, cell_metrics(cell_spans(spans, row), mine, config.topology))
    if made:
        flush_traces()
    for stale in [r for runs in (*keyed.values(), *legacy.values()) for r in runs]:
        tracker.delete(stale.info.run_id)                          # data no longer in the folder


def cell_spans(spans, row):
    """The spans of one cell × trial (a summary row's suite, workload, concurrency, stream and trial)."""
    if not len(spans):
        return spans
    mask = ((spans["suite"] == row["suite"]) & (spans["workload"] == row["workload"])
            & (spans["concurrency"] == int(row["concurrency"])) & (spans["stream"] == row["stream"])
            & (spans["trial"] == int(row["trial"])))
    return spans[mask]


def _legacy_cell_id_of(params: dict) -> tuple:
    return (str(params["suite"]), str(params["cell"]), str(params["concurrency"]), str(params["stream"]),
            str(params["trial"]))


def publish_comparison(tracker: Tracker, parent: str, rdir: Path, all_verified: bool, all_ok: bool) -> str:
    """Artifacts, verdict tags and status of the comparison run; configuration runs under it for configurations
    no longer in the folder are deleted (with their cell runs). Returns the run id (truthy: published); on a
    failure the run is left FAILED with the reason (Tracker.failing) and the error raised."""
    with tracker.failing(parent):
        _publish_comparison(tracker, parent, Path(rdir), all_verified, all_ok)
    return parent


def _publish_comparison(tracker: Tracker, parent: str, rdir: Path, all_verified: bool, all_ok: bool) -> None:
    for name in PARENT_ARTIFACTS + OPTIONAL_ARTIFACTS:
        if (rdir / name).exists():   # goodput.csv is absent from folders written before it existed
            tracker.log_artifacts(parent, rdir / name)
    if (rdir / "plots").exists():
        tracker.log_artifacts(parent, rdir / "plots", "plots")
    if (rdir / TRACES_DIR).exists():    # the TTFT breakdown's spans: a report rendered again from MLflow has it too
        tracker.log_artifacts(parent, rdir / TRACES_DIR, TRACES_DIR)
    goodput_metrics(tracker, parent, rdir / "goodput.csv")
    outcome = read_json(rdir / "outcome.json")
    footing = gpu_footing((outcome or {}).get("meta") or {})
    tracker.set_tags(parent, {"epdbench.all_verified": all_verified, "epdbench.all_ok": all_ok,
                              "epdbench.contaminated_cells": (outcome or {}).get("contaminated_cells", 0),
                              **({"epdbench.gpu_footing": footing} if footing else {}),
                              **comparison_view(tracker, parent, rdir)})
    run = _run_key(tracker, parent, rdir)
    wanted = {config_key(run, name) for name in folder_configs(rdir)}
    for r in tracker.children(parent, "configuration"):
        if r.data.tags.get(KEY_TAG) not in wanted:
            for cell in tracker.children(r.info.run_id, "cell"):
                tracker.delete(cell.info.run_id)
            tracker.delete(r.info.run_id)
        else:     # every configuration run points at the comparison's report
            tracker.set_tags(r.info.run_id, {"epdbench.report": f"runs:/{parent}/report.html",
                                             "mlflow.note.content": f"Part of comparison run {parent}: its report "
                                             "(artifact report.html) compares this configuration with the others."})
    tracker.close(parent, ok=all_ok)


def comparison_view(tracker: Tracker, parent: str, rdir: Path) -> dict:
    """The comparison run on its own (reports.mlflow_view): the report's opening as its description, wins per
    configuration and metric, cost per million output tokens and frontier points (reports.pareto) as metrics;
    returns the tags to set (description and one verdict per cell)."""
    import pandas as pd

    from epdbench.analysis.compare import VERDICT_METRICS, compare
    from epdbench.analysis.pareto import pareto_points
    from epdbench.reports.mlflow_view import report_note, verdict_tags, verdict_wins
    from epdbench.reports.pareto import pareto_metrics

    tags = {}
    if (rdir / "report.md").is_file():
        tags["mlflow.note.content"] = report_note((rdir / "report.md").read_text())
    if (rdir / "summary.csv").is_file() and (rdir / "summary.csv").stat().st_size:
        summary = pd.read_csv(rdir / "summary.csv")
        comparisons = compare(summary, VERDICT_METRICS)
        configs = list(dict.fromkeys(summary["config"]))
        tracker.log_metrics(parent, verdict_wins(comparisons, configs))
        tags.update(verdict_tags(comparisons))
        points = pareto_points(summary, load_spec(str(rdir / "spec.yaml")).cost.gpu_hour_usd)
        tracker.log_metrics(parent, pareto_metrics(points, configs))
    return tags


def goodput_metrics(tracker: Tracker, parent: str, path: Path) -> None:
    """goodput_req_s[_per_gpu].<config>.<suite>.<shape> on the comparison run, from goodput.csv (keys made valid by
    reports.mlflow_names: shape 1260px+400/128 reads 1260px_400/128)."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    import pandas as pd

    table = pd.read_csv(path)
    metrics = {}
    for _, r in table.iterrows():
        key = f"{r['config']}.{r['suite']}.{r['shape']}"
        for column in ("goodput_req_s", "goodput_req_s_per_gpu"):
            if not pd.isna(r[column]):
                metrics[f"{column}.{key}"] = float(r[column])
    if metrics:
        tracker.log_metrics(parent, valid_keys(metrics))


def check_publishable(rdir: Path) -> None:
    """StateError naming the first file of the folder that publishing needs and cannot read: spec.yaml, the
    state files and records (tasks.rundir.resume.validate_state_files), summary.csv and goodput.csv."""
    import pandas as pd

    from epdbench.specs.models import SpecError
    from epdbench.tasks.rundir.resume import StateError, validate_state_files

    rdir = Path(rdir)
    try:
        load_spec(str(rdir / "spec.yaml"))
    except SpecError as e:
        raise StateError(str(e)) from None                       # names the file and what is wrong
    validate_state_files(rdir)
    for name in ("summary.csv", "goodput.csv"):
        path = rdir / name
        if path.is_file() and path.stat().st_size:
            try:
                pd.read_csv(path)
            except (OSError, ValueError) as e:
                again = f" (`epdbench report {rdir}` writes it again)" if name == "goodput.csv" else ""
                raise StateError(f"{path}: cannot be read ({failure_reason(e)}); restore it{again}, or move it "
                                 "away to publish without it") from None


def sync_results(rdir: Path, tracking_uri: str | None) -> str:
    """Publish what MLflow lacks or holds stale (per the fingerprints in state.json); idempotent."""
    rdir = Path(rdir)
    spec = load_spec(str(rdir / "spec.yaml"))
    outcome = read_json(rdir / "outcome.json")
    uri = resolve_tracking_uri(tracking_uri, spec)
    state = load_state(rdir, store=store_id(uri, spec.tracking.experiment))
    tracker = Tracker(uri, spec.tracking.experiment)
    todo = pending(state, rdir, spec)
    if state["mlflow_parent"] and not [r for r in tracker.find(state["run"], deleted=False)
                                       if r.info.run_id == state["mlflow_parent"]]:
        todo = ["MLflow lost the comparison run"]                # e.g. a wiped store: publish everything
    if not todo:
        return f"{rdir}: already in MLflow (run {state['mlflow_parent']})"
    parent = start_comparison(tracker, spec, state["run"], rdir, (outcome or {}).get("trigger", "cli"), None,
                              state["mlflow_parent"])
    if parent != state["mlflow_parent"]:                        # runs recorded in state.json are not these
        state.update(published={}, parent_published=None)
    state["mlflow_parent"] = parent
    save_state(rdir, state)
    with tracker.failing(parent):                               # a piece refused: the comparison run says why
        done = _sync_pieces(tracker, parent, spec, state, outcome, rdir, uri)
    if not done:
        return f"{rdir}: already in MLflow (run {parent})"
    return f"{rdir}: published {', '.join(done)} to {tracker.run_url(parent)}"


def _sync_pieces(tracker: Tracker, parent: str, spec: ExperimentSpec, state: dict, outcome, rdir: Path,
                 uri: str) -> list[str]:
    """Publish each pending configuration, then the comparison; what was published."""
    done = []
    records = read_records(rdir / "records.parquet")
    for config in spec.configurations:
        if config.name not in folder_configs(rdir, spec):
            continue
        fp = config_fingerprint(rdir, config.name, records)
        if state["published"].get(config.name) == fp:
            continue
        publish_configuration(tracker, parent, spec, config, rdir)
        state["published"][config.name] = fp
        save_state(rdir, state)
        done.append(config.name)
    if isinstance(outcome, dict):
        all_ok = all(c.get("ok") for c in outcome.get("configs", {}).values())
        fp = comparison_fingerprint(rdir)
        if state["parent_published"] != fp:
            publish_comparison(tracker, parent, rdir, outcome.get("all_verified", False), all_ok)
            state["parent_published"] = fp
            save_state(rdir, state)
            done.append("comparison")
        left = pending(state, rdir, spec)
        if not left and "comparison" not in done:       # a run left FAILED while pieces were missing: complete now
            tracker.close(parent, ok=all_ok)
        update = {"mlflow_pending": left, "mlflow_run_id": parent, "mlflow_url": tracker.run_url(parent),
                  "tracking_uri": uri}
        if any(outcome.get(k) != v for k, v in update.items()):
            write_json(rdir / "outcome.json", {**outcome, **update})
    return done


# --- the user's view of an outage ----------------------------------------------------------------------

def outage_line(e: BaseException, tracking_uri: str | None, rdir, what: str = "") -> str:
    """One line for an MLflow failure: what failed and why (MLflow's whole reason: mlflow_quiet.failure_reason),
    and that the results are kept for `epdbench sync`."""
    where = f"results kept in {rdir}; publish later with: epdbench sync {rdir}"
    if is_unreachable(e):
        return f"MLflow unreachable at {tracking_uri} ({failure_reason(e)}): {where}"
    return f"MLflow publishing failed ({what}: {failure_reason(e)}): {where}"


class MlflowNotice:
    """What one run tells the user about MLflow failures: one line, the first time; later ones are silent."""

    def __init__(self, tracking_uri: str | None = None, rdir=None):
        self.reset(tracking_uri, rdir)

    def reset(self, tracking_uri: str | None, rdir) -> None:
        self.tracking_uri, self.rdir, self.said = tracking_uri, rdir, False

    def failed(self, what: str, e: BaseException) -> str | None:
        """The line to print for this failure, or None when one was printed already."""
        if self.said:
            return None
        self.said = True
        return outage_line(e, self.tracking_uri, self.rdir, what)
