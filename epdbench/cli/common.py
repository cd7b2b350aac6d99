"""What every command shares: one-line errors, quiet defaults, the spec as the command line amends it."""
from __future__ import annotations

import argparse
import errno
import math
import os
import re
from pathlib import Path

EXIT_OK, EXIT_BAD_INPUT, EXIT_FAILURES, EXIT_REGRESSION = 0, 2, 3, 4
EXIT_UNPUBLISHED = 5    # every result is kept in the folder, but MLflow could not take it: `epdbench sync`
EXIT_NO_SPACE = 6       # the results folder could not be written (disk full or I/O error)
NO_SPACE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)   # what EXIT_NO_SPACE answers
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: processes stopped, finished records kept; resume later

# For the line printed on interrupt: "dir", the results folder of the comparison running in this process (to
# resume); "note", what another command kept.
INTERRUPTED_RUN: dict[str, str] = {}


def quiet_defaults() -> None:
    """Telemetry off and a start-up timeout that fits small machines, unless the user set them."""
    for k, v in {
        "DO_NOT_TRACK": "true",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "MLFLOW_DISABLE_TELEMETRY": "true",
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "90",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "MLFLOW_LOGGING_LEVEL": "WARNING",             # no "Creating initial database tables" among our lines
        "MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT": "true",   # no "🏃 View run … at: …" per run: we print the link once
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
    try:
        return parse_spec(data, source)
    except SpecError as e:
        raise SpecError(f"{e}{local_spec_hint(kind, data['target']['local']['device'], source)}") from None


def local_spec_hint(kind: str, device: str, source: str) -> str:
    """What to run instead when a spec does not fit real engines on CPU: the preset made for them."""
    if kind != "local" or device != "cpu" or Path(source).stem == "cpu-tiny":
        return ""
    return "; for real engines on CPU take --spec cpu-tiny, the preset made for them"


def check_kubeconfig(target) -> None:
    from epdbench.specs.models import SpecError
    from epdbench.tasks.k8s.api import kubeconfig_paths

    if not any(p.exists() for p in kubeconfig_paths(target)) and not os.environ.get("KUBERNETES_SERVICE_HOST"):
        raise SpecError(f"--kubeconfig: {target.kubeconfig or os.environ.get('KUBECONFIG') or '~/.kube/config'} "
                        "not found: give the kubeconfig of the cluster")


def gpu_hour_usd_of(args) -> float | None:
    """`--gpu-hour-usd` (compare, report), or None; CliError (one line) for a price that is not a number >= 0."""
    price = getattr(args, "gpu_hour_usd", None)
    if price is not None and not (math.isfinite(price) and price >= 0):
        raise CliError(f"--gpu-hour-usd {price:g}: give the price of one GPU-hour in USD, 0 or more (e.g. 2.5)")
    return price


def load_compare_spec(args) -> tuple:
    """The spec `compare` runs, with the command line's overrides and --profile's constants; and that profile
    (None without --profile)."""
    from epdbench.specs.budget import resolve_gpu_budget
    from epdbench.specs.models import SpecError, load_spec, parse_spec, select_configurations

    spec = load_spec(args.spec)
    profile = None
    spec = with_target(spec, args.target or spec.target.kind, kube_overrides(args), args.spec)
    if getattr(args, "clock", None):
        if spec.target.kind != "sim":
            raise SpecError(f"--clock {args.clock}: applies to --target sim only (real engines and clusters run in "
                            "real time)")
        data = spec.model_dump(mode="json")
        data["target"]["sim"]["clock"] = args.clock
        spec = parse_spec(data, args.spec)
    vllm_python = getattr(args, "vllm_python", None)
    if vllm_python and spec.target.kind != "local":
        raise SpecError(f"--vllm-python: applies to --target local only (this run's target is {spec.target.kind})")
    if spec.target.kind == "local" and vllm_python:
        data = spec.model_dump(mode="json")
        data["target"]["local"]["vllm_python"] = vllm_python
        spec = parse_spec(data, args.spec)
    if spec.target.kind in ("kubernetes", "local"):
        if getattr(args, "profile", None):
            raise CliError("--profile: a calibration profile sets the simulator's physics; it does not apply to "
                           f"--target {spec.target.kind}")
        if spec.target.kind == "kubernetes":
            check_kubeconfig(spec.target.kubernetes)
    elif getattr(args, "profile", None):
        from epdbench.specs.profile import apply_profile, load_profile
        profile = load_profile(args.profile)
        spec = apply_profile(spec, profile)
    updates: dict = {}
    if args.seed is not None:
        if args.seed < 0:
            raise SpecError("--seed: must be >= 0")
        updates["seed"] = args.seed
    price = gpu_hour_usd_of(args)
    if price is not None:
        updates["cost"] = spec.cost.model_copy(update={"gpu_hour_usd": price})
    tracking = spec.tracking
    if args.experiment:
        tracking = tracking.model_copy(update={"experiment": args.experiment})
    if args.tracking_uri:
        tracking = tracking.model_copy(update={"tracking_uri": args.tracking_uri})
    updates["tracking"] = tracking
    spec = spec.model_copy(update=updates)
    spec = select_configurations(spec, config_names(args.configs))
    spec = resolve_gpu_budget(spec, getattr(args, "gpu_budget", None), "--gpu-budget")   # the configurations run
    check_keep_fits(spec)
    if spec.target.kind == "local":
        check_local_target(spec)
    return spec, profile


def check_local_target(spec) -> None:
    """Before anything starts: tokenizers for the tiny model, vllm-router, an engine interpreter that imports vllm
    (one line naming what lacks and the command that supplies it)."""
    from epdbench.tasks.local.preflight import PreflightError, preflight_local

    try:
        preflight_local(spec)
    except PreflightError as e:
        raise CliError(str(e)) from None


def config_names(value: str | None, flag: str = "--configs") -> list[str] | None:
    """The configuration names of a comma-separated flag; None when the flag is not given (all of them). A
    value that names none (`,` or blank) is bad input, never read as "all"."""
    if value is None:
        return None
    names = [x.strip() for x in value.split(",") if x.strip()]
    if not names:
        raise CliError(f"{flag} {value!r}: names no configuration; give comma-separated names (e.g. "
                       "aggregated,pd-tcp), or leave the flag out for all")
    return names


def check_out_dir(out: str, flag: str = "--out") -> None:
    """A results directory that can be made (or is there): not a file, not below a file, writable — said in
    one line before anything starts."""
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise CliError(f"{flag} {out}: is a file, not a directory; choose a directory")
    base = next((p for p in (path, *path.parents) if p.exists()), Path("."))
    if not base.is_dir():
        raise CliError(f"{flag} {out}: {base} is a file, so no directory can be made below it; choose another path")
    if not os.access(base, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {out}: {base} is not writable; choose a directory you can write")


def check_keep_fits(spec) -> None:
    """Kept configurations stay side by side on the GPU node: they must fit together."""
    from epdbench.specs.models import SpecError

    gpus = sum(c.gpus for c in spec.configurations)
    if spec.target.kind == "kubernetes" and spec.target.kubernetes.keep and gpus > spec.hardware.gpus_per_node:
        raise SpecError(f"--keep: the configurations kept side by side need {gpus} GPUs, the node has "
                        f"{spec.hardware.gpus_per_node}; pick fewer with --configs")


def results_dir_of(run: str) -> Path:
    """A run's results folder: RUN as a path when it is one or has a folder in it, else results/RUN."""
    path = Path(run) if Path(run).is_dir() or len(Path(run).parts) > 1 else Path("results") / run
    if not (path / "spec.yaml").exists():
        raise CliError(f"{run}: no results directory with a spec.yaml (looked in {path})")
    return path


def tracking_uri_of(args) -> str:
    from epdbench.tasks.publishing.tracking import default_tracking_uri

    return args.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()




POOL_FLAGS = ("image", "advertise", "results_claim")


def pool_settings(args, target):
    """The work pool's settings from `--work-pool` and its flags, and the Kubernetes target `target`
    (namespace, access, runner image); a missing or malformed one is a CliError naming the flag."""
    import ipaddress

    from epdbench.manifests.workpool import PoolSettings

    if not args.work_pool:
        given = [f for f in POOL_FLAGS if getattr(args, f, None)]
        if given or getattr(args, "worker", "here") != "here":
            flag = given[0] if given else "worker"
            raise CliError(f"--{flag.replace('_', '-')}: applies with --work-pool only")
        return None
    if not args.advertise:
        raise CliError("--work-pool needs --advertise ADDRESS: an address of this machine that the cluster's "
                       "pods reach (Prefect's and MLflow's URLs are built from it)")
    if not re.fullmatch(r"[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\]", args.advertise):
        raise CliError(f"--advertise {args.advertise}: give a host name or IP address, without scheme or port")
    try:
        if ipaddress.ip_address(args.advertise.strip("[]")).is_loopback:
            raise CliError(f"--advertise {args.advertise}: a loopback address; the cluster's pods cannot reach it")
    except ValueError:
        if args.advertise == "localhost":
            raise CliError("--advertise localhost: the cluster's pods cannot reach it") from None
    if args.results_claim and not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", args.results_claim):
        raise CliError(f"--results-claim {args.results_claim}: not a valid PersistentVolumeClaim name")
    host = args.advertise
    return PoolSettings(image=args.image or target.runner_image, namespace=target.namespace,
                        prefect_api=f"http://{host}:{args.prefect_port}/api",
                        mlflow_uri=f"http://{host}:{args.mlflow_port}", results_claim=args.results_claim,
                        port_forward=target.access == "port-forward", dcgm_exporter=target.dcgm_exporter)
