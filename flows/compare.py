"""The comparison flow: one subflow per configuration, then summary, comparison and report.

Sequencing only: side effects live in tasks/, statistics and rendering in analysis/ and reports/.
"""
from __future__ import annotations

import asyncio
import datetime as dt
import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from epdbench.analysis.metrics import summarize
from epdbench.analysis.prom import cache_by_role
from epdbench.analysis.regression import RegressionSettings
from epdbench.analysis.trials import aggregate_trials
from epdbench.reports.findings import regression_line
from epdbench.reports.live import LiveCell
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, spec_to_yaml
from epdbench.specs.workload import Calibration, Cell, build_requests, plan_cells
from epdbench.tasks import evidence, publish
from epdbench.tasks.publish import roles_text
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.targets import target_module
from epdbench.tasks.calibrate import calibrate, needed_keys
from epdbench.tasks.loadgen import LoadGenerator, records_as_dicts
from epdbench.tasks.results import append_records, read_records, write_json, write_summary
from epdbench.tasks.history import check_history, log_regression_check
from epdbench.tasks.report_files import write_report
from epdbench.tasks.tracking import Tracker

# Set by the CLI's SIGINT handler: an interrupt that Prefect turns into another exception while a task
# starts must still stop the run, not just fail the current configuration.
INTERRUPTED = threading.Event()


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
        return publish.evidence_ok({"ok": self.ok, "transport": self.transport, "stages": self.stages}, target)


def _cell_line(config: str, cell: Cell, trial: int, s: dict) -> str:
    def f(v, unit=" ms"):
        return "—" if v is None else f"{v:.1f}{unit}"
    return (f"  [{config}] {cell.suite} {cell.workload} c={cell.concurrency} trial {trial}: "
            f"{s['requests_ok']}/{s['requests_total']} ok, TTFT p50 {f(s['ttft_p50_ms'])}, "
            f"ITL p99 {f(s['itl_p99_ms'])}, {f(s['output_tok_s'], ' tok/s')}")


@task(name="run-suite", cache_policy=NO_CACHE, retries=0)
def run_suite(endpoint: str, spec: ExperimentSpec, suite: str, config: str, run: str, records_path: str,
              calibration: dict, skip: frozenset = frozenset(), progress: "Progress | None" = None,
              deadline: float | None = None) -> list[dict]:
    """Every cell of one suite, every trial, on one shared HTTP session; records appended after each
    cell (after each mixed window). Never retried: a measured cell is not repeated behind the user's back.
    A cell past spec.cell_timeout_s (or the configuration's deadline, monotonic) raises CellTimeout."""
    import pandas as pd

    cal = Calibration({k: tuple(v) for k, v in calibration.items()})
    cells = [c for c in plan_cells(spec) if c.suite == suite]
    done: list[dict] = []

    def rows_of(cell: Cell, trial: int, recs) -> list[dict]:
        return [{**r, "run": run, "trial": trial, "config": config, "suite": cell.suite, "cell": cell.cell_id,
                 "workload": cell.workload, "stream": cell.stream, "concurrency": cell.concurrency}
                for r in records_as_dicts(recs)]

    def finish(batch: list[tuple[Cell, list[dict]]], trial: int) -> None:
        rows = [r for _, rs in batch for r in rs]
        append_records(Path(records_path), rows)
        summaries = summarize(pd.DataFrame(rows)).set_index("stream", drop=False)
        for cell, cell_rows in batch:
            say(_cell_line(config, cell, trial, summaries.loc[cell.stream].to_dict()))
            if progress:
                progress.cell_done()
            done.append({"cell": cell, "trial": trial, "rows": cell_rows})

    live = LiveCell()

    async def bounded(label: str, n_requests: int, work):
        limits = [x for x in (spec.cell_timeout_s, deadline and deadline - time.monotonic()) if x]
        live.reset(f"[{config}] {label}", n_requests)
        try:
            return await asyncio.wait_for(work, timeout=min(limits) if limits else None)
        except asyncio.TimeoutError:
            raise CellTimeout(f"{label} did not finish within {min(limits):.0f} s "
                              "(cell_timeout_s / configuration_timeout_s)") from None
        finally:
            live.stop()

    async def go():
        async with LoadGenerator(endpoint, spec.model.name, spec.request_timeout_s, run_tag=run[-8:]) as lg:
            for trial in range(spec.trials):
                if all((c.cell_id, trial) in skip for c in cells):
                    say(f"  [{config}] {suite} trial {trial}: already recorded, skipped (resume)")
                    if progress:
                        progress.cell_done(len(cells))
                    continue
                if cells[0].kind == "mixed":
                    requests = [build_requests(spec, c, trial, calibration=cal) for c in cells]
                    recs = await bounded(f"{suite} (mixed) trial {trial}", sum(map(len, requests)),
                                         lg.run_streams([(r, c.concurrency) for r, c in zip(requests, cells)],
                                                        live.on_record))
                    finish([(c, rows_of(c, trial, rs)) for c, rs in zip(cells, recs)], trial)
                    continue
                for cell in cells:
                    if (cell.cell_id, trial) in skip:
                        if progress:
                            progress.cell_done()
                        continue
                    requests = build_requests(spec, cell, trial, calibration=cal)
                    recs = await bounded(f"{suite} {cell.workload} c={cell.concurrency} trial {trial}", len(requests),
                                         lg.run_cell(requests, cell.concurrency, live.on_record))
                    finish([(cell, rows_of(cell, trial, recs))], trial)

    asyncio.run(go())
    return done


class CellTimeout(RuntimeError):
    pass


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


@task(name="publish-configuration", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def publish_configuration_task(tracker: Tracker, parent: str, spec: ExperimentSpec, config: ConfigurationSpec,
                               rdir: str) -> str:
    return publish.publish_configuration(tracker, parent, spec, config, Path(rdir))


@task(name="publish-comparison", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def publish_comparison_task(tracker: Tracker, parent: str, rdir: str, all_verified: bool, all_ok: bool) -> None:
    publish.publish_comparison(tracker, parent, Path(rdir), all_verified, all_ok)


@flow(name="configuration", flow_run_name="{config.name}")
def run_configuration(spec: ExperimentSpec, config: ConfigurationSpec, run: str, run_dir: str,
                      skip: frozenset = frozenset(), progress: "Progress | None" = None) -> ConfigOutcome:
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
        deadline = time.monotonic() + spec.configuration_timeout_s if spec.configuration_timeout_s else None
        engine = next(p for p in dep.engines if p.role in ("server", "prefill"))
        calibration = calibrate_prompts(engine.url, spec, str(rdir / "calibration.json"))
        first = snap = evidence.snapshot(dep)
        suites: dict[str, dict] = {}
        for suite in spec.suites:
            items = run_suite(dep.endpoint, spec, suite.name, config.name, run, str(rdir / "records.parquet"),
                              calibration, skip, progress, deadline)
            after = evidence.snapshot(dep)
            rows = [r for item in items for r in item["rows"]]
            suites[suite.name] = evidence.suite_evidence(dep, config, snap, after, rows, emulated)
            outcome.cells += items
            snap = after
        rows = [r for item in outcome.cells for r in item["rows"]]
        outcome.transport, outcome.stages = evidence.collect(dep, spec, config, first, snap, rows, suites, ev_dir,
                                                             emulated)
        outcome.ok = True
        say(f"[{config.name}] transport {outcome.transport['verdict']}, stages {outcome.stages['verdict']}")
    except ProvisionError as e:
        outcome.error = f"provisioning failed: {e}"
    except CellTimeout as e:
        outcome.error = f"timed out: {e}"
    except Exception as e:  # noqa: BLE001 - a failed configuration must not stop the others
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt from e
        outcome.error = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    finally:
        if dep is not None:
            target.stop(dep)
    if outcome.error:
        say(f"[{config.name}] FAILED: {outcome.error}")
    write_json(ev_dir / "outcome.json", {"ok": outcome.ok, "error": outcome.error, "router": outcome.router})
    return outcome


def run_name_for(spec: ExperimentSpec, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now()
    return f"{spec.name}-{spec.target.kind}-{now:%Y%m%d-%H%M%S}"


class Progress:
    """Cells done / total as a Prefect progress artifact (visible live in the UI)."""

    def __init__(self, total: int):
        self.total, self.done = max(1, total), 0
        self.artifact_id = None
        try:
            from prefect.artifacts import create_progress_artifact
            self.artifact_id = create_progress_artifact(0.0, key="epdbench-progress",
                                                        description=f"cells done of {self.total}")
        except Exception:  # noqa: BLE001 - no flow-run context: progress shows in the terminal only
            self.artifact_id = None

    def cell_done(self, n: int = 1) -> None:
        self.done += n
        if self.artifact_id is not None:
            from prefect.artifacts import update_progress_artifact
            update_progress_artifact(self.artifact_id, 100.0 * self.done / self.total)


def _try_mlflow(what: str, fn, *args):
    """MLflow being down must not lose a run: results stay on disk for `epdbench sync`."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        say(f"MLflow unavailable ({what}): {type(e).__name__}: {str(e)[:200]}")
        return None


@flow(name="compare", flow_run_name="{spec.name}-{trigger}")
def compare(spec: ExperimentSpec, out_dir: str | None = None, tracking_uri: str | None = None,
            trigger: str = "cli", run_name: str | None = None, resume: bool = False,
            regression: RegressionSettings | None = None) -> dict:
    """Compare every configuration of the spec on matched workloads; returns the outcome. With
    `resume`, cells already recorded in the results directory are skipped and configurations
    already finished are not run again."""
    run = run_name or run_name_for(spec)
    rdir = Path(out_dir or Path("results") / run)
    rdir.mkdir(parents=True, exist_ok=True)
    if not resume or not (rdir / "spec.yaml").exists():
        (rdir / "spec.yaml").write_text(spec_to_yaml(spec))
    state = publish.load_state(rdir)
    uri = publish.resolve_tracking_uri(tracking_uri, spec)
    tracker = _try_mlflow("connect", Tracker, uri, spec.tracking.experiment)
    if tracker and not state["mlflow_parent"]:
        state["mlflow_parent"] = _try_mlflow("start", publish.start_comparison, tracker, spec, run, rdir, trigger,
                                             _prefect_flow_run_id())
    publish.save_state(rdir, state)
    cells = plan_cells(spec)
    say(f"Run {run}: {len(spec.configurations)} configurations × {len(cells)} cells × "
        f"{spec.trials} trial(s) → {rdir}" + (" (resuming)" if resume else ""))
    progress = Progress(len(spec.configurations) * len(cells) * spec.trials)
    outcomes: dict[str, ConfigOutcome] = {}
    for config in spec.configurations:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        finished = publish.config_outcome(rdir, config.name) if resume else {}
        if finished.get("ok"):
            say(f"[{config.name}] already finished in this run, skipped (resume)")
            outcomes[config.name] = ConfigOutcome(config.name, True, None, finished["transport"],
                                                  finished["stages"], finished.get("router", ""))
            progress.cell_done(len(cells) * spec.trials)
        else:
            skip = frozenset(publish.cells_done(rdir, spec, config.name)) if resume else frozenset()
            outcomes[config.name] = run_configuration(spec, config, run, str(rdir), skip, progress)
        if tracker and state["mlflow_parent"] and config.name not in state["published"]:
            if _try_mlflow(config.name, publish_configuration_task, tracker, state["mlflow_parent"], spec, config,
                           str(rdir)):
                state["published"].append(config.name)
                publish.save_state(rdir, state)

    summary = summarize(read_records(rdir / "records.parquet"), {c.name: c.gpus for c in spec.configurations})
    write_summary(rdir, summary)
    aggregate_trials(summary).to_csv(rdir / "summary_trials.csv", index=False)
    verdicts = {name: verdict_view(o) for name, o in outcomes.items()}
    meta = report_meta(spec, run, outcomes)
    parent = state["mlflow_parent"]
    check = check_history(uri, spec.tracking.experiment, spec.name, spec.target.kind, parent, summary,
                          regression or RegressionSettings())
    write_report(rdir, meta, verdicts, check, summary)
    outcome = {"run": run, "results_dir": str(rdir), "tracking_uri": uri, "mlflow_run_id": parent,
               "mlflow_url": tracker.run_url(parent) if tracker and parent else None, "trigger": trigger,
               "configs": {n: {"ok": o.ok, "verified": o.verified(spec.target.kind), "error": o.error,
                               "transport": o.transport.get("verdict"), "stages": o.stages.get("verdict")}
                           for n, o in outcomes.items()}}
    outcome["all_verified"] = all(c["verified"] for c in outcome["configs"].values())
    outcome["meta"], outcome["verdicts"], outcome["regression"] = meta, verdicts, check
    write_json(rdir / "outcome.json", outcome)
    if tracker and parent and not state["parent_published"]:
        _try_mlflow("comparison", publish_comparison_task, tracker, parent, str(rdir), outcome["all_verified"],
                    all(o.ok for o in outcomes.values()))
        state["parent_published"] = _published_ok(tracker, parent)
        if check["status"] != "unavailable":
            _try_mlflow("regression tags", log_regression_check, uri, parent, check)
        publish.save_state(rdir, state)
    outcome["mlflow_pending"] = not (state["parent_published"]
                                     and set(state["published"]) >= {c.name for c in spec.configurations})
    if outcome["mlflow_pending"]:
        say(f"Not everything reached MLflow; results are safe in {rdir}. Publish later with: "
            f"epdbench sync {rdir}")
    write_json(rdir / "outcome.json", outcome)
    _prefect_summary_artifact(outcome, summary)
    return outcome


def _published_ok(tracker: Tracker, parent: str) -> bool:
    try:
        names = {a.path for a in tracker.client.list_artifacts(parent)}
    except Exception:  # noqa: BLE001
        return False
    return "report.md" in names


def _prefect_summary_artifact(outcome: dict, summary) -> None:
    """The Markdown artifact that ends a flow run in the Prefect UI: headline table, verdicts, MLflow link."""
    try:
        from prefect.artifacts import create_markdown_artifact
    except ImportError:
        return
    lines = [f"# epdbench {outcome['run']}", ""]
    if outcome.get("mlflow_url"):
        lines += [f"MLflow comparison run: [{outcome['mlflow_run_id']}]({outcome['mlflow_url']})", ""]
    lines += ["| configuration | ok | transport | stages |", "|---|---|---|---|"]
    lines += [f"| {n} | {'yes' if c['ok'] else 'FAILED: ' + (c['error'] or '')} | {c['transport']} | {c['stages']} |"
              for n, c in outcome["configs"].items()]
    if not summary.empty:
        lines += ["", "| config | suite | workload | conc | stream | ok | TTFT p50 ms | ITL p99 ms | tok/s |",
                  "|---|---|---|---:|---|---:|---:|---:|---:|"]
        for _, r in summary.iterrows():
            def f(v):
                return "—" if v is None else f"{float(v):.1f}"
            lines.append(f"| {r['config']} | {r['suite']} | {r['workload']} | {r['concurrency']} | {r['stream']} | "
                         f"{r['requests_ok']}/{r['requests_total']} | {f(r['ttft_p50_ms'])} | {f(r['itl_p99_ms'])} | "
                         f"{f(r['output_tok_s'])} |")
    lines += ["", regression_line(outcome.get("regression")), "", f"Results: `{outcome['results_dir']}`"]
    try:
        create_markdown_artifact("\n".join(lines), key="epdbench-report", description=f"epdbench {outcome['run']}")
    except Exception:  # noqa: BLE001 - outside a flow run context
        pass


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
                          "cache": cache_by_role(s["metrics_delta"])}
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
        "reuse_suites": [s.name for s in spec.suites if getattr(s, "reuse_image", False)],
    }


def _prefect_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run
        return str(flow_run.id) if flow_run.id else None
    except Exception:  # noqa: BLE001
        return None
