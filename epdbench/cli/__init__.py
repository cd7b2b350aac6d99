"""epdbench command line. Bad input gets one line naming the field and the fix, and exit code 2.

Exit codes of `compare`: 0 all configurations ran and their evidence holds (verified, or emulated
on the simulator); 2 bad input; 3 completed with failures or unverified evidence; 4 (with
--fail-on-regression) a metric regressed beyond the noise of the previous runs.
"""
from __future__ import annotations

import argparse
import os
import re
import signal
import sys
from pathlib import Path

EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILURES, EXIT_REGRESSION = 0, 2, 3, 4


def quiet_defaults() -> None:
    """Telemetry off and a start-up timeout that fits small machines, unless the user set them."""
    for k, v in {
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_RESULTS_PERSIST_BY_DEFAULT": "false",
        "GIT_PYTHON_REFRESH": "quiet",
        "MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2",      # an unreachable server fails fast; `epdbench sync` later
        "MLFLOW_HTTP_REQUEST_TIMEOUT": "20",
    }.items():
        os.environ.setdefault(k, v)


class CliError(Exception):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # one line, exit 2
        raise CliError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="epdbench", description="Compare aggregated, PD and EPD LLM serving on matched workloads.")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)

    c = sub.add_parser("compare", help="run the comparison (main job)")
    c.add_argument("--spec", default="smoke", help="spec YAML path or preset name (default: smoke)")
    c.add_argument("--target", choices=["sim", "kubernetes"], default=None, help="where to run (default: spec's, sim)")
    c.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    c.add_argument("--out", default=None, help="results directory (default: results/<run>)")
    c.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: sqlite under .epdbench/)")
    c.add_argument("--experiment", default=None, help="MLflow experiment name (default: spec's, epdbench)")
    c.add_argument("--seed", type=int, default=None, help="override the spec's seed")
    add_kube_flags(c)
    c.add_argument("--keep", action="store_true", help="leave each configuration running (--target kubernetes)")
    c.add_argument("--resume", default=None, metavar="RUN",
                   help="continue an interrupted run (results/RUN or a results path): recorded cells are skipped")
    c.add_argument("--fail-on-regression", action="store_true",
                   help="exit 4 when a metric regressed beyond the noise of the previous runs")
    add_regression_flags(c)

    pl = sub.add_parser("plan", help="show every cell, its counts and estimated duration, without running")
    pl.add_argument("--spec", default="smoke", help="spec YAML path or preset name (default: smoke)")
    pl.add_argument("--configs", default=None, help="comma-separated configuration names (default: all)")
    pl.add_argument("--json", action="store_true", help="print a JSON list of cells")

    r = sub.add_parser("report", help="re-render report.md and report.html from a results directory or MLflow run")
    r.add_argument("results_dir", nargs="?", help="a results directory written by compare")
    r.add_argument("--run-id", default=None, help="an MLflow comparison run id instead of a directory")
    r.add_argument("--tracking-uri", default=None, help="MLflow tracking URI of --run-id (default: local store)")
    r.add_argument("--out", default=None, help="where --run-id's results go (default: results/<run name>)")

    h = sub.add_parser("history", help="a metric over the past runs of a spec, and whether the newest is noise")
    h.add_argument("--spec", required=True, help="spec name (e.g. smoke, pd-text)")
    h.add_argument("--target", choices=["sim", "kubernetes"], default="sim", help="target of the runs (default: sim)")
    h.add_argument("--metric", default="itl_p99_ms", help="cell metric (default: itl_p99_ms)")
    h.add_argument("--config", default=None, help="configuration name (default: all)")
    h.add_argument("--workload", default=None, help="workload, e.g. 8192/128 (default: all)")
    h.add_argument("--concurrency", type=int, default=None, help="concurrency (default: all)")
    h.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: local store)")
    h.add_argument("--experiment", default="epdbench", help="MLflow experiment (default: epdbench)")
    add_regression_flags(h)

    v = sub.add_parser("verify-transport", help="which KV transport did these pod logs really use?")
    v.add_argument("logs", nargs="+", help="one log file per KV pod (Prefill and Decode)")
    v.add_argument("--expect", required=True, choices=["tcp", "rdma"], help="the transport the deployment asked for")
    v.add_argument("--json", action="store_true", help="print transport.json instead of text")

    m = sub.add_parser("manifests", help="render and validate the Kubernetes manifests of configurations")
    m.add_argument("--spec", default="smoke", help="spec YAML path or preset name (default: smoke)")
    m.add_argument("--config", default=None, help="configuration name (default: every configuration)")
    m.add_argument("--out", required=True, help="directory; one sub-folder of YAML files per configuration")
    m.add_argument("--namespace", default=None, help="namespace written into the objects (default: spec's)")
    m.add_argument("--run", default="preview", help="value of the epdbench/run label (default: preview)")

    k = sub.add_parser("cleanup", help="delete every Kubernetes object of a run (leftovers of a crashed run)")
    k.add_argument("--run", required=True, help="run id: the epdbench/run label, printed by compare")
    add_kube_flags(k)

    u = sub.add_parser("up", help="start Prefect, MLflow and the epdbench deployments on this machine")
    u.add_argument("--host", default="127.0.0.1", help="bind address (default: 127.0.0.1)")
    u.add_argument("--prefect-port", type=int, default=4200)
    u.add_argument("--mlflow-port", type=int, default=5000)
    u.add_argument("--data-dir", default=".epdbench", help="stores and logs (default: .epdbench)")
    u.add_argument("--nightly-cron", default="0 2 * * *", help="schedule of nightly-comparison (default: 02:00)")
    u.add_argument("--timezone", default="UTC", help="time zone of the schedule (default: UTC)")
    u.add_argument("--nightly-preset", default="smoke", choices=["smoke", "pd-text", "epd-multimodal", "epd-reuse"])

    d = sub.add_parser("down", help="stop what 'epdbench up' started")
    d.add_argument("--data-dir", default=".epdbench")

    y = sub.add_parser("sync", help="upload a results directory to MLflow (after MLflow was unreachable)")
    y.add_argument("run", help="results/RUN or a results path")
    y.add_argument("--tracking-uri", default=None, help="MLflow tracking URI (default: $MLFLOW_TRACKING_URI or "
                                                        "the local store)")

    s = sub.add_parser("sim", help="serve one simulated role replica (used by the sim target)")
    s.add_argument("args", nargs=argparse.REMAINDER)
    return p


def add_regression_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--history-runs", type=int, default=None, metavar="N",
                        help="past runs that form the noise band (default: 10)")
    parser.add_argument("--noise-k", type=float, default=None, metavar="K",
                        help="band half-width in robust standard deviations, 1.4826·MAD (default: 4)")


def regression_settings(args):
    """RegressionSettings from --history-runs / --noise-k; bad values are one line."""
    from pydantic import ValidationError

    from epdbench.analysis.regression import RegressionSettings

    given = {"last_n": args.history_runs, "k": args.noise_k}
    given = {k: v for k, v in given.items() if v is not None}
    if "last_n" in given:
        given["min_history"] = min(RegressionSettings().min_history, given["last_n"])
    try:
        return RegressionSettings(**given)
    except ValidationError as e:
        err = e.errors()[0]
        flag = {"last_n": "--history-runs", "k": "--noise-k"}.get(str(err["loc"][0]) if err["loc"] else "", "")
        raise CliError(f"{flag or 'regression settings'}: {err['msg']}") from None


def add_kube_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--kube-context", default=None, help="kubeconfig context (default: the current one)")
    parser.add_argument("--namespace", default=None, help="namespace of the objects (default: spec's, epdbench)")
    parser.add_argument("--kubeconfig", default=None, help="kubeconfig path (default: $KUBECONFIG, ~/.kube/config)")


KUBE_FLAGS = {"kube_context": "context", "namespace": "namespace", "kubeconfig": "kubeconfig", "keep": "keep"}


def kube_overrides(args) -> dict:
    """Kubernetes target settings given as flags: {spec field: value}."""
    return {field: getattr(args, flag) for flag, field in KUBE_FLAGS.items()
            if getattr(args, flag, None) not in (None, False)}


def with_target(spec, kind: str, overrides: dict, source: str):
    """The spec on the chosen target with the command line's Kubernetes settings, validated again."""
    from epdbench.specs.models import SpecError, parse_spec

    if overrides and kind != "kubernetes":
        flag = next(f for f, field in KUBE_FLAGS.items() if field in overrides)
        raise SpecError(f"--{flag.replace('_', '-')}: applies to --target kubernetes only")
    data = spec.model_dump(mode="json")
    data["target"]["kind"] = kind
    data["target"]["kubernetes"].update(overrides)
    return parse_spec(data, source)


def check_kubeconfig(target) -> None:
    from epdbench.specs.models import SpecError
    from epdbench.tasks.k8s_api import kubeconfig_paths

    if not any(p.exists() for p in kubeconfig_paths(target)) and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise SpecError(f"--kubeconfig: {target.kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'} "
                        "not found: give the kubeconfig of the cluster")


def load_compare_spec(args):
    from epdbench.specs.models import SpecError, load_spec, select_configurations

    spec = load_spec(args.spec)
    spec = with_target(spec, args.target or spec.target.kind, kube_overrides(args), args.spec)
    if spec.target.kind == "kubernetes":
        check_kubeconfig(spec.target.kubernetes)
    updates: dict = {}
    if args.seed is not None:
        if args.seed < 0:
            raise SpecError("--seed: must be >= 0")
        updates["seed"] = args.seed
    tracking = spec.tracking
    if args.experiment:
        tracking = tracking.model_copy(update={"experiment": args.experiment})
    if args.tracking_uri:
        tracking = tracking.model_copy(update={"tracking_uri": args.tracking_uri})
    updates["tracking"] = tracking
    spec = spec.model_copy(update=updates)
    configs = [x.strip() for x in args.configs.split(",") if x.strip()] if args.configs else None
    spec = select_configurations(spec, configs)
    check_keep_fits(spec)
    return spec


def check_keep_fits(spec) -> None:
    """Kept configurations stay side by side on the GPU node: they must fit together."""
    from epdbench.specs.models import SpecError

    gpus = sum(c.gpus for c in spec.configurations)
    if spec.target.kind == "kubernetes" and spec.target.kubernetes.keep and gpus > spec.hardware.gpus_per_node:
        raise SpecError(f"--keep: the configurations kept side by side need {gpus} GPUs, the node has "
                        f"{spec.hardware.gpus_per_node}; pick fewer with --configs")


def results_dir_of(run: str) -> Path:
    path = Path(run) if Path(run).is_dir() else Path("results") / run
    if not (path / "spec.yaml").exists():
        raise CliError(f"{run}: no results directory with a spec.yaml (looked in {path})")
    return path


def cmd_compare(args) -> int:
    out = args.out
    if args.resume:
        rdir = results_dir_of(args.resume)
        if args.out and Path(args.out).resolve() != rdir.resolve():
            raise CliError("--out and --resume name different directories; give one of them")
        out = str(rdir)
        args.spec = str(rdir / "spec.yaml")
    spec = load_compare_spec(args)
    if not args.resume and out and Path(out).exists() and any(Path(out).iterdir()):
        raise CliError(f"--out {out}: directory exists and is not empty; choose a new one or --resume it")
    settings = regression_settings(args)
    quiet_defaults()
    from epdbench.flows.compare import INTERRUPTED, compare
    from epdbench.reports.terminal import print_summary

    def on_sigint(signum, frame):
        INTERRUPTED.set()
        signal.default_int_handler(signum, frame)

    signal.signal(signal.SIGINT, on_sigint)

    outcome = compare(spec, out_dir=out, tracking_uri=args.tracking_uri, trigger="cli",
                      run_name=Path(out).name if args.resume else None, resume=bool(args.resume),
                      regression=settings)
    print_summary(outcome)
    if not outcome["all_verified"]:
        return EXIT_FAILURES
    regressed = outcome["regression"].get("overall", {}).get("regressions", 0)
    return EXIT_REGRESSION if args.fail_on_regression and regressed else EXIT_OK


def cmd_manifests(args) -> int:
    from epdbench.manifests.render import (DEFAULT_SCHEMA_VERSION, ManifestError, manifest_files, render_manifests,
                                  validate_manifests)
    from epdbench.specs.models import load_spec

    spec = with_target(load_spec(args.spec), "kubernetes", kube_overrides(args), args.spec)
    names = [c.name for c in spec.configurations]
    if args.config and args.config not in names:
        raise CliError(f"--config {args.config}: not in this spec; it has {', '.join(names)}")
    version = spec.target.kubernetes.version or DEFAULT_SCHEMA_VERSION
    for config in spec.configurations:
        if args.config and config.name != args.config:
            continue
        objects = render_manifests(spec, config, args.run)
        try:
            validate_manifests(objects, version)
        except ManifestError as e:
            raise CliError(f"{config.name}: {e}") from None
        out = Path(args.out) / config.name
        out.mkdir(parents=True, exist_ok=True)
        for name, text in manifest_files(objects).items():
            (out / name).write_text(text)
        print(f"{out}/: {len(objects)} objects, {config.gpus} GPUs, valid for Kubernetes {version}")
    return EXIT_OK


def cmd_cleanup(args) -> int:
    from pydantic import ValidationError

    from epdbench.specs.models import KubernetesTargetSpec, describe_validation_error
    from epdbench.tasks.k8s_api import KubeApiError
    from epdbench.tasks.k8s_target import cleanup

    try:
        target = KubernetesTargetSpec(**kube_overrides(args))
    except ValidationError as e:
        raise CliError(describe_validation_error(e, "cleanup")) from None
    try:
        found, left = cleanup(target, args.run)
    except KubeApiError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_FAILURES
    print(f"run {args.run} in namespace {target.namespace}: {found} objects found, {found - len(left)} gone"
          + (f"; still there: {', '.join(left)}" if left else ""))
    return EXIT_FAILURES if left else EXIT_OK


def cmd_plan(args) -> int:
    import json

    from epdbench.specs.models import load_spec, select_configurations
    from epdbench.analysis.plan import plan, total_seconds

    spec = load_spec(args.spec)
    configs = [x.strip() for x in args.configs.split(",") if x.strip()] if args.configs else None
    spec = select_configurations(spec, configs)
    rows = plan(spec)
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'config':<12} {'suite':<12} {'workload':<22} {'conc':>4} {'stream':<14} {'warm':>4} {'meas':>5} "
          f"{'prompts':<16} {'est s':>7}")
    for r in rows:
        print(f"{r['config']:<12} {r['suite']:<12} {r['workload']:<22} {r['concurrency']:>4} {r['stream']:<14} "
              f"{r['n_warmup']:>4} {r['n_measured']:>5} {r['prompt_set_hash']:<16} {r['est_seconds']:>7.1f}")
    total = total_seconds(spec, rows)
    print(f"{len(rows)} cells × {spec.trials} trial(s); estimated {total / 60:.1f} min on the simulator "
          f"(cost model; real hardware differs)")
    return EXIT_OK


def cmd_report(args) -> int:
    """Re-render report.md, report.html and plots/ from a results directory or an MLflow comparison run."""
    from epdbench.tasks.report_files import ResultsError, download_comparison, rerender

    if bool(args.results_dir) == bool(args.run_id):
        raise CliError("report: give a results directory or --run-id, not both or neither")
    try:
        if args.run_id:
            quiet_defaults()
            rdir = download_comparison(tracking_uri_of(args), args.run_id, Path(args.out) if args.out else None)
        else:
            rdir = Path(args.results_dir)
        paths = rerender(rdir)
    except ResultsError as e:
        raise CliError(str(e)) from None
    for path in paths:
        print(path)
    return EXIT_OK


def tracking_uri_of(args) -> str:
    from epdbench.tasks.tracking import default_tracking_uri

    return args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()


def cmd_history(args) -> int:
    """Print one metric over the past runs of a spec (oldest first) and where the newest stands."""
    from epdbench.analysis.metrics import METRIC_KEYS
    from epdbench.reports.trend import select, trend_lines
    from epdbench.tasks.history import cell_history, experiment_id, mlflow_client

    if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,60}", args.spec):
        raise CliError(f"--spec {args.spec}: not a spec name (lowercase letters, digits and dashes, e.g. pd-text)")
    if args.metric not in METRIC_KEYS:
        raise CliError(f"--metric {args.metric}: not a cell metric; choose one of {', '.join(METRIC_KEYS)}")
    settings = regression_settings(args)
    quiet_defaults()
    client = mlflow_client(tracking_uri_of(args))
    exp_id = experiment_id(client, args.experiment)
    if exp_id is None:
        raise CliError(f"--experiment {args.experiment}: not in {tracking_uri_of(args)}; give --tracking-uri "
                       "or --experiment of your runs")
    history = cell_history(client, exp_id, args.spec, args.target, settings.last_n + 1)
    if history.empty:
        raise CliError(f"--spec {args.spec}: no comparison runs on target {args.target} in experiment "
                       f"{args.experiment}")
    for line in trend_lines(select(history, args.config, args.workload, args.concurrency), args.metric, settings):
        print(line)
    return EXIT_OK


def cmd_up(args) -> int:
    quiet_defaults()
    from epdbench.tasks.services import up
    return up(args.host, args.prefect_port, args.mlflow_port, Path(args.data_dir), args.nightly_cron,
              args.timezone, args.nightly_preset)


def cmd_down(args) -> int:
    from epdbench.tasks.services import down
    return down(Path(args.data_dir))


def cmd_sync(args) -> int:
    quiet_defaults()
    from epdbench.tasks.publish import sync_results
    rdir = results_dir_of(args.run)
    print(sync_results(rdir, args.tracking_uri))
    return EXIT_OK


def cmd_verify_transport(args) -> int:
    """Exit 0 only when the logs prove the expected transport carried the KV."""
    import json

    from epdbench.analysis.evidence import transport_of_pod, verify_transport
    from epdbench.tasks.evidence import iter_lines

    missing = [p for p in args.logs if not Path(p).is_file()]
    if missing:
        raise CliError(f"verify-transport: no such log file: {missing[0]}")
    pods = {Path(p).name: transport_of_pod(iter_lines(Path(p))) for p in args.logs}
    result = verify_transport(args.expect, pods)
    if args.json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(f"{result['verdict']}: " + "; ".join(result["reasons"]))
        for name, pod in pods.items():
            devices = ", ".join(f"{d['name']} (LID {d['lid']})" for d in pod["rdma_devices"]) or "none"
            print(f"  {name}: installed {pod['observed'] or '?'}, HCAs {pod['hcas']}, RDMA devices {devices}, "
                  f"{len(pod['throughput_mb_s'])} throughput windows, ready ACKs {pod['ready_acks_received']}")
    return EXIT_OK if result["verdict"] == "verified" else EXIT_FAILURES


def terminate_children(grace_s: float = 5.0) -> None:
    """SIGTERM every direct child process still running, then SIGKILL what remains after grace_s."""
    import time

    def children() -> list[int]:
        out = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                out.append(int(stat.parent.name))
        return out

    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = children()
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace_s
        while pids and time.monotonic() < deadline:
            for pid in list(pids):
                try:
                    if os.waitpid(pid, os.WNOHANG)[0]:
                        pids.remove(pid)
                except ChildProcessError:
                    pids.remove(pid)
            time.sleep(0.1)
        if not pids:
            return


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["sim"]:
        from epdbench.sim.server import main as sim_main
        return sim_main(argv[1:])
    try:
        args = build_parser().parse_args(argv)
        if args.command == "compare":
            return cmd_compare(args)
        if args.command == "report":
            return cmd_report(args)
        if args.command == "history":
            return cmd_history(args)
        if args.command == "plan":
            return cmd_plan(args)
        if args.command in ("up", "down", "sync"):
            return {"up": cmd_up, "down": cmd_down, "sync": cmd_sync}[args.command](args)
        if args.command == "verify-transport":
            return cmd_verify_transport(args)
        if args.command == "manifests":
            return cmd_manifests(args)
        if args.command == "cleanup":
            return cmd_cleanup(args)
    except CliError as e:
        print(f"error: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        # Teardown already ran in the flow's finally blocks; stop any straggler (simulator processes,
        # Prefect's temporary server), then leave without waiting on background threads, which can hang
        # once their server is gone.
        from epdbench.tasks.sim_target import stop_all
        stop_all()
        terminate_children()
        print("interrupted: every started process was stopped", file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(130)
    except Exception as e:  # noqa: BLE001
        from epdbench.specs.models import SpecError
        if isinstance(e, SpecError):
            print(f"error: {e}", file=sys.stderr)
            return EXIT_BAD_INPUT
        raise
    return EXIT_BAD_INPUT


if __name__ == "__main__":
    sys.exit(main())
