"""Provision a configuration on the embedded simulator: one local process per role replica plus
a router, on free loopback ports; tear everything down, always."""
from __future__ import annotations

import atexit
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import deque
from pathlib import Path

from epdbench.specs.commands import vllm_router_args
from epdbench.specs.models import ConfigurationSpec, ExperimentSpec
from epdbench.tasks import lifeline
from epdbench.tasks.deployment import Deployment, Process, ProvisionError, exited, probe_until_served

_LIVE: set[subprocess.Popen] = set()


def stop_all() -> None:
    """Stop every process this module started and is still running (safety net)."""
    for p in list(_LIVE):
        _stop(p, grace_s=2)


atexit.register(stop_all)


ISSUED_PORTS: deque[int] = deque(maxlen=4096)   # the ports free_port handed out last, in this process


def free_port(host: str) -> int:
    """A port free now that this process has not handed out among its last 4096. A deployment picks all its ports
    before its processes bind them, and the kernel can give bind(0) the same port again meanwhile (1 in 20,000
    consecutive calls on the development VM): two processes of one deployment would then race for one port."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in ISSUED_PORTS:
            ISSUED_PORTS.append(port)
            return port
    raise ProvisionError(f"no free port on {host} that this process has not handed out already (64 tries)")


def router_binary() -> str:
    here = Path(sys.executable).parent / "vllm-router"
    found = str(here) if here.exists() else shutil.which("vllm-router")
    if not found:
        raise ProvisionError("vllm-router is not installed: pip install vllm-router, or set target.sim.router: builtin")
    return found


def _spawn(cmd: list[str], log_path: Path, env: dict, what: str) -> subprocess.Popen:
    """A replica or router in a session of its own, dying with this process, registered as `what` as it starts
    (tasks/lifeline.py)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as fh:
        p = lifeline.popen(cmd, what, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    _LIVE.add(p)
    return p


def _stop(p: subprocess.Popen, grace_s: float = 5.0) -> None:
    if p.poll() is None:
        try:
            os.killpg(p.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
        try:
            p.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=5)
    _LIVE.discard(p)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def wait_healthy(procs: list[Process], deadline: float) -> None:
    pending = list(procs)
    while pending:
        for p in list(pending):
            if p.popen.poll() is not None:
                tail = p.log_path.read_text(errors="replace").strip().splitlines()[-3:]
                raise ProvisionError(f"{p.name} exited with code {p.popen.returncode}: {' | '.join(tail)}")
            if _healthy(p.url):
                pending.remove(p)
        if pending and time.monotonic() > deadline:
            raise ProvisionError(f"not healthy in time: {', '.join(p.name for p in pending)}")
        if pending:
            time.sleep(0.2)


def start(spec: ExperimentSpec, config: ConfigurationSpec, spec_path: Path, log_dir: Path) -> Deployment:
    """Start every role replica and the router; return once all serve. Raises ProvisionError."""
    sim = spec.target.sim
    host = sim.host
    # Mooncake's own knobs: metrics windows on, every second so short suites still log transfer activity.
    env = {"MC_TE_METRIC_INTERVAL_SECONDS": "1", **os.environ, "MC_TE_METRIC": "1", "PYTHONUNBUFFERED": "1"}
    if config.kv_transport == "tcp":
        env["MC_FORCE_TCP"] = "1"   # as on a cluster: Mooncake would pick RDMA by itself if it found HCAs
    else:
        env.pop("MC_FORCE_TCP", None)
    procs: list[Process] = []
    bootstrap: dict[str, int] = {}
    deadline = time.monotonic() + sim.startup_timeout_s
    dep = Deployment(config=config.name, endpoint="", router="")
    dep.processes = procs    # filled as they start: a failure half-way stops the ones started
    try:
        for role in config.roles:
            for i in range(role.replicas):
                port = free_port(host)
                name = f"{role.role}-{i}"
                cmd = [sys.executable, "-m", "epdbench.sim.server", "--spec", str(spec_path), "--config", config.name,
                       "--role", role.role, "--replica", str(i), "--host", host, "--port", str(port)]
                if role.role == "prefill":
                    bootstrap[name] = free_port(host)
                    cmd += ["--bootstrap-port", str(bootstrap[name])]
                url = f"http://{host}:{port}"
                log = log_dir / f"{name}.log"
                procs.append(Process(name, role.role, url, log, _spawn(cmd, log, env, f"{config.name}/{name}"),
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
            cmd = [sys.executable, "-m", "epdbench.sim.proxy", "--host", host, "--port", str(router_port)]
            for p in procs:
                cmd += [f"--{p.role}", p.url]
            if skip:
                cmd += ["--fault-skip-prefill", str(skip), "--fault-seed", str(spec.seed)]
            dep.router = "epdbench-proxy" + (f" (fault: skip prefill {skip:.0%})" if skip else "")
        router_url = f"http://{host}:{router_port}"
        router_metrics = router_metrics or router_url + "/metrics"
        log = log_dir / "router.log"
        router = Process("router", "router", router_url, log, _spawn(cmd, log, env, f"{config.name}/router"),
                         metrics_url=router_metrics)
        procs.append(router)
        wait_healthy([router], deadline)
        dep.endpoint = router_url
        smoke_request(router_url, spec.model.name, deadline)
        dep.health = lambda: exited(dep.processes)
        return dep
    except BaseException:
        stop(dep)
        raise


def smoke_request(url: str, model: str, deadline: float) -> None:
    """One tiny completion through the router proves the whole path serves."""
    probe_until_served(url + "/v1/completions",
                       {"model": model, "prompt": "epdbench readiness probe", "max_tokens": 2,
                        "request_id": "epdbench-probe"},
                       {"X-Request-Id": "epdbench-probe"}, deadline, interval_s=0.5)


def stop(dep: Deployment) -> None:
    """Stop the router first, then the engines; never raises."""
    for p in sorted(dep.processes, key=lambda p: p.role != "router"):
        if p.popen is None:
            continue
        try:
            _stop(p.popen)
        except Exception:  # noqa: BLE001 - teardown must reach every process
            pass
