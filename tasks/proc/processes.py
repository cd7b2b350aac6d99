"""Processes of a deployment on this host, shared by the simulator and local targets: free loopback ports, start
with the log captured to a file, readiness, the smoke request through the router, and teardown (router first,
process group by process group; a safety net at exit)."""
from __future__ import annotations

import atexit
import os
import random
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

from epdbench.tasks.proc import lifeline
from epdbench.tasks.rundir.runstate import TRACKER_GRACE_S, is_resource_tracker, live_stats, process_start_time
from epdbench.tasks.deployment import Deployment, Process, ProvisionError, exited, log_tail, probe_until_served

_LIVE: set[subprocess.Popen] = set()


def stop_all() -> None:
    """Stop every process this module started and is still running (safety net)."""
    stop_processes(list(_LIVE), grace_s=2)


atexit.register(stop_all)


ISSUED_PORTS: deque[int] = deque(maxlen=4096)   # the ports free_port handed out last, in this process


EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")   # where the kernel picks ports by itself
SINGLE_PORTS = range(10_000, 20_000)    # free_port's, below the usual ephemeral range (32768 on)
BLOCKS_FROM = 20_000                    # private_port_block's blocks, from here to the ephemeral range
PORT_BLOCK = 64                         # ports of one engine's own block
ISSUED_BLOCKS: deque[int] = deque(maxlen=256)   # the blocks private_port_block handed out last, in this process


def ephemeral_low(path: Path = EPHEMERAL_RANGE) -> int:
    """The lowest port of the kernel's ephemeral range (32768 where it cannot be read)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _pick(host: str, candidates, issued: deque[int]) -> int | None:
    """A random port of `candidates` that is free now and not in `issued` (then added), in 64 tries; else None."""
    for _ in range(64):
        port = random.choice(candidates)
        if port not in issued and _bindable(host, port):
            issued.append(port)
            return port
    return None


def free_port(host: str, low: int | None = None) -> int:
    """A port free now, below the kernel's ephemeral range, that this process has not handed out among its last
    4096. A deployment picks its ports before its processes bind them, and a port bind(0) gave is one the kernel
    hands out again meanwhile — to another bind(0) (1 in 20,000 consecutive calls on the development VM) or as the
    local end of a connection: the real-engine lane twice saw an engine's NIXL side channel, bound half a minute
    after its port was picked so, fail with `Address already in use`. Below the range the kernel hands out none.
    Where the range starts too low to leave room, bind(0) as before (kernel_port)."""
    if (low if low is not None else ephemeral_low()) < BLOCKS_FROM:
        return kernel_port(host)
    if (port := _pick(host, SINGLE_PORTS, ISSUED_PORTS)) is not None:
        return port
    raise ProvisionError(f"no free port on {host} below the ephemeral range that this process has not handed out "
                         "already (64 tries)")


def kernel_port(host: str) -> int:
    """A port bind(0) gives, free now, that this process has not handed out among its last 4096."""
    for _ in range(64):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((host, 0))
            port = s.getsockname()[1]
        if port not in ISSUED_PORTS:
            ISSUED_PORTS.append(port)
            return port
    raise ProvisionError(f"no free port on {host} that this process has not handed out already (64 tries)")


def private_port_block(host: str, low: int | None = None) -> int | None:
    """The first port of a block of PORT_BLOCK ports between free_port's and the kernel's ephemeral range, free now
    and not handed out by this process before: an engine's own ports (VLLM_PORT: vLLM scans up from it for the ports
    it binds later, its engine core's ZMQ handshake among them), which vLLM otherwise takes from bind(0) and binds
    later, as free_port says. Blocks apart keep the engines of a deployment apart. None where the ephemeral range
    leaves no room (the engine then picks its own)."""
    top = (low if low is not None else ephemeral_low()) - PORT_BLOCK
    blocks = range((BLOCKS_FROM // PORT_BLOCK + 1) * PORT_BLOCK, top // PORT_BLOCK * PORT_BLOCK, PORT_BLOCK)
    if not blocks:
        return None
    if (port := _pick(host, blocks, ISSUED_BLOCKS)) is not None:
        return port
    raise ProvisionError(f"no free block of {PORT_BLOCK} ports below the ephemeral range on {host} (64 tries)")


def router_binary(fix: str = "pip install vllm-router, or set target.sim.router: builtin") -> str:
    here = Path(sys.executable).parent / "vllm-router"
    found = str(here) if here.exists() else shutil.which("vllm-router")
    if not found:
        raise ProvisionError(f"vllm-router is not installed: {fix}")
    return found


def spawn(cmd: list[str], log_path: Path, env: dict, what: str) -> subprocess.Popen:
    """Start `cmd` in a session of its own, stdout and stderr appended to `log_path`, dying with this process and
    registered in the run's folder as `what` as it starts (tasks/proc/lifeline.py)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as fh:
        p = lifeline.popen(cmd, what, env=env, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           start_new_session=True)
    _LIVE.add(p)
    return p


def group_members(pgid: int) -> list[int]:
    """The live processes (zombies left out) of process group `pgid`, from /proc."""
    return [pid for pid, fields in live_stats() if int(fields[2]) == pgid]


def _signal(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def stop_process(p: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group, SIGKILL it after `grace_s`; return once the whole group is gone (stop_processes)."""
    stop_processes([p], grace_s)


def stop_processes(procs: list[subprocess.Popen], grace_s: float = 5.0) -> None:
    """SIGTERM each process's group, all at once, SIGKILL what remains of them after `grace_s`; return once every
    group is gone. The group, not only its leader: a vLLM engine's API server leads its engine core, workers and
    resource tracker, which outlive it when it dies first (killed, or crashed) and hold their memory (a GPU's) until
    someone ends them. A group keeps its id while any of them lives, so no other process can have taken it
    meanwhile. All at once: n engines stop within one grace, not n."""
    def running(p: subprocess.Popen) -> bool:
        return p.poll() is None or bool(group_members(p.pid))

    deadline = time.monotonic() + grace_s
    for p in procs:
        if running(p):
            _signal_group(p.pid, signal.SIGTERM)
    left = [p for p in procs if running(p)]
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = [p for p in left if running(p)]
    trackers = [pid for p in left for pid in group_members(p.pid) if is_resource_tracker(pid)]
    for p in left:       # a resource tracker last: it unlinks its clients' shared memory once they are gone
        for pid in group_members(p.pid):
            if pid not in trackers:
                _signal(pid, signal.SIGKILL)
        if p.poll() is None:
            _signal(p.pid, signal.SIGKILL)
    settle = time.monotonic() + TRACKER_GRACE_S
    while trackers and time.monotonic() < settle:
        time.sleep(0.05)
        trackers = [pid for pid in trackers if process_start_time(pid) is not None]
    for p in left:
        _signal_group(p.pid, signal.SIGKILL)
    settle = time.monotonic() + 5
    while left and time.monotonic() < settle:
        time.sleep(0.05)
        left = [p for p in left if running(p)]
    for p in procs:
        _LIVE.discard(p)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, ConnectionError, OSError):
        return False


def port_taken(host: str, port: int) -> bool:
    """Something on this host already listens on (or holds) `port`."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return True
    return False


def start_failure(name: str, code: int, tail: str) -> str:
    """One line for a process that exited before it served: why, when its log says (a taken port), and its last
    log lines."""
    if "Address already in use" in tail:
        return (f"{name} exited with code {code}: its port is taken by another process (Address already in use); "
                f"stop that process or run again: {tail}")
    return f"{name} exited with code {code}: {tail}"


def wait_healthy(procs: list[Process], deadline: float, interval_s: float = 0.2) -> None:
    """Until every process answers /health; ProvisionError naming one that exited (with its last log lines) or
    those not healthy by `deadline`."""
    pending = list(procs)
    while pending:
        for p in list(pending):
            if p.popen.poll() is not None:
                raise ProvisionError(start_failure(p.name, p.popen.returncode, log_tail(p.log_path)))
            if _healthy(p.url):
                pending.remove(p)
        if pending and time.monotonic() > deadline:
            raise ProvisionError(f"not healthy in time: {', '.join(p.name for p in pending)} "
                                 f"(last lines of {pending[0].name}: {log_tail(pending[0].log_path)})")
        if pending:
            time.sleep(interval_s)


def smoke_request(url: str, model: str, deadline: float) -> None:
    """One tiny completion through the router proves the whole path serves."""
    probe_until_served(url + "/v1/completions",
                       {"model": model, "prompt": "epdbench readiness probe", "max_tokens": 2,
                        "request_id": "epdbench-probe"},
                       {"X-Request-Id": "epdbench-probe"}, deadline, interval_s=0.5)


def serve_through_router(dep: Deployment, cmd: list[str], env: dict, url: str, metrics_url: str, log_dir: Path,
                         what: str, model: str, deadline: float) -> Deployment:
    """Start the router in front of engines already healthy, wait for it, and prove the whole path serves one
    request: the deployment then answers at the router's URL."""
    log = log_dir / "router.log"
    router = Process("router", "router", url, log, spawn(cmd, log, env, what), metrics_url=metrics_url)
    dep.processes.append(router)
    wait_healthy([router], deadline)
    dep.endpoint = url
    smoke_request(url, model, deadline)
    dep.health = lambda: exited(dep.processes)
    return dep


def stop_deployment(dep: Deployment, grace_s: float = 5.0) -> None:
    """Stop the router first, then every engine at once (each with its own processes); never raises."""
    for routers in (True, False):
        try:
            stop_processes([p.popen for p in dep.processes if p.popen is not None and (p.role == "router") == routers],
                           grace_s)
        except Exception:  # noqa: BLE001 - teardown must reach every process
            pass
