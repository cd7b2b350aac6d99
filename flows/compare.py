"""The comparison flow: one subflow per configuration, then summary, comparison and report.

Sequencing only: side effects live in tasks/, statistics and rendering in analysis/ and reports/.
"""
from __future__ import annotations

import datetime as dt
import errno
import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from epdbench.analysis.compare import compare as compare_cells     # `compare` is this module's flow
from epdbench.analysis.goodput import goodput_lines
from epdbench.reports.breakdown import breakdown_lines
from epdbench.analysis.labels import cell_label
from epdbench.analysis.metrics import RECORD_COLUMNS, summarize
from epdbench.analysis.pareto import pareto_points
from epdbench.analysis.regression import RegressionSettings
from epdbench.analysis.trials import aggregate_trials
from epdbench.specs.budget import resolve_gpu_budget
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec, load_spec, spec_to_yaml
from epdbench.specs.profile import profile_to_yaml
from epdbench.specs.workload import Cell, calibration_keys, plan_cells
from epdbench.reports.goodput import throughput_goodput_gaps
from epdbench.reports.pareto import pareto_lines
from epdbench.reports.progress import starting_line
from epdbench.reports.footing import gpu_footing
from epdbench.reports.verdict import verdict_lines
from epdbench.flows.outputs import prefect_summary_artifact, report_meta, verdict_view
from epdbench.flows.incluster import LoadgenIncomplete, run_suite_in_cluster
from epdbench.flows.suite import CellTimeout, DeploymentDied, run_suite, say
from epdbench.flows.virtual import VIRTUAL_ROUTER, run_virtually, virtual_calibration
from epdbench.sim.gpu import shares_one_gpu
from epdbench.tasks import evidence
from epdbench.tasks.publishing import publish
from epdbench.tasks.publishing.publish import roles_text
from epdbench.tasks.deployment import ProvisionError
from epdbench.tasks.targets import target_module
from epdbench.tasks.load.calibrate import calibrate
from epdbench.tasks.publishing.publish_state import PROFILE_FILE
from epdbench.tasks.load.otlp_receiver import TraceCollector
from epdbench.tasks.rundir.traces import drop_spans, traces_path
from epdbench.tasks.rundir.results import drop_records, read_records, write_json, write_summary, write_text_atomic
from epdbench.tasks.rundir.resume import check_resumable, cells_done, missing_cells, noise_of, validate_state_files
from epdbench.tasks.rundir.runstate import RunFolder, end_leftovers
from epdbench.tasks.publishing.history import check_history, log_regression_check
from epdbench.tasks.rundir.report_files import read_goodput, ttft_breakdown, write_report
from epdbench.tasks.publishing.tracking import Tracker

# Set by the CLI's SIGINT handler: an interrupt that Prefect turns into another exception while a task
# starts must still stop the run, not just fail the current configuration.
INTERRUPTED = threading.Event()
# The results folder this process holds while a comparison runs (its lock and process registry).
RUN_FOLDER: RunFolder | None = None


@dataclass
class ConfigOutcome:
    config: str
    ok: bool
    error: str | None = None
    transport: dict = field(default_factory=dict)
    stages: dict = field(default_factory=dict)
    router: str = ""
    cells: list[dict] = field(default_factory=list)
    status: str = "failed"     # ok | degraded (requests failed above the threshold) | failed

    def verified(self, target: str) -> bool:
        """Ran, and its evidence holds; `emulated` counts only on the simulator target."""
        return publish.evidence_ok({"ok": self.ok, "transport": self.transport, "stages": self.stages}, target)


@task(name="calibrate-prompts", cache_policy=NO_CACHE, retries=2, retry_delay_seconds=2)
def calibrate_prompts(engine_url: str, spec: ExperimentSpec, path: str) -> dict:
    """Once per run, against the first configuration's engine; reused by every configuration."""
    if Path(path).exists():
        return json.loads(Path(path).read_text())
    keys = calibration_keys(spec)
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
def publish_comparison_task(tracker: Tracker, parent: str, rdir: str, all_verified: bool, all_ok: bool) -> str:
    return publish.publish_comparison(tracker, parent, Path(rdir), all_verified, all_ok)


@flow(name="configuration", flow_run_name="{config.name}")
def run_configuration(spec: ExperimentSpec, config: ConfigurationSpec, run: str, run_dir: str,
                      skip: frozenset = frozenset(), progress: "Progress | None" = None) -> ConfigOutcome:
    """Provision, verify readiness, run every suite, collect evidence; tear down always."""
    rdir = Path(run_dir)
    ev_dir = rdir / "evidence" / config.name
    log_dir = ev_dir  # raw process logs are evidence
    outcome = ConfigOutcome(config.name, ok=False)
    say(starting_line(spec, config, roles_text(config)))
    if spec.virtual:
        return _run_virtually(spec, config, run, rdir, ev_dir, outcome, skip, progress)
    dep = None
    target = target_module(spec.target.kind)
    traces = None
    try:
        evidence.archive_attempt_logs(ev_dir)   # a resumed attempt's verdicts read its own processes only
        tracing = {}
        if spec.tracing.enabled and spec.target.kind in ("sim", "local"):   # engines export to this process
            traces = TraceCollector(traces_path(rdir, config.name))
            tracing["traces_endpoint"] = traces.start()
        dep = target.start(spec, config, rdir / "spec.yaml", log_dir, **tracing)   # each registered as it starts
        if spec.tracing.enabled and dep.pull_spans is not None:   # engines export to a collector in the cluster
            traces = TraceCollector(traces_path(rdir, config.name), pull=dep.pull_spans)
        outcome.router = dep.router
        say(f"[{config.name}] serving at {dep.endpoint} via {dep.router}")
        if spec.target.kind == "sim" and shares_one_gpu(spec, config):
            say(f"[{config.name}] its engines share one GPU on the local target (target.local.gpu_share); on the HTTP "
                "clock each simulated engine has a GPU of its own: --clock virtual models the sharing")
        if dep.telemetry_note:
            say(f"[{config.name}] {dep.telemetry_note}")
        emulated = spec.target.kind == "sim"
        scale = spec.time_scale
        deadline = (time.monotonic() + spec.configuration_timeout_s * scale) if spec.configuration_timeout_s else None
        engine = next(p for p in dep.engines if p.role in ("server", "prefill"))
        calibration = calibrate_prompts(engine.url, spec, str(rdir / "calibration.json"))
        first = snap = evidence.snapshot(dep)
        suites: dict[str, dict] = {}
        in_cluster = spec.target.kind == "kubernetes" and spec.target.kubernetes.loadgen.run_in == "cluster"
        for suite in spec.suites:
            if in_cluster:
                items = run_suite_in_cluster(dep, target.schema_version(dep.api, spec), spec, suite.name, config,
                                             run, str(rdir / "records.parquet"), calibration, skip, progress,
                                             job_timeout_s(spec, suite.name, deadline), traces)
            else:
                items = run_suite(dep.endpoint, spec, suite.name, config.name, run, str(rdir / "records.parquet"),
                                  calibration, skip, progress, deadline, dep.health,
                                  (lambda: evidence.scrape_metrics(dep)) if emulated else None, traces,
                                  telemetry=dep.telemetry)
            after = evidence.snapshot(dep)
            rows = [r for item in items for r in item["rows"]]
            suites[suite.name] = evidence.suite_evidence(dep, config, snap, after, rows, emulated)
            outcome.cells += items
            snap = after
        rows = [r for item in outcome.cells for r in item["rows"]]
        outcome.transport, outcome.stages = evidence.collect(dep, spec, config, first, snap, rows, suites, ev_dir,
                                                             emulated)
        _close_configuration(outcome)
    except ProvisionError as e:
        outcome.error = f"provisioning failed: {e}"
    except CellTimeout as e:
        outcome.error = f"timed out: {e}"
    except DeploymentDied as e:
        outcome.error = f"a process of the deployment died: {e}"
    except LoadgenIncomplete as e:
        outcome.error = f"in-cluster load generator: {e}"
    except Exception as e:  # noqa: BLE001 - a failed configuration must not stop the others
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt from e
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise   # a full disk stops the run (the CLI says so in one line); what finished is kept
        outcome.error = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    finally:
        if traces is not None and traces.pull is not None:   # while the collector beside the router is still there
            traces.close(0 if INTERRUPTED.is_set() else 1.0)   # (interrupted: what each cell flushed is kept)
        if dep is not None:
            target.stop(dep)
        if traces is not None and traces.pull is None:
            traces.close()   # the spans the engines flushed as they stopped
    _end_configuration(outcome, ev_dir)
    return outcome


def _run_virtually(spec: ExperimentSpec, config: ConfigurationSpec, run: str, rdir: Path, ev_dir: Path,
                   outcome: ConfigOutcome, skip: frozenset, progress: "Progress | None") -> ConfigOutcome:
    """run_configuration in virtual time (flows.virtual): no processes to start or stop."""
    outcome.router = VIRTUAL_ROUTER
    say(f"[{config.name}] serving in virtual time (no processes, no HTTP)"
        + ("; its engines time-slice one GPU, as on the local target" if shares_one_gpu(spec, config) else ""))
    try:
        calibration = virtual_prompts(spec, str(rdir / "calibration.json"))
        outcome.cells, observed = run_virtually(spec, config, run, str(rdir), calibration, skip, progress,
                                                INTERRUPTED.is_set)
        served = observed.pop("served")
        outcome.transport, outcome.stages = evidence.collect_virtual(
            spec, config, [r for rows in served.values() for r in rows], served, observed, ev_dir)
        _close_configuration(outcome)
    except Exception as e:  # noqa: BLE001 - a failed configuration must not stop the others
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt from e
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            raise
        outcome.error = f"{type(e).__name__}: {e}"
        traceback.print_exc(file=sys.stderr)
    _end_configuration(outcome, ev_dir)
    return outcome


def _close_configuration(outcome: ConfigOutcome) -> None:
    """After its evidence: ok, or degraded when a cell's requests failed above the threshold; the verdicts line."""
    bad = [i for i in outcome.cells if i["status"] != "ok"]
    if bad:
        worst: Cell = bad[0]["cell"]
        where = cell_label(worst.workload, worst.concurrency, worst.stream, short=True)
        outcome.error = (f"degraded: {len(bad)} of {len(outcome.cells)} cells above the failed-request "
                         f"threshold ({worst.suite} {where}: {bad[0]['reason']})")
        outcome.status = "degraded"
    else:
        outcome.ok = True
    ec = outcome.transport.get("ec")
    say(f"[{outcome.config}] transport {outcome.transport['verdict']}"
        + (f", encoder outputs {ec['verdict']}" if ec else "") + f", stages {outcome.stages['verdict']}")


def _end_configuration(outcome: ConfigOutcome, ev_dir: Path) -> None:
    if outcome.ok:
        outcome.status = "ok"
    if outcome.error:
        say(f"[{outcome.config}] {outcome.status.upper()}: {outcome.error}")
    write_json(ev_dir / "outcome.json", {"ok": outcome.ok, "status": outcome.status, "error": outcome.error,
                                         "router": outcome.router})


@task(name="calibrate-prompts-virtually", cache_policy=NO_CACHE)
def virtual_prompts(spec: ExperimentSpec, path: str) -> dict:
    """calibrate_prompts in virtual time: against the simulator's tokenizer in this process."""
    if Path(path).exists():
        return json.loads(Path(path).read_text())
    fits = virtual_calibration(spec)
    write_json(Path(path), fits)
    return fits


def job_timeout_s(spec: ExperimentSpec, suite: str, deadline: float | None) -> float:
    """How long a suite's load generator Job may take: what is left of the configuration's deadline, else the
    cell timeout (30 min when unset) for each of the suite's cells and trials."""
    if deadline is not None:
        return max(1.0, deadline - time.monotonic())
    cells = sum(1 for c in plan_cells(spec) if c.suite == suite) * spec.trials
    return (spec.cell_timeout_s or 1800.0) * max(1, cells)


def run_name_for(spec: ExperimentSpec, now: dt.datetime | None = None) -> str:
    now = now or dt.datetime.now()
    where = "sim-virtual" if spec.virtual else spec.target.kind
    return f"{spec.name}-{where}-{now:%Y%m%d-%H%M%S}"


class Progress:
    """Cells done / total as a Prefect progress artifact (visible live in the UI)."""

    def __init__(self, total: int, also: str | None = None):
        """`also`: the id of a progress artifact of the calling flow run (a deployment's), updated as well."""
        self.total, self.done = max(1, total), 0
        self.artifact_ids = [also] if also else []
        try:
            from prefect.artifacts import create_progress_artifact
            self.artifact_ids.append(create_progress_artifact(0.0, key="epdbench-progress",
                                                              description=f"cells done of {self.total}"))
        except Exception:  # noqa: BLE001 - no flow-run context: progress shows in the terminal only
            pass

    def cell_done(self, n: int = 1) -> None:
        self.done += n
        if self.artifact_ids:
            from prefect.artifacts import update_progress_artifact
            for artifact_id in self.artifact_ids:
                update_progress_artifact(artifact_id, 100.0 * self.done / self.total)


_MLFLOW_NOTICE = publish.MlflowNotice()   # one line per run about MLflow failures (reset by each run)


def _try_mlflow(what: str, fn, *args):
    """MLflow being down must not lose a run: results stay on disk for `epdbench sync`. The first failure
    of a run prints one line (where the results are, how to publish them); later ones print nothing."""
    try:
        return fn(*args)
    except Exception as e:  # noqa: BLE001
        line = _MLFLOW_NOTICE.failed(what, e)
        if line:
            say(line)
        return None


@flow(name="compare", flow_run_name="{spec.name}-{trigger}")
def compare(spec: ExperimentSpec, out_dir: str | None = None, tracking_uri: str | None = None,
            trigger: str = "cli", run_name: str | None = None, resume: bool = False,
            regression: RegressionSettings | None = None, progress_artifact: str | None = None,
            profile: dict | None = None) -> dict:
    """Compare every configuration of the spec on matched workloads; returns the outcome (a calling flow's
    progress artifact, `progress_artifact`, is updated too). `profile`: the calibration profile whose constants
    the spec carries (kept in the run as profile.yaml, so its report and MLflow run say where they came from). With
    `resume`, cells already recorded in the results directory are skipped and configurations
    already finished are not run again. The results folder is held exclusively for the whole run
    (FolderLocked when another live process holds it); what a killed earlier run left running is ended
    first, and every process this run starts is registered for the next one to find."""
    global RUN_FOLDER
    spec = resolve_gpu_budget(spec)   # scaled to cost.gpu_budget, if any (a no-op when the CLI resolved it)
    run = run_name or run_name_for(spec)
    rdir = Path(out_dir or Path("results") / run)
    held = RUN_FOLDER is not None and RUN_FOLDER.rdir.resolve() == rdir.resolve()   # the CLI took it already
    hold = RUN_FOLDER if held else RunFolder(rdir).acquire()
    RUN_FOLDER = hold
    try:
        if resume:
            validate_state_files(rdir)
            check_resumable(rdir, spec)
            ended = end_leftovers(rdir)
            if ended:
                say(f"Ended {len(ended)} process(es) an earlier run of {run} left running: "
                    + ", ".join(f"{e['what']} pid {e['pid']}" for e in ended))
        if profile is not None and not (rdir / PROFILE_FILE).exists():
            write_text_atomic(rdir / PROFILE_FILE, profile_to_yaml(profile))
        hold.register_descendants("prefect")
        return _compare(spec, run, rdir, tracking_uri, trigger, resume, regression, progress_artifact)
    finally:
        if not held:
            RUN_FOLDER = None
            hold.release()


def _compare(spec: ExperimentSpec, run: str, rdir: Path, tracking_uri: str | None, trigger: str, resume: bool,
             regression: RegressionSettings | None, progress_artifact: str | None = None) -> dict:
    if not resume or not (rdir / "spec.yaml").exists():
        (rdir / "spec.yaml").write_text(spec_to_yaml(spec))
    elif (stored := load_spec(str(rdir / "spec.yaml"))).cost != spec.cost:   # a resume may price a GPU-hour
        priced = stored.model_copy(update={"cost": spec.cost})            # anew: no figure it measures moves
        write_text_atomic(rdir / "spec.yaml", spec_to_yaml(priced))
    uri = publish.resolve_tracking_uri(tracking_uri, spec)
    state = publish.load_state(rdir, run, publish.store_id(uri, spec.tracking.experiment))
    _MLFLOW_NOTICE.reset(uri, rdir)
    tracker = _try_mlflow("connect", Tracker, uri, spec.tracking.experiment)
    if tracker:   # find-or-create by key: a resumed run gets the comparison run of its first attempt
        state["mlflow_parent"] = _try_mlflow("start", publish.start_comparison, tracker, spec, state["run"], rdir,
                                             trigger, _prefect_flow_run_id(), state["mlflow_parent"])
    publish.save_state(rdir, state)
    cells = plan_cells(spec)
    say(f"Run {run}: {len(spec.configurations)} configurations × {len(cells)} cells × "
        f"{spec.trials} trial(s) → {rdir}" + (" (resuming)" if resume else "")
        + (" — in virtual time: every figure is the cost model's, no process runs" if spec.virtual else ""))
    progress = Progress(len(spec.configurations) * len(cells) * spec.trials, progress_artifact)
    outcomes: dict[str, ConfigOutcome] = {}
    for config in spec.configurations:
        if INTERRUPTED.is_set():
            raise KeyboardInterrupt
        finished = publish.config_outcome(rdir, config.name) if resume else {}
        done = cells_done(rdir, spec, config.name) if resume else set()
        missing = missing_cells(spec, done) if resume else []
        if finished.get("ok") and not missing:
            say(f"[{config.name}] already finished in this run, skipped (resume)")
            outcomes[config.name] = ConfigOutcome(config.name, True, None, finished["transport"],
                                                  finished["stages"], finished.get("router", ""), status="ok")
            progress.cell_done(len(cells) * spec.trials)
        else:
            if finished.get("ok"):
                say(f"[{config.name}] finished earlier, but {len(missing)} cell(s) are missing from "
                    f"records.parquet or differ from the plan: measuring them again")
            skip = frozenset(done)
            if resume:
                drop_records(rdir / "records.parquet", config.name, set(missing))
                drop_spans(traces_path(rdir, config.name), set(missing))
            outcomes[config.name] = run_configuration(spec, config, run, str(rdir), skip, progress)
        fingerprint = publish.config_fingerprint(rdir, config.name)   # what is on disk now for this config
        if tracker and state["mlflow_parent"] and state["published"].get(config.name) != fingerprint:
            if _try_mlflow(config.name, publish_configuration_task, tracker, state["mlflow_parent"], spec, config,
                           str(rdir)):
                state["published"][config.name] = fingerprint
                publish.save_state(rdir, state)

    summary = summarize(read_records(rdir / "records.parquet", RECORD_COLUMNS), {c.name: spec.gpus_used(c) for c in spec.configurations},
                        noise_of(rdir, [c.name for c in spec.configurations]))
    write_summary(rdir, summary)
    aggregate_trials(summary).to_csv(rdir / "summary_trials.csv", index=False)
    verdicts = {name: verdict_view(o) for name, o in outcomes.items()}
    meta = report_meta(spec, run, outcomes)
    parent = state["mlflow_parent"] if tracker else None    # not connected: no MLflow call for the rest of the run
    check = check_history(uri, spec.tracking.experiment, spec.name, spec.target.kind, parent, summary,
                          regression or RegressionSettings())
    write_report(rdir, meta, verdicts, check, summary)
    outcome = {"run": run, "results_dir": str(rdir), "tracking_uri": uri, "mlflow_run_id": parent,
               "mlflow_url": tracker.run_url(parent) if tracker and parent else None, "trigger": trigger,
               "configs": {n: {"ok": o.ok, "status": o.status, "verified": o.verified(spec.target.kind), "error": o.error,
                               "transport": o.transport.get("verdict"), "stages": o.stages.get("verdict"),
                               "ec_transport": (o.transport.get("ec") or {}).get("verdict")}
                           for n, o in outcomes.items()}}
    outcome["all_verified"] = all(c["verified"] for c in outcome["configs"].values())
    outcome["contaminated_cells"] = int(summary["contaminated"].fillna(False).astype(bool).sum()) if len(summary) else 0
    outcome["meta"], outcome["verdicts"], outcome["regression"] = meta, verdicts, check
    goodput_table = read_goodput(rdir / "goodput.csv")
    outcome["goodput"] = goodput_lines(goodput_table)
    outcome["ttft_breakdown"] = breakdown_lines(ttft_breakdown(rdir, meta, read_records(rdir / "records.parquet")))
    outcome["pareto"] = pareto_lines(pareto_points(summary, spec.cost.gpu_hour_usd), meta)
    comparisons = compare_cells(summary)     # as the report's Verdict (reports.render.report_context), same summary
    outcome["winners"] = verdict_lines(comparisons, gpu_footing(meta)) + throughput_goodput_gaps(
        comparisons, goodput_table, {c.name: spec.gpus_used(c) for c in spec.configurations})
    write_json(rdir / "outcome.json", outcome)
    fingerprint = publish.comparison_fingerprint(rdir)
    if tracker and parent and state["parent_published"] != fingerprint:
        if _try_mlflow("comparison", publish_comparison_task, tracker, parent, str(rdir), outcome["all_verified"],
                       all(o.ok for o in outcomes.values())):
            state["parent_published"] = fingerprint
        if check["status"] != "unavailable":
            _try_mlflow("regression tags", log_regression_check, uri, parent, check)
        publish.save_state(rdir, state)
    outcome["mlflow_pending"] = publish.pending(state, rdir, spec)     # [] or ["comparison", config, ...]
    if tracker and parent and outcome["mlflow_pending"] and "comparison" not in outcome["mlflow_pending"]:
        # the comparison run went through but not all of its configurations: not FINISHED until `sync` completes it
        tracker.fail(parent, f"not published: {', '.join(outcome['mlflow_pending'])}; publish with: "
                             f"epdbench sync {rdir}")
    if outcome["mlflow_pending"] and not _MLFLOW_NOTICE.said:
        say(f"Not everything reached MLflow; results are safe in {rdir}. Publish later with: "
            f"epdbench sync {rdir}")
    write_json(rdir / "outcome.json", outcome)
    prefect_summary_artifact(outcome, summary)
    return outcome


def _prefect_flow_run_id() -> str | None:
    try:
        from prefect.runtime import flow_run
        return str(flow_run.id) if flow_run.id else None
    except Exception:  # noqa: BLE001
        return None
