"""The comparison flow: one subflow per configuration, then summary, comparison and report.

Sequencing only: side effects live in tasks/, statistics and rendering in analysis/ and reports/.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from analysis.metrics import summarize
from analysis.trials import aggregate_trials
from reports.render import render_report
from specs.models import ConfigurationSpec, ExperimentSpec, spec_to_yaml
from specs.workload import Calibration, Cell, RequestSpec, build_requests, plan_cells, prompt_set_hash
from tasks import evidence
from tasks.deployment import ProvisionError
from tasks.targets import target_module
from tasks.calibrate import calibrate, needed_keys
from tasks.loadgen import LoadGenerator, records_as_dicts
from tasks.results import append_records, read_records, write_json, write_summary
from tasks.tracking import Tracker, default_tracking_uri

def say(msg: str) -> None:
    print(msg, flush=True)


@dataclass
class ConfigOutcome:
    config: str
    ok: bool
    error: str | None = None
    transport: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)
    router: str = ""
    cells: list[dict] = field(default_factory=list)

    def verified(self, target: str) -> bool:
        """Ran, and its evidence holds; `emulated` counts only on the simulator target."""
        ok = {"verified", "not-applicable"} | ({"emulated"} if target == "sim" else set())
        return self.ok and self.transport.get("verdict") in ok and self.stages.get("verdict") in ok


def roles_text(config: ConfigurationSpec) -> str:
    return " + ".join(f"{r.replicas}×{r.role} TP{r.tp}" + (f" {r.rdma_interfaces}×RDMA" if r.rdma_interfaces else "")
                      for r in config.roles)


def _cell_line(config: str, cell: Cell, trial: int, s: dict) -> str:
    def f(v, unit=" ms"):
        return "—" if v is None else f"{v:.1f}{unit}"
    return (f"  [{config}] {cell.suite} {cell.workload} c={cell.concurrency} trial {trial}: "
            f"{s['requests_ok']}/{s['requests_total']} ok, TTFT p50 {f(s['ttft_p50_ms'])}, "
            f"ITL p99 {f(s['itl_p99_ms'])}, {f(s['output_tok_s'], ' tok/s')}")


@task(name="run-suite", cache_policy=NO_CACHE, retries=0)
def run_suite(endpoint: str, spec: ExperimentSpec, suite: str, config: str, run: str, records_path: str,
              calibration: dict) -> list[dict]:
    """Every cell of one suite, every trial, on one shared HTTP session; records appended after each
    cell (after each mixed window). Never retried: a measured cell is not repeated behind the user's back."""
    import pandas as pd

    cal = Calibration({k: tuple(v) for k, v in calibration.items()})
    cells = [c for c in plan_cells(spec) if c.suite == suite]
    done: list[dict] = []

    def rows_of(cell: Cell, trial: int, recs) -> list[dict]:
        return [{**r, "run": run, "trial": trial, "config": config, "suite": cell.suite, "cell": cell.cell_id,
                 "workload": cell.workload, "stream": cell.stream, "concurrency": cell.concurrency}
                for r in records_as_dicts(recs)]

    def finish(batch: list[tuple[Cell, list[RequestSpec], list[dict]]], trial: int) -> None:
        rows = [r for _, _, rs in batch for r in rs]
        append_records(Path(records_path), rows)
        summaries = summarize(pd.DataFrame(rows)).set_index("stream", drop=False)
        for cell, requests, _ in batch:
            s = summaries.loc[cell.stream].to_dict()
            say(_cell_line(config, cell, trial, s))
            done.append({"cell": cell, "trial": trial, "summary": s, "rows": [r for c, _, rs in batch
                                                                              if c == cell for r in rs],
                         "prompt_set_hash": prompt_set_hash(requests)})

    async def go():
        async with LoadGenerator(endpoint, spec.model.name, spec.request_timeout_s, run_tag=run[-8:]) as lg:
            for trial in range(spec.trials):
                if cells[0].kind == "mixed":
                    requests = [build_requests(spec, c, trial, calibration=cal) for c in cells]
                    recs = await lg.run_streams([(r, c.concurrency) for r, c in zip(requests, cells)])
                    finish([(c, q, rows_of(c, trial, rs)) for c, q, rs in zip(cells, requests, recs)], trial)
                    continue
                for cell in cells:
                    requests = build_requests(spec, cell, trial, calibration=cal)
                    recs = await lg.run_cell(requests, cell.concurrency)
                    finish([(cell, requests, rows_of(cell, trial, recs))], trial)

    asyncio.run(go())
    return done


@task(name="calibrate-prompts", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def calibrate_prompts(engine_url: str, spec: ExperimentSpec, path: str) -> dict:
    """Once per run, against the first configuration's engine; reused by every configuration."""
    if Path(path).exists():
        return json.loads(Path(path).read_text())
    keys = needed_keys([r for c in plan_cells(spec) for r in build_requests(spec, c)[:1]])
    fits = calibrate(engine_url, spec.model.name, keys).fits
    write_json(Path(path), fits)
    say(f"Prompt calibration against {engine_url}/tokenize: " +
        ", ".join(f"{k}: {a:.3f} tokens/word + {b:.0f}" for k, (a, b) in fits.items()))
    return fits


@task(name="log-configuration", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def log_configuration(tracker: Tracker, parent: str, spec: ExperimentSpec, config: ConfigurationSpec,
                      outcome: ConfigOutcome, evidence_dir: str) -> str:
    t = outcome.transport
    run_id = tracker.log_configuration(
        parent, config.name,
        tags={"epdbench.status": "ok" if outcome.ok else "failed",
              "epdbench.transport_verdict": t.get("verdict", "none"),
              "epdbench.stages_verdict": outcome.stages.get("verdict", "none")},
        params={"topology": config.topology, "roles": roles_text(config), "gpus": config.gpus,
                "tp": ",".join(f"{r.role}={r.tp}" for r in config.roles), "transport": config.kv_transport,
                "connectors": "MooncakeConnector" if config.kv_transport != "none" else "none",
                "router": outcome.router,
                "image": "epdbench-sim" if spec.target.kind == "sim" else spec.target.kubernetes.engine.image,
                "engine_args": spec.engine.model_dump_json(), "error": outcome.error or ""},
        metrics={"transport_verified": 1.0 if t.get("verdict") == "verified" else 0.0,
                 "stages_verified": 1.0 if outcome.stages.get("verdict") == "verified" else 0.0,
                 "kv_throughput_min_mb_s": t.get("throughput_mb_s_min"),
                 "kv_throughput_max_mb_s": t.get("throughput_mb_s_max"),
                 "failed_transfers": t.get("failed_transfers"),
                 "evidence_ok": 1.0 if outcome.verified(spec.target.kind) else 0.0,
                 "stages_fraction_seen_min": min((f for f in outcome.stages.get("fraction_seen", {}).values()
                                                  if f is not None), default=None)})
    for item in outcome.cells:
        cell: Cell = item["cell"]
        tracker.log_cell(run_id, f"{config.name}:{cell.suite}:{cell.workload}:c{cell.concurrency}",
                         tags={"epdbench.config": config.name, "epdbench.suite": cell.suite},
                         params={"suite": cell.suite, "cell": cell.workload, "concurrency": cell.concurrency,
                                 "stream": cell.stream, "n_measured": cell.n_measured, "n_warmup": cell.n_warmup,
                                 "seed": spec.seed, "trial": item["trial"],
                                 "prompt_set_hash": item["prompt_set_hash"]},
                         summary=item["summary"])
    if Path(evidence_dir).exists():
        tracker.log_artifacts(run_id, Path(evidence_dir), "evidence")
    manifests_dir = Path(evidence_dir).parents[1] / "manifests" / config.name   # kubernetes target only
    if manifests_dir.exists():
        tracker.log_artifacts(run_id, manifests_dir, "manifests")
    tracker.finish(run_id, outcome.ok)
    return run_id


@flow(name="configuration", flow_run_name="{config.name}")
def run_configuration(spec: ExperimentSpec, config: ConfigurationSpec, run: str, run_dir: str) -> ConfigOutcome:
    """Provision, verify readiness, run every suite, collect evidence; tear down always."""
    rdir = Path(run_dir)
    ev_dir = rdir / "evidence" / config.name
    log_dir = ev_dir  # raw process logs are evidence
    outcome = ConfigOutcome(config.name, ok=False)
    say(f"[{config.name}] starting {roles_text(config)} ({config.gpus} GPUs, KV {config.kv_transport})")
    dep = None
    target = target_module(spec.target.kind)
    try:
        dep = target.start(spec, config, rdir / "spec.yaml", log_dir)
        outcome.router = dep.router
        say(f"[{config.name}] serving at {dep.endpoint} via {dep.router}")
        emulated = spec.target.kind == "sim"
        engine = next(p for p in dep.engines if p.role in ("server", "prefill"))
        calibration = calibrate_prompts(engine.url, spec, str(rdir / "calibration.json"))
        first = snap = evidence.snapshot(dep)
        suites: dict[str, dict] = {}
        for suite in spec.suites:
            items = run_suite(dep.endpoint, spec, suite.name, config.name, run, str(rdir / "records.parquet"),
                              calibration)
            after = evidence.snapshot(dep)
            rows = [r for item in items for r in item["rows"]]
            suites[suite.name] = evidence.suite_evidence(dep, config, snap, after, rows, emulated)
            outcome.cells += items
            snap = after
        rows = [r for item in outcome.cells for r in item["rows"]]
        outcome.transport, outcome.stages = evidence.collect(dep, config, first, snap, rows, suites, ev_dir,
                                                             emulated)
        outcome.ok = True
        say(f"[{config.name}] transport {outcome.transport['verdict']}, stages {outcome.stages['verdict']}")
    except ProvisionError as e:
        outcome.error = f"provisioning failed: {e}"
    except Exception as e:  # noqa: BLE001 - a failed configuration must not stop the others
        outcome.error = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    finally:
        if dep is not None:
            target.stop(dep)
    if outcome.error:
        say(f"[{config.name}] FAILED: {outcome.error}")
    return outcome


def run_name_for(spec: ExperimentSpec, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now()
    return f"{spec.name}-{spec.target.kind}-{now:%Y%m%d-%H%M%S}"


@flow(name="compare", flow_run_name="{spec.name}-{trigger}")
def compare(spec: ExperimentSpec, out_dir: str | None = None, tracking_uri: str | None = None,
            trigger: str = "cli", run_name: str | None = None) -> dict:
    """Compare every configuration of the spec on matched workloads; returns the outcome."""
    run = run_name or run_name_for(spec)
    rdir = Path(out_dir or Path("results") / run)
    rdir.mkdir(parents=True, exist_ok=True)
    (rdir / "spec.yaml").write_text(spec_to_yaml(spec))
    uri = tracking_uri or spec.tracking.tracking_uri or default_tracking_uri()
    tracker = Tracker(uri, spec.tracking.experiment)
    flow_run_id = _prefect_flow_run_id()
    parent = tracker.start_comparison(
        run, tags={"epdbench.target": spec.target.kind, "epdbench.spec": spec.name, "epdbench.trigger": trigger,
                   "epdbench.prefect_flow_run_id": flow_run_id or "", "epdbench.results_dir": str(rdir.resolve())},
        params={"configurations": ",".join(c.name for c in spec.configurations),
                "suites": ",".join(s.name for s in spec.suites), "seed": spec.seed, "trials": spec.trials,
                "model": spec.model.name, "hardware": spec.hardware.gpu})
    say(f"Run {run}: {len(spec.configurations)} configurations × {len(plan_cells(spec))} cells × "
        f"{spec.trials} trial(s) → {rdir}")
    outcomes: dict[str, ConfigOutcome] = {}
    for config in spec.configurations:
        outcomes[config.name] = run_configuration(spec, config, run, str(rdir))
        log_configuration(tracker, parent, spec, config, outcomes[config.name], str(rdir / "evidence" / config.name))

    summary = summarize(read_records(rdir / "records.parquet"), {c.name: c.gpus for c in spec.configurations})
    write_summary(rdir, summary)
    aggregate_trials(summary).to_csv(rdir / "summary_trials.csv", index=False)
    verdicts = {name: verdict_view(o) for name, o in outcomes.items()}
    meta = report_meta(spec, run, outcomes)
    (rdir / "report.md").write_text(render_report(meta, summary, verdicts))
    outcome = {"run": run, "results_dir": str(rdir), "tracking_uri": uri, "mlflow_run_id": parent,
               "mlflow_url": tracker.run_url(parent),
               "configs": {n: {"ok": o.ok, "verified": o.verified(spec.target.kind), "error": o.error,
                               "transport": o.transport.get("verdict"), "stages": o.stages.get("verdict")}
                           for n, o in outcomes.items()}}
    outcome["all_verified"] = all(c["verified"] for c in outcome["configs"].values())
    outcome["meta"], outcome["verdicts"] = meta, verdicts
    write_json(rdir / "outcome.json", outcome)
    for name in ("report.md", "summary.csv", "summary_trials.csv", "summary.parquet", "records.parquet", "spec.yaml",
                 "calibration.json", "outcome.json"):
        tracker.log_artifacts(parent, rdir / name)
    tracker.set_tags(parent, {"epdbench.all_verified": outcome["all_verified"]})
    tracker.finish(parent, ok=all(o.ok for o in outcomes.values()))
    return outcome


def verdict_view(o: ConfigOutcome) -> dict:
    """What the report shows of a configuration's evidence (JSON-able)."""
    t, st = o.transport, o.stages
    pods = t.get("pods", {})
    return {
        "transport": t.get("verdict", "not run"), "transport_reasons": t.get("reasons", [o.error or ""]),
        "stages": st.get("verdict", "not run"), "stage_reasons": st.get("reasons", [o.error or ""]),
        "fraction_seen": st.get("fraction_seen", {}),
        "observed": {n: p.get("observed") for n, p in pods.items()},
        "rdma_devices": sorted({f"{d['name']} (LID {d['lid']})" for p in pods.values() for d in p["rdma_devices"]}),
        "throughput_mb_s_min": t.get("throughput_mb_s_min"), "throughput_mb_s_max": t.get("throughput_mb_s_max"),
        "failed_transfers": t.get("failed_transfers"), "failed_recvs": t.get("failed_recvs"),
        "per_role": st.get("per_role", {}),
        "suites": {name: {"verdict": s["verdict"], "fraction_seen": s["fraction_seen"],
                          "kv_bytes": sum(d.get("mooncake_bytes_transferred", 0) for r, d in s["metrics_delta"].items()
                                          if r == "prefill"),
                          "mm_cache_hit_rate": next((d["mm_cache_hit_rate"] for d in s["metrics_delta"].values()
                                                     if d.get("mm_cache_hit_rate") is not None), None)}
                   for name, s in st.get("suites", {}).items()},
    }


def report_meta(spec: ExperimentSpec, run: str, outcomes: dict[str, ConfigOutcome]) -> dict:
    target = "simulator (emulated hardware)" if spec.target.kind == "sim" else "Kubernetes"
    return {
        "title": f"epdbench: {spec.name} on {target}",
        "run": run, "spec": spec.name, "target": spec.target.kind, "model": spec.model.name,
        "hardware": f"{spec.hardware.gpu} figures", "seed": spec.seed, "trials": spec.trials,
        "created": dt.datetime.now().isoformat(timespec="seconds"),
        "configurations": [{"name": c.name, "topology": c.topology, "roles": roles_text(c), "gpus": c.gpus,
                            "transport": c.kv_transport,
                            "router": outcomes[c.name].router if c.name in outcomes else ""}
                           for c in spec.configurations],
        "failures": {n: o.error for n, o in outcomes.items() if o.error},
    }


def _prefect_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run
        return str(flow_run.id) if flow_run.id else None
    except Exception:  # noqa: BLE001
        return None
