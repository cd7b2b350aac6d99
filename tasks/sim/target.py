"""Provision a configuration on the embedded simulator: one local process per role replica plus
a router, on free loopback ports; tear everything down, always."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from epdbench.specs.commands import MOONCAKE_RPC_PORTS, vllm_router_args
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.tasks.deployment import Deployment, Process
from epdbench.tasks.proc.processes import (ISSUED_PORTS, free_port, private_port_block, router_binary,
                                           serve_through_router, spawn, stop_all, stop_deployment, wait_healthy)

__all__ = ["ISSUED_PORTS", "free_port", "start", "stop", "stop_all"]


def rpc_ports(host: str) -> dict[str, str]:
    """A replica's genuine Mooncake transfer engine's RPC ports (MC_MIN_RPC_PORT..MC_MAX_RPC_PORT) in a block of
    its own: by default the engine binds one of 15000-17000, among the ports free_port hands out and another
    replica binds later — a health check once reached a prefill's transfer engine there, which read `GET /hea` as
    a length and exited (`readString: too large length from socket`). None where no block is left (its default)."""
    block = private_port_block(host)
    if block is None:
        return {}
    return {"MC_MIN_RPC_PORT": str(block + MOONCAKE_RPC_PORTS[0]), "MC_MAX_RPC_PORT": str(block + MOONCAKE_RPC_PORTS[1])}


def start(spec: ExperimentSpec, config: ConfigurationSpec, spec_path: Path, log_dir: Path,
          traces_endpoint: str | None = None) -> Deployment:
    """Start every role replica and the router; return once all serve. Raises ProvisionError. With
    `traces_endpoint` (OTLP/HTTP), the replicas and the built-in proxy export their spans of traced requests
    there (sim.spans); vllm-router passes the traceparent on unchanged and exports nothing we receive."""
    sim = spec.target.sim
    host = sim.host
    # Mooncake's own knobs: metrics windows on, every second so short suites still log transfer activity.
    env = {"MC_TE_METRIC_INTERVAL_SECONDS": "1", **os.environ, "MC_TE_METRIC": "1", "PYTHONUNBUFFERED": "1"}
    if config.kv_transport == "tcp":
        env["MC_FORCE_TCP"] = "1"   # as on a cluster: Mooncake would pick RDMA by itself if it found HCAs
    else:
        env.pop("MC_FORCE_TCP", None)
    env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    if traces_endpoint:
        env["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"] = traces_endpoint
    procs: list[Process] = []
    bootstrap: dict[str, int] = {}
    deadline = time.monotonic() + sim.startup_timeout_s
    dep = Deployment(config=config.name, endpoint="", router="")
    if config.topology != "aggregated":   # sim.server logs both connectors' windows at Mooncake's interval
        dep.kv_log_interval_s = float(env["MC_TE_METRIC_INTERVAL_SECONDS"])
    dep.processes = procs    # filled as they start: a failure half-way stops the ones started
    try:
        for role in config.roles:
            for i in range(role.replicas):
                port = free_port(host)
                name = f"{role.role}-{i}"
                cmd = [sys.executable, "-P", "-m", "epdbench.sim.server", "--spec", str(spec_path), "--config", config.name,
                       "--role", role.role, "--replica", str(i), "--host", host, "--port", str(port)]
                if role.role == "prefill":
                    bootstrap[name] = free_port(host)
                    cmd += ["--bootstrap-port", str(bootstrap[name])]
                url = f"http://{host}:{port}"
                log = log_dir / f"{name}.log"
                procs.append(Process(name, role.role, url, log, spawn(cmd, log, {**env, **rpc_ports(host)},
                                                                      f"{config.name}/{name}"),
                                     metrics_url=url + "/metrics"))
        wait_healthy(procs, deadline)
        router_port = free_port(host)
        skip = sim.faults.skip_prefill_fraction if config.topology != "aggregated" else 0.0
        use_vllm_router = sim.router == "vllm-router" and config.topology != "epd" and not skip
        router_metrics = None
        if use_vllm_router:
            prom_port = free_port(host)
            router_metrics = f"http://{host}:{prom_port}/metrics"
            cmd = [router_binary(), *vllm_router_args(
                config, host=host, port=router_port, prometheus_port=prom_port,
                startup_timeout_s=sim.startup_timeout_s, servers=[p.url for p in procs],
                prefills=[(p.url, bootstrap[p.name]) for p in procs if p.role == "prefill"],
                decodes=[p.url for p in procs if p.role == "decode"])]
            dep.router = "vllm-router"
        else:
            cmd = [sys.executable, "-P", "-m", "epdbench.sim.proxy", "--host", host, "--port", str(router_port)]
            for p in procs:
                cmd += [f"--{p.role}", p.url]
            if skip:
                cmd += ["--fault-skip-prefill", str(skip), "--fault-seed", str(spec.seed)]
            dep.router = "epdbench-proxy" + (f" (fault: skip prefill {skip:.0%})" if skip else "")
        router_url = f"http://{host}:{router_port}"
        return serve_through_router(dep, cmd, env, router_url, router_metrics or router_url + "/metrics", log_dir,
                                    f"{config.name}/router", spec.model.name, deadline)
    except BaseException:
        stop(dep)
        raise


def stop(dep: Deployment) -> None:
    """Stop the router first, then the simulator processes; never raises."""
    stop_deployment(dep)
