"""Provision a configuration as real vLLM engines on this host: one OpenAI-server process per role replica
(`PYTHON -m vllm.entrypoints.openai.api_server`, vLLM's own interpreter), the real vllm-router in front (PD mode
with the configuration's KV connector), all on loopback ports. The command lines come from specs/commands.py, as the
manifests' do; process start, readiness, log capture and teardown are the simulator target's
(tasks/proc/processes.py)."""
from __future__ import annotations

import json
import os
import time
from pathlib import Path

from epdbench.specs.commands import (VLLM_LOGGING_CONFIG, VLLM_SERVER_MODULE, local_cpu_binds, local_engine_args,
                                     local_engine_env, local_gpus, moves_kv, otlp_engine_args,
                                     otlp_engine_env, vllm_router_args)
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.tasks.deployment import Deployment, Process, ProvisionError
from epdbench.tasks.local.engine_env import EngineEnvError, default_env_dir, env_python, vllm_version
from epdbench.tasks.proc.processes import (free_port, port_taken, router_binary, serve_through_router, spawn,
                                           stop_deployment, wait_healthy)
from epdbench.tasks.local.tiny_model import TinyModelError, write_tiny_model
from epdbench.tasks.local.wheelhouse_pins import DEFAULT_VENV

TINY_MODEL_DIR = "tiny-model"   # in the results folder
STOP_GRACE_S = 30               # vLLM shuts its engine core down on SIGTERM; a CPU engine takes a few seconds
# Variables of epdbench's own environment that must not reach vLLM's interpreter.
FOREIGN_ENV = ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME", "UCX_TLS", "UCX_NET_DEVICES", "UCX_LOG_LEVEL")


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
    local = spec.target.local
    if local.tiny_model:
        try:
            return str(write_tiny_model(spec.model, spec.engine.max_model_len, run_dir / TINY_MODEL_DIR))
        except TinyModelError as e:
            raise ProvisionError(str(e)) from None
    return local.model_path or spec.model.name


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
        vllm_version(python, make=make_engine_env(local.device))
    except EngineEnvError as e:
        raise ProvisionError(f"target.local.vllm_python {e}") from None
    model = model_to_serve(spec, spec_path.parent)
    deadline = time.monotonic() + local.startup_timeout_s
    gpus = local_gpus(config)
    cpus = local_cpu_binds(config, sorted(os.sched_getaffinity(0))) if local.device == "cpu" else {}
    logging_config = spec_path.parent / "vllm-logging.json"
    logging_config.write_text(json.dumps(VLLM_LOGGING_CONFIG, indent=2))
    dep = Deployment(config=config.name, endpoint="", router="")
    try:
        for role in config.roles:
            for i in range(role.replicas):
                name = f"{role.role}-{i}"
                port = free_port(host)
                nixl = free_port(host) if moves_kv(config, role.role) and config.kv_connector == "nixl" else None
                cmd = [python, "-m", VLLM_SERVER_MODULE, *local_engine_args(spec, config, role, model=model,
                                                                            port=port)]
                if traces_endpoint:
                    cmd += otlp_engine_args(traces_endpoint)
                env = engine_environment(python, local_engine_env(
                    spec, config, role.role, nixl_port=nixl, gpus=gpus[name], cpus=cpus.get(name),
                    logging_config=str(logging_config)))
                if port_taken(host, port):
                    # a vLLM engine binds its port only after its interpreter starts: another server answering
                    # /health there meanwhile would pass for it
                    raise ProvisionError(f"{name}: port {port} on {host} was taken by another process before the "
                                         "engine started; run again")
                if traces_endpoint:
                    env.update(otlp_engine_env(role.role, name))
                url = f"http://{host}:{port}"
                log = log_dir / f"{name}.log"
                proc = spawn(cmd, log, env, f"{config.name}/{name}")
                dep.processes.append(Process(name, role.role, url, log, proc, metrics_url=url + "/metrics"))
        wait_healthy(list(dep.processes), deadline, interval_s=1.0)
        router_port, prom_port = free_port(host), free_port(host)
        engines = list(dep.processes)
        cmd = [router_binary("pip install vllm-router (epdbench's own environment)"), *vllm_router_args(
            config, host=host, port=router_port, prometheus_port=prom_port,
            startup_timeout_s=max(1.0, deadline - time.monotonic()), servers=[p.url for p in engines],
            prefills=[(p.url, 0) for p in engines if p.role == "prefill"],
            decodes=[p.url for p in engines if p.role == "decode"])]
        dep.router = "vllm-router"
        return serve_through_router(dep, cmd, dict(os.environ), f"http://{host}:{router_port}",
                                    f"http://{host}:{prom_port}/metrics", log_dir, f"{config.name}/router",
                                    spec.model.name, deadline)
    except BaseException:
        stop(dep)
        raise


def stop(dep: Deployment) -> None:
    """Stop the router first, then the engines (each with its engine core); never raises."""
    stop_deployment(dep, grace_s=STOP_GRACE_S)
