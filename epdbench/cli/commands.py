"""The sub-commands of `epdbench`, each returning its exit code; imports are deferred so that a bad
flag answers at once, before Prefect, MLflow or Kubernetes load."""
from __future__ import annotations

import logging
import re
import signal
import sys
from pathlib import Path

from epdbench.cli.common import (EXIT_FAILURES, EXIT_OK, EXIT_REGRESSION, EXIT_UNPUBLISHED, INTERRUPTED_RUN,
                                 NO_SPACE_ERRNOS, CliError, check_out_dir, config_names, gpu_hour_usd_of,
                                 kube_overrides, load_compare_spec, pool_settings,
                                 quiet_defaults, regression_settings, results_dir_of, tracking_uri_of, with_target)


def cmd_compare(args) -> int:
    out = args.out
    if args.resume:
        rdir = results_dir_of(args.resume)
        if args.out and Path(args.out).resolve() != rdir.resolve():
            raise CliError("--out and --resume name different directories; give one of them")
        out = str(rdir)
        args.spec = str(rdir / "spec.yaml")
    if out is not None:
        check_out_dir(out)
    spec, profile = load_compare_spec(args)
    if args.resume:   # before anything is written or started (the flow checks again, for runs from the UI)
        from epdbench.tasks.rundir.resume import check_resumable
        check_resumable(rdir, spec)
    if not args.resume and out and Path(out).exists() and any(Path(out).iterdir()):
        raise CliError(f"--out {out}: directory exists and is not empty; choose a new one or --resume it")
    settings = regression_settings(args)
    if profile is not None:
        from epdbench.specs.profile import error_bar
        print(f"Simulator constants from profile {args.profile}; {error_bar(profile, spec)}", flush=True)
    quiet_defaults()
    from epdbench.flows import compare as compare_flow
    from epdbench.reports.terminal import print_summary
    from epdbench.tasks.rundir.runstate import FolderLocked, RunFolder

    run_name = Path(out).name if args.resume else None
    if out is None:
        run_name = compare_flow.run_name_for(spec)
        out = str(Path("results") / run_name)
        check_out_dir(out)
    try:   # hold the folder before anything else starts; the flow keeps this hold
        hold = RunFolder(Path(out)).acquire()
    except FolderLocked as e:
        raise CliError(str(e)) from None
    compare_flow.RUN_FOLDER = hold
    INTERRUPTED_RUN["dir"] = out
    try:
        outcome = _run_compare(args, spec, out, run_name, settings, profile)
    except Exception:
        if compare_flow.INTERRUPTED.is_set():   # the interrupt became another error on its way out: a terminal's
            raise KeyboardInterrupt from None   # Ctrl-C also ends Prefect's temporary server, which then refuses
        raise                                   # the flow's crash report (httpx.ConnectError), and the run hung
    finally:   # the run ends in any way but death: its guard leaves, ending nothing (a death, its guard handles)
        compare_flow.RUN_FOLDER = None
        hold.release()
    if compare_flow.INTERRUPTED.is_set():   # the signal came, but something on the way swallowed its exception
        raise KeyboardInterrupt
    print_summary(outcome)
    if not outcome["all_verified"]:
        return EXIT_FAILURES
    if outcome.get("mlflow_pending"):
        return EXIT_UNPUBLISHED
    regressed = outcome["regression"].get("overall", {}).get("regressions", 0)
    return EXIT_REGRESSION if args.fail_on_regression and regressed else EXIT_OK


def _run_compare(args, spec, out: str, run_name: str | None, settings, profile) -> dict:
    from epdbench.flows import compare as compare_flow
    from epdbench.tasks.rundir.resume import StateError, validate_state_files

    if args.resume:
        try:
            validate_state_files(Path(out))
        except StateError as e:
            raise CliError(str(e)) from None

    def on_signal(signum, frame):   # Ctrl-C and SIGTERM alike: stop, tear down, keep what finished
        compare_flow.INTERRUPTED.set()
        signal.default_int_handler(signal.SIGINT, frame)

    for handler in logging.getLogger("prefect").handlers + logging.getLogger().handlers:
        handler.addFilter(_console_filter)

    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    start_prefect_server_deaf_to_ctrl_c()
    return compare_flow.compare(spec, out_dir=out, tracking_uri=args.tracking_uri, trigger="cli", run_name=run_name,
                                resume=bool(args.resume), regression=settings, profile=profile)


def start_prefect_server_deaf_to_ctrl_c() -> None:
    """Start Prefect's temporary server (when no Prefect API is configured) with SIGINT blocked, a mask its uvicorn
    inherits and never lifts: a terminal's Ctrl-C goes to the whole foreground process group, and the server, ended by
    it at once, left the interrupted flow retrying its crash report for minutes. It still stops on SIGTERM (Prefect's
    own stop at exit, the interrupt's teardown) and with the run's guard."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    from prefect.server.api.server import SubprocessASGIServer

    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        SubprocessASGIServer().start()     # the one instance Prefect's clients use when no API is configured
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _console_filter(record: logging.LogRecord) -> bool:
    """What Prefect prints on the terminal, less what the CLI says itself in one line: a flow or task run that
    failed or crashed (the configuration's FAILED line, the interrupt or the disk-full line say it). The
    same records still reach the Prefect API, so the UI keeps them."""
    if record.name.startswith(("prefect.flow_runs", "prefect.task_runs")) and record.levelno >= logging.ERROR:
        return False
    msg = record.getMessage()
    return not (msg.startswith("Crash detected! Execution was aborted by") and "signal" in msg)


def cmd_manifests(args) -> int:
    from epdbench.manifests.render import (DEFAULT_SCHEMA_VERSION, ManifestError, manifest_files, render_loadgen,
                                           render_manifests, validate_manifests)
    from epdbench.specs.budget import resolve_gpu_budget
    from epdbench.specs.models import load_spec, spec_to_yaml

    spec = resolve_gpu_budget(with_target(load_spec(args.spec), "kubernetes", kube_overrides(args), args.spec))
    pool = pool_settings(args, spec.target.kubernetes)
    names = [c.name for c in spec.configurations]
    if args.config and args.config not in names:
        raise CliError(f"--config {args.config}: not in this spec; it has {', '.join(names)}")
    version = spec.target.kubernetes.version or DEFAULT_SCHEMA_VERSION
    for config in spec.configurations:
        if args.config and config.name != args.config:
            continue
        # the deployment, then the in-cluster load generator (ConfigMap, one Job per suite; calibration {} here)
        objects = render_manifests(spec, config, args.run) + render_loadgen(spec, config, args.run, spec_to_yaml(spec))
        try:
            validate_manifests(objects, version)
        except ManifestError as e:
            raise CliError(f"{config.name}: {e}") from None
        out = Path(args.out) / config.name
        out.mkdir(parents=True, exist_ok=True)
        for name, text in manifest_files(objects).items():
            (out / name).write_text(text)
        jobs = sum(o["kind"] == "Job" for o in objects)
        print(f"{out}/: {len(objects)} objects ({jobs} load generator Job{'s' * (jobs != 1)}), {config.gpus} GPUs, "
              f"valid for Kubernetes {version}")
    if pool is not None:
        write_pool_manifests(pool, Path(args.out) / "work-pool", version)
    return EXIT_OK


def write_pool_manifests(pool, out: Path, version: str) -> None:
    """The work pool's objects (flow rights, in-cluster worker), its base job template, and the Job a
    flow run of the nightly deployment gets from it, all schema-valid."""
    import json

    from epdbench.manifests.render import ManifestError, manifest_files, manifests_yaml, validate_manifests
    from epdbench.manifests.workpool import render_pool_objects
    from epdbench.tasks.k8s.workpool import flow_run_job, pool_template

    objects = render_pool_objects(pool, worker_in_cluster=True)
    template = pool_template(pool)
    job = flow_run_job(template, {"image": pool.image}, flow_run_name="nightly-sample")
    try:
        validate_manifests(objects + [job], version)
    except ManifestError as e:
        raise CliError(f"work pool: {e}") from None
    out.mkdir(parents=True, exist_ok=True)
    for name, text in manifest_files(objects).items():
        (out / name).write_text(text)
    (out / "base-job-template.json").write_text(json.dumps(template, indent=2) + "\n")
    (out / "flow-run-job.yaml").write_text(manifests_yaml([job]))
    print(f"{out}/: {len(objects)} objects (flow-run rights, worker), base-job-template.json and the Job a flow "
          f"run gets (flow-run-job.yaml), valid for Kubernetes {version}")


def cleanup_run(positional: str | None, flag: str | None) -> str:
    """The run `cleanup` is asked about: given as RUN or as --run RUN (both only when they agree)."""
    if positional and flag and positional != flag:
        raise CliError(f"cleanup: two runs given ({positional} and --run {flag}); name one")
    if not (positional or flag):
        raise CliError("cleanup: which run? epdbench cleanup RUN (or --run RUN), RUN as compare printed it")
    return positional or flag


def cmd_cleanup(args) -> int:
    """What a crashed run left: its processes on this machine (sim target, by the pids and start times
    the run registered) and, with a namespace or kubeconfig, its objects in the cluster."""
    from pydantic import ValidationError

    from epdbench.specs.models import KubernetesTargetSpec, describe_validation_error
    from epdbench.tasks.rundir.runstate import end_leftovers

    run = cleanup_run(args.run, args.run_flag)
    local = Path(run) if Path(run).is_dir() else Path("results") / run
    cluster = any(getattr(args, f) for f in ("kube_context", "namespace", "kubeconfig")) or not local.is_dir()
    if local.is_dir():
        ended = end_leftovers(local)
        names = ", ".join(f"{e['what']} pid {e['pid']}" for e in ended)
        print(f"run {run} on this machine: {len(ended)} leftover process(es) ended"
              + (f" ({names})" if ended else ""))
    if not cluster:
        return EXIT_OK
    from epdbench.tasks.k8s.api import KubeApiError
    from epdbench.tasks.k8s.target import cleanup

    try:
        target = KubernetesTargetSpec(**kube_overrides(args))
    except ValidationError as e:
        raise CliError(describe_validation_error(e, "cleanup", KubernetesTargetSpec)) from None
    try:
        found, left = cleanup(target, Path(run).name)
    except KubeApiError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILURES
    print(f"run {run} in namespace {target.namespace}: {found} objects found, {found - len(left)} gone"
          + (f"; still there: {', '.join(left)}" if left else ""))
    return EXIT_FAILURES if left else EXIT_OK


def cmd_plan(args) -> int:
    import json

    from epdbench.specs.budget import resolve_gpu_budget
    from epdbench.specs.models import load_spec, select_configurations
    from epdbench.analysis.plan import plan, total_seconds

    spec = load_spec(args.spec)
    spec = resolve_gpu_budget(select_configurations(spec, config_names(args.configs)))   # as compare deploys them
    rows = plan(spec)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    from epdbench.reports.plan_table import plan_lines
    print("\n".join(plan_lines(rows, spec.trials, total_seconds(spec, rows), spec.virtual)))
    return EXIT_OK


def cmd_report(args) -> int:
    """Re-render report.md, report.html and plots/ from a results directory or an MLflow comparison run."""
    from epdbench.tasks.rundir.report_files import ResultsError, download_comparison, rerender

    if bool(args.results_dir) == bool(args.run_id):
        raise CliError("report: give a results directory or --run-id, not both or neither")
    price = gpu_hour_usd_of(args)
    try:
        out = None
        if args.run_id:
            quiet_defaults()
            rdir = download_comparison(tracking_uri_of(args), args.run_id, Path(args.out) if args.out else None)
        else:
            rdir = Path(args.results_dir)
            out = Path(args.out) if args.out else None      # the reports there; the results folder untouched
        paths = rerender(rdir, out, price)
    except ResultsError as e:
        raise CliError(str(e)) from None
    for path in paths:
        print(path)
    return EXIT_OK


def preset_clock(name: str) -> str:
    """The simulator clock of preset `name` (smoke: virtual), real for a name that is no preset."""
    from epdbench.specs.models import PRESET_DIR, load_spec

    return load_spec(name).target.sim.clock if (PRESET_DIR / f"{name}.yaml").is_file() else "real"


def cmd_history(args) -> int:
    """Print one metric over the past runs of a spec (oldest first) and where the newest stands."""
    from epdbench.analysis.metrics import METRIC_KEYS
    from epdbench.reports.trend import select, trend_lines
    from epdbench.tasks.publishing.history import cell_history, experiment_id, latest_fingerprint, mlflow_client

    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,60}", args.spec):
        raise CliError(f"--spec {args.spec}: not a spec name (lowercase letters, digits and dashes, e.g. pd-text)")
    if args.metric not in METRIC_KEYS:
        raise CliError(f"--metric {args.metric}: not a cell metric; choose one of {', '.join(METRIC_KEYS)}")
    settings = regression_settings(args)
    args.clock = args.clock or preset_clock(args.spec)
    quiet_defaults()
    client = mlflow_client(tracking_uri_of(args))
    exp_id = experiment_id(client, args.experiment)
    if exp_id is None:
        raise CliError(f"--experiment {args.experiment}: not in {tracking_uri_of(args)}; give --tracking-uri "
                       "or --experiment of your runs")
    # the newest good run's resolved spec, and only runs whose evidence held, as the nightly check judges them
    history = cell_history(client, exp_id, args.spec, args.target, settings.last_n + 1,
                           fingerprint=latest_fingerprint(client, exp_id, args.spec, args.target, args.clock),
                           verified_only=True)
    if history.empty:
        clock = " in virtual time" if args.clock == "virtual" else ""
        raise CliError(f"--spec {args.spec}: no comparison runs on target {args.target}{clock} in experiment "
                       f"{args.experiment}")
    if args.clock == "virtual":
        print("Runs in virtual time: every figure is the simulator's cost model, not a measurement.")
    for line in trend_lines(select(history, args.config, args.workload, args.concurrency), args.metric, settings):
        print(line)
    return EXIT_OK


def cmd_up(args) -> int:
    from pydantic import ValidationError

    from epdbench.specs.models import KubernetesTargetSpec, describe_validation_error

    overrides = kube_overrides(args)
    if overrides and not args.work_pool:
        flag = next(f for f in ("namespace", "kubeconfig", "kube_context") if getattr(args, f, None))
        raise CliError(f"--{flag.replace('_', '-')}: applies with --work-pool only")
    try:
        target = KubernetesTargetSpec(**overrides)
    except ValidationError as e:
        raise CliError(describe_validation_error(e, "up", KubernetesTargetSpec)) from None
    settings = pool_settings(args, target)
    quiet_defaults()
    from epdbench.tasks.services import PoolPlan, up

    if settings is not None and args.host in ("127.0.0.1", "localhost", "::1"):
        print(f"warning: Prefect and MLflow listen on {args.host} only; pods reach them at {args.advertise} "
              "only through a tunnel (else pass --host 0.0.0.0)", file=sys.stderr)
    pool = PoolPlan(settings, target, args.worker) if settings else None
    return up(args.host, args.prefect_port, args.mlflow_port, Path(args.data_dir), args.nightly_cron,
              args.timezone, args.nightly_preset, pool=pool)


def cmd_down(args) -> int:
    from epdbench.tasks.services import down
    return down(Path(args.data_dir))


def cmd_sync(args) -> int:
    """Publish what a run could not. Exit 0: published, or nothing left to publish; 2: no such results folder,
    or a file of it cannot be read (named, with the fix); 5: MLflow could not take it — unreachable, or it refused
    something (its whole reason) — the results stay in the folder and this can run again. Always one line."""
    quiet_defaults()
    from epdbench.tasks.publishing.publish import check_publishable, sync_results
    from epdbench.tasks.rundir.resume import StateError
    from epdbench.tasks.publishing.mlflow_quiet import failure_reason, is_unreachable
    rdir = results_dir_of(args.run)
    try:
        check_publishable(rdir)
        print(sync_results(rdir, args.tracking_uri))
    except StateError as e:
        raise CliError(str(e)) from None
    except Exception as e:  # noqa: BLE001 - whatever MLflow answers, one line and exit 5
        if isinstance(e, OSError) and e.errno in NO_SPACE_ERRNOS and not is_unreachable(e):
            raise                                               # the folder could not be written: exit 6
        if is_unreachable(e):
            print(f"error: MLflow unreachable ({failure_reason(e)}); results stay in {rdir}: run this again once "
                  "it is up", file=sys.stderr)
        else:
            print(f"error: MLflow did not take {rdir} ({failure_reason(e)}); results stay in the folder: run this "
                  "again once the cause is fixed", file=sys.stderr)
        return EXIT_UNPUBLISHED
    return EXIT_OK


def cmd_verify_transport(args) -> int:
    """Exit 0 only when the logs prove the expected transport carried the KV (or the encoder outputs)."""
    import json

    from epdbench.analysis.mooncake_log import transport_of_pod
    from epdbench.analysis.transport import verify_transport
    from epdbench.analysis.ucx import has_nixl_evidence, nixl_of_pod, verify_nixl
    from epdbench.reports.transport_lines import mooncake_pod_lines, nixl_pod_lines
    from epdbench.tasks.evidence import iter_lines

    missing = [p for p in args.logs if not Path(p).is_file()]
    if missing:
        raise CliError(f"verify-transport: no such log file: {missing[0]}")
    if args.encoder_outputs and args.connector == "mooncake":
        raise CliError("verify-transport: encoder outputs move over NIXL (ECCPUConnector): drop --connector mooncake")
    nixl = {Path(p).name: nixl_of_pod(iter_lines(Path(p))) for p in args.logs}
    use_nixl = args.connector == "nixl" or args.encoder_outputs or (
        args.connector == "auto" and any(has_nixl_evidence(p) for p in nixl.values()))
    if use_nixl:
        pods = nixl
        result = verify_nixl(args.expect, pods, what="ec" if args.encoder_outputs else "kv")
    else:
        pods = {Path(p).name: transport_of_pod(iter_lines(Path(p))) for p in args.logs}
        result = verify_transport(args.expect, pods)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print_reasons(result)
        for name, pod in pods.items():
            print("\n".join(nixl_pod_lines(name, pod) if use_nixl else mooncake_pod_lines(name, pod)))
    return EXIT_OK if result["verdict"] == "verified" else EXIT_FAILURES


def print_reasons(result: dict) -> None:
    """One line per reason, each under the verdict (a lane set or an install shared by many endpoints or workers
    is one reason already)."""
    for reason in result["reasons"] or ["no reason given"]:
        print(f"{result['verdict']}: {reason}")
