"""Provision a configuration as real vLLM engines on this host: one OpenAI-server process per role replica
(`PYTHON -m vllm.entrypoints.openai.api_server`, vLLM's own interpreter), the real vllm-router in front (PD mode
with the configuration's KV connector) or epdbench's own proxy, all on loopback ports: NIXL's side channels and
Mooncake prefills' bootstrap servers each on its own. The command lines come from specs/commands.py, as the
manifests' do; process start, readiness, log capture and teardown are the simulator target's
(tasks/proc/processes.py)."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from epdbench.analysis.gpu_telemetry import TELEMETRY_FILE
from epdbench.specs.commands import (BUILTIN_ROUTER_MODULE, VLLM_SERVER_MODULE,
                                     builtin_router_args, kv_log_interval_s, local_cpu_binds, local_engine_args,
                                     local_engine_env, local_gpus, moves_kv, otlp_engine_args, otlp_engine_env,
                                     starts_together, vllm_logging_config, vllm_router_args)
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.tasks.deployment import Deployment, Process, ProvisionError
from epdbench.tasks.local.engine_env import EngineEnvError, default_env_dir, env_python, vllm_version
from epdbench.tasks.local.model_files import ModelFilesError, made_model_folder
from epdbench.tasks.local.nvml import start_sampler
from epdbench.tasks.proc.processes import (free_port, port_taken, private_port_block, router_binary,
                                           serve_through_router, spawn, stop_deployment, wait_healthy)
from epdbench.tasks.local.wheelhouse_pins import DEFAULT_VENV

STOP_GRACE_S = 30               # vLLM shuts its engine core down on SIGTERM; a CPU engine takes a few seconds
# A start that failed or was interrupted: vLLM's API server ignores SIGTERM until it has started (seen on its CPU
# build: profiling, compiling or loading went on to the 30 s grace), and an engine that never served has nothing
# to drain, so its group is killed after this much
STARTING_STOP_GRACE_S = 5
EC_MIN_FREE_GB = 1.0            # the encoder-output folder's filesystem: 2.9 MB per 560-px image on Qwen2.5-VL-7B
# Variables of epdbench's own environment that must not reach vLLM's interpreter: its Python's, and those that would
# choose the KV transport or hide its evidence (UCX's; Mooncake's forced transports, and MC_LOG_DIR / MC_LOG_LEVEL,
# which move its glog lines to files or drop them: mooncake-transfer-engine config.cpp).
FOREIGN_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UCX_TLS", "UCX_NET_DEVICES", "UCX_LOG_LEVEL",
               "MC_FORCE_TCP", "MC_FORCE_HCA", "MC_FORCE_SHM", "MC_FORCE_MNNVL", "MC_INTRANODE_NVLINK", "MC_LOG_DIR",
               "MC_LOG_LEVEL")


def vllm_python(spec: ExperimentSpec) -> str:
    """The engines' interpreter: the spec's (compare --vllm-python), else on device cpu the one `epdbench
    engine-env` makes, on device cuda the one the GPU bundle's install.sh makes by default."""
    local = spec.target.local
    if local.vllm_python:
        return local.vllm_python
    return str(env_python(Path(DEFAULT_VENV).expanduser() if local.device == "cuda" else default_env_dir()))


def make_engine_env(device: str) -> str:
    """The command that makes vLLM's environment for `device`, as one-line errors name it."""
    if device == "cuda":
        return ("epdbench engine-env --wheelhouse DIR on a machine with network, then DIR/install.sh on this host "
                "(docs/local-target.md)")
    return "epdbench engine-env"


def model_to_serve(spec: ExperimentSpec, run_dir: Path) -> str:
    """What the engines load: the tiny model made in the run's folder, the spec's model_path, or model.name."""
    try:
        made = made_model_folder(spec, run_dir)
    except ModelFilesError as e:
        raise ProvisionError(str(e)) from None
    return str(made) if made else spec.target.local.model_path or spec.model.name


def ec_shared_dir(spec: ExperimentSpec, config: ConfigurationSpec, run_dir: Path) -> Path:
    """EPD's encoder-output folder of this run and configuration, made empty; ProvisionError (one line) when its
    filesystem has too little room."""
    digest = hashlib.sha256(str(run_dir.resolve()).encode()).hexdigest()[:10]
    folder = Path(spec.target.local.ec_shared_dir) / f"epdbench-ec-{digest}-{config.name}"
    shutil.rmtree(folder, ignore_errors=True)
    try:
        folder.mkdir(parents=True)
        free_gb = shutil.disk_usage(folder).free / 1e9
    except OSError as e:
        raise ProvisionError(f"target.local.ec_shared_dir: cannot make {folder}: {e.strerror}") from None
    if free_gb < EC_MIN_FREE_GB:
        shutil.rmtree(folder, ignore_errors=True)
        raise ProvisionError(f"target.local.ec_shared_dir: {free_gb:.2f} GB free under "
                             f"{spec.target.local.ec_shared_dir}, less than {EC_MIN_FREE_GB:g} GB for the encoder "
                             "outputs (a container's /dev/shm is 64 MB unless --shm-size raises it): give a folder "
                             "with room")
    return folder


def vllm_cache_root(replica: str) -> Path:
    """A replica's own vLLM cache (VLLM_CACHE_ROOT) when engines start together: ~/.cache/vllm/epdbench/<replica>
    (or under $XDG_CACHE_HOME), the same for that replica of every configuration, so a later one reuses what an
    earlier one compiled."""
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache")
    return cache / "vllm" / "epdbench" / replica


def engine_environment(python: str, role_env: dict[str, str]) -> dict[str, str]:
    """epdbench's environment less what belongs to its own interpreter, vLLM's interpreter first on PATH."""
    env = {k: v for k, v in os.environ.items() if k not in FOREIGN_ENV}
    env["PATH"] = str(Path(python).parent) + os.pathsep + env.get("PATH", "")
    return {**env, **role_env}


def start(spec: ExperimentSpec, config: ConfigurationSpec, spec_path: Path, log_dir: Path,
          traces_endpoint: str | None = None) -> Deployment:
    """Start every engine and the router; return once a request served through the router. Raises ProvisionError.
    With `traces_endpoint`, every engine exports its `llm_request` spans there (OTLP over HTTP, protobuf)."""
    local = spec.target.local
    host = local.host
    python = vllm_python(spec)
    try:
        version = vllm_version(python, make=make_engine_env(local.device))
    except EngineEnvError as e:
        raise ProvisionError(f"target.local.vllm_python {e}") from None
    model = model_to_serve(spec, spec_path.parent)
    deadline = time.monotonic() + local.startup_timeout_s
    gpus = local_gpus(config, spec.shares_one_gpu)
    cpus = local_cpu_binds(config, sorted(os.sched_getaffinity(0))) if local.device == "cpu" else {}
    logging_config = spec_path.parent / "vllm-logging.json"
    logging_config.write_text(json.dumps(vllm_logging_config(version), indent=2))
    dep = Deployment(config=config.name, endpoint="", router="", kv_log_interval_s=kv_log_interval_s(config))
    try:
        if config.topology == "epd":
            dep.ec_dir = ec_shared_dir(spec, config, spec_path.parent)
        together = starts_together(spec, config)
        # starting together, an encode engine (sized by vLLM's profiling) first and alone
        for role in sorted(config.roles, key=lambda r: r.role != "encode") if together else config.roles:
            for i in range(role.replicas):
                name = f"{role.role}-{i}"
                port = free_port(host)
                kv = moves_kv(config, role.role)
                nixl = free_port(host) if kv and config.kv_connector == "nixl" else None
                bootstrap = free_port(host) if kv and config.kv_connector == "mooncake" and role.role == "prefill" \
                    else None
                cmd = [python, "-m", VLLM_SERVER_MODULE, *local_engine_args(
                    spec, config, role, model=model, port=port,
                    ec_shared_dir=str(dep.ec_dir) if dep.ec_dir else None)]
                if traces_endpoint:
                    cmd += otlp_engine_args(traces_endpoint)
                env = engine_environment(python, local_engine_env(
                    spec, config, role.role, nixl_port=nixl, gpus=gpus[name], cpus=cpus.get(name),
                    logging_config=str(logging_config), internal_port=private_port_block(host),
                    bootstrap_port=bootstrap))
                if port_taken(host, port):
                    # a vLLM engine binds its port only after its interpreter starts: another server answering
                    # /health there meanwhile would pass for it
                    raise ProvisionError(f"{name}: port {port} on {host} was taken by another process before the "
                                         "engine started; run again")
                if traces_endpoint:
                    env.update(otlp_engine_env(role.role, name))
                if together:
                    # each its own compile cache: two engines of one model compiling the same graphs at once would
                    # write the same files of vLLM's cache (VLLM_CACHE_ROOT/torch_compile_cache/<hash>/rank_0_0)
                    env["VLLM_CACHE_ROOT"] = str(vllm_cache_root(name))
                url = f"http://{host}:{port}"
                log = log_dir / f"{name}.log"
                proc = spawn(cmd, log, env, f"{config.name}/{name}")
                dep.processes.append(Process(name, role.role, url, log, proc, metrics_url=url + "/metrics",
                                             bootstrap_port=bootstrap))
                if spec.shares_one_gpu and not (together and role.role != "encode"):
                    # one at a time, unless sized beforehand (start_together): vLLM's memory profiling fails when
                    # another process on its GPU frees memory meanwhile ("Error in memory profiling"), and
                    # miscounts what another allocates
                    wait_healthy([dep.processes[-1]], deadline, interval_s=1.0)
        wait_healthy(list(dep.processes), deadline, interval_s=1.0)
        dep.router = "epdbench-proxy" if builtin_router(spec, config) else "vllm-router"
        served = serve_through_router(dep, *router_command(spec, config, list(dep.processes), deadline), log_dir,
                                      f"{config.name}/router", spec.model.name, deadline)
        if local.device == "cuda":
            dep.telemetry, dep.telemetry_note = start_sampler(
                sorted({i for ids in gpus.values() for i in ids}),
                log_dir / TELEMETRY_FILE)
        return served
    except BaseException:
        stop(dep, STARTING_STOP_GRACE_S)
        raise


def builtin_router(spec: ExperimentSpec, config: ConfigurationSpec) -> bool:
    return config.topology == "epd" or spec.target.local.router == "builtin"


def router_command(spec: ExperimentSpec, config: ConfigurationSpec, engines: list[Process],
                   deadline: float) -> tuple[list[str], dict, str, str]:
    """The router's command line, environment, URL and metrics URL: vllm-router, or epdbench's own proxy for EPD
    (vllm-router has no encode stage) and with target.local.router builtin."""
    host = spec.target.local.host
    router_port = free_port(host)
    url = f"http://{host}:{router_port}"
    if builtin_router(spec, config):
        cmd = [sys.executable, "-P", "-m", BUILTIN_ROUTER_MODULE,   # -P: a checkout in the cwd shadows no module
               *builtin_router_args(host=host, port=router_port, engines=[(p.role, p.url) for p in engines],
                                    kv_connector=None if config.topology == "aggregated" else config.kv_connector,
                                    bootstrap_ports={p.url: p.bootstrap_port for p in engines if p.bootstrap_port})]
        return cmd, {**os.environ, "PYTHONUNBUFFERED": "1"}, url, url + "/metrics"
    prom_port = free_port(host)
    cmd = [router_binary("pip install vllm-router (epdbench's own environment)"), *vllm_router_args(
        config, host=host, port=router_port, prometheus_port=prom_port,
        startup_timeout_s=max(1.0, deadline - time.monotonic()), servers=[p.url for p in engines],
        prefills=[(p.url, p.bootstrap_port or 0) for p in engines if p.role == "prefill"],
        decodes=[p.url for p in engines if p.role == "decode"])]
    return cmd, dict(os.environ), url, f"http://{host}:{prom_port}/metrics"


def stop(dep: Deployment, grace_s: float = STOP_GRACE_S) -> None:
    """Stop the router first, then the engines (each with its engine core) within `grace_s` of SIGTERM, then remove
    EPD's encoder-output folder; never raises."""
    if dep.telemetry is not None:
        dep.telemetry.stop()
    stop_deployment(dep, grace_s=grace_s)
    if dep.ec_dir is not None:
        shutil.rmtree(dep.ec_dir, ignore_errors=True)
