"""`epdbench up` / `down`: a Prefect server, an MLflow tracking server and the epdbench deployments on
this machine (loopback by default), with their state under --data-dir so history survives restarts."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from epdbench.manifests.workpool import PoolSettings, render_pool_objects
from epdbench.specs.models import KubernetesTargetSpec
from epdbench.tasks.proc import lifeline
from epdbench.tasks.k8s.api import KubeApiError, connect
from epdbench.tasks.rundir.runstate import FolderLocked, RunFolder, end_leftovers, process_start_time
from epdbench.tasks.k8s.workpool import (apply_pool_objects, delete_pool_objects, ensure_work_pool, pool_template,
                                     worker_kubeconfig)

STATE_FILE = "up.json"
WORKER_KUBECONFIG = "worker-kubeconfig.yaml"


@dataclass
class Service:
    name: str
    cmd: list[str]
    health_url: str
    env: dict
    log: Path
    popen: subprocess.Popen | None = None


def _bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    return str(candidate) if candidate.exists() else name


@dataclass(frozen=True)
class PoolPlan:
    """`epdbench up --work-pool kubernetes`: runs execute as Jobs of this pool in the target's namespace; the
    worker that creates them runs on this machine ("here") or as a Deployment in the namespace ("cluster")."""
    settings: PoolSettings
    target: KubernetesTargetSpec
    worker: str = "here"


def plan_services(host: str, prefect_port: int, mlflow_port: int, data_dir: Path, nightly_cron: str,
                  timezone: str, nightly_preset: str, pool: PoolPlan | None = None) -> list[Service]:
    """Prefect, MLflow, then what runs the flows: the deployments served here, or (work pool) the worker
    on this machine, or nothing more (the worker is in the cluster)."""
    data_dir = data_dir.resolve()
    base = {**os.environ, "DO_NOT_TRACK": "true", "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
            "MLFLOW_DISABLE_TELEMETRY": "true", "PREFECT_HOME": str(data_dir / "prefect")}
    base.pop("PREFECT_API_URL", None)
    prefect_api = f"http://{host}:{prefect_port}/api"
    mlflow_url = f"http://{host}:{mlflow_port}"
    logs = data_dir / "logs"
    services = [
        Service("prefect", [_bin("prefect"), "server", "start", "--host", host, "--port", str(prefect_port)],
                f"{prefect_api}/health", {**base, "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "15",
                                          "PREFECT_UI_API_URL": prefect_api},   # the UI calls the API here
                logs / "prefect.log"),
        Service("mlflow", [_bin("mlflow"), "server", "--backend-store-uri", f"sqlite:///{data_dir / 'mlflow.db'}",
                           "--artifacts-destination", str(data_dir / "mlartifacts"), "--host", host,
                           "--port", str(mlflow_port), "--workers", "1"],
                f"{mlflow_url}/health", {**base, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}, logs / "mlflow.log"),
    ]
    if pool is None:
        services.append(Service(
            "deployments", [sys.executable, "-P", "-m", "epdbench.flows.deployments", "--nightly-cron", nightly_cron,
                            "--timezone", timezone, "--nightly-preset", nightly_preset],
            "", {**base, "PREFECT_API_URL": prefect_api, "MLFLOW_TRACKING_URI": mlflow_url,
                 "EPDBENCH_RESULTS_DIR": str(data_dir / "results"),     # runs' folders beside the stores
                 "PREFECT_LOGGING_LEVEL": "INFO"}, logs / "deployments.log"))
    elif pool.worker == "here":
        services.append(Service(
            "worker", [_bin("prefect"), "worker", "start", "--pool", pool.settings.pool, "--type", "kubernetes",
                       "--no-create-pool-if-not-found"],
            "", {**base, "PREFECT_API_URL": prefect_api, "KUBECONFIG": str(data_dir / WORKER_KUBECONFIG),
                 "PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES": pool.settings.namespace,
                 "PREFECT_LOGGING_LEVEL": "INFO"}, logs / "worker.log"))
    return services


def register_pool_deployments(pool: PoolPlan, prefect_api: str, data_dir: Path, nightly_cron: str, timezone: str,
                              nightly_preset: str, timeout_s: float) -> None:
    """The work pool with epdbench's base job template, the flow-run rights in the namespace (and the
    worker there), then both deployments registered on the pool."""
    print(f"work pool {pool.settings.pool}: {ensure_work_pool(pool.settings.pool, pool_template(pool.settings))}",
          flush=True)
    objects = render_pool_objects(pool.settings, worker_in_cluster=pool.worker == "cluster")
    apply_pool_objects(pool.target, objects)
    print(f"namespace {pool.settings.namespace}: applied {', '.join(o['kind'] + ' ' + o['metadata']['name'] for o in objects)}",
          flush=True)
    if pool.worker == "here":
        worker_kubeconfig(pool.target, data_dir.resolve() / WORKER_KUBECONFIG)
    log = data_dir.resolve() / "logs" / "deployments.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "PREFECT_API_URL": prefect_api, "PREFECT_HOME": str(data_dir.resolve() / "prefect"),
           "DO_NOT_TRACK": "true"}
    with open(log, "ab") as fh:
        done = subprocess.run([sys.executable, "-P", "-m", "epdbench.flows.deployments", "--nightly-cron", nightly_cron,
                               "--timezone", timezone, "--nightly-preset", nightly_preset,
                               "--work-pool", pool.settings.pool, "--image", pool.settings.image,
                               "--namespace", pool.settings.namespace],
                              stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, timeout=timeout_s)
    if done.returncode != 0:
        raise RuntimeError(f"registering the deployments on {pool.settings.pool} failed (code {done.returncode}); "
                           f"see {log}")


def stop_cluster_worker(pool: PoolPlan) -> None:
    """The in-cluster worker polls this machine's Prefect: it goes when `up` stops (the flow rights stay)."""
    objects = [o for o in render_pool_objects(pool.settings, worker_in_cluster=True) if o["kind"] == "Deployment"]
    try:
        left = delete_pool_objects(connect(pool.target), objects)
    except KubeApiError as e:
        left = [str(e)]
    for problem in left:
        print(f"warning: in-cluster worker not deleted: {problem}", file=sys.stderr)


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except (urllib.error.URLError, OSError):
        return False


def start(svc: Service, timeout_s: float) -> None:
    """The service in a session of its own, dying with `up` however `up` dies (its own children: by `up`'s
    guard), registered in the data directory as it starts (tasks/proc/lifeline.py)."""
    svc.log.parent.mkdir(parents=True, exist_ok=True)
    with open(svc.log, "ab") as fh:
        svc.popen = lifeline.popen(svc.cmd, f"up/{svc.name}", env=svc.env, stdout=fh, stderr=subprocess.STDOUT,
                                   stdin=subprocess.DEVNULL, start_new_session=True)
    if not svc.health_url:
        return
    deadline = time.monotonic() + timeout_s
    while not _healthy(svc.health_url):
        if svc.popen.poll() is not None:
            raise RuntimeError(f"{svc.name} exited (code {svc.popen.returncode}); see {svc.log}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{svc.name} not healthy after {timeout_s:.0f}s; see {svc.log}")
        time.sleep(0.5)


def stop(svc: Service, grace_s: float = 15) -> None:
    p = svc.popen
    if p is None or p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=5)
    except ProcessLookupError:
        pass


def ensure_gpu_node_slot(prefect_api: str) -> None:
    """A global concurrency limit of 1 so two comparisons never share the GPU node."""
    os.environ["PREFECT_API_URL"] = prefect_api
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import GlobalConcurrencyLimitCreate

    with get_client(sync_client=True) as client:
        try:
            client.read_global_concurrency_limit_by_name(GPU_NODE_SLOT)
        except Exception:  # noqa: BLE001 - not found: create it
            client.create_global_concurrency_limit(GlobalConcurrencyLimitCreate(name=GPU_NODE_SLOT, limit=1))


def wait_for_deployments(prefect_api: str, names: list[str], timeout_s: float) -> None:
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + timeout_s
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline:
            have = {d.name for d in client.read_deployments()}
            if set(names) <= have:
                return
            time.sleep(1)
    raise RuntimeError(f"deployments {names} not registered after {timeout_s:.0f}s")


def up(host: str, prefect_port: int, mlflow_port: int, data_dir: Path, nightly_cron: str, timezone: str,
       nightly_preset: str, timeout_s: float = 120, pool: PoolPlan | None = None) -> int:
    data_dir.mkdir(parents=True, exist_ok=True)
    state_path = data_dir / STATE_FILE
    if state_path.exists() and _alive(json.loads(state_path.read_text()).get("pid")):
        print(f"error: epdbench up is already running (pid {json.loads(state_path.read_text())['pid']}); "
              "run 'epdbench down' first", file=sys.stderr)
        return 2
    try:   # held before anything starts: every process below `up` carries its token, and its guard watches
        hold = RunFolder(data_dir).acquire()
    except FolderLocked as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    ended = end_leftovers(data_dir)
    if ended:
        print(f"ended {len(ended)} process(es) an earlier `epdbench up` left running: "
              + ", ".join(f"{e['what']} pid {e['pid']}" for e in ended), flush=True)
    services = plan_services(host, prefect_port, mlflow_port, data_dir, nightly_cron, timezone, nightly_preset, pool)
    stopping = {"flag": False}

    def on_signal(signum, frame):
        stopping["flag"] = True
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, on_signal)
    prefect_api = f"http://{host}:{prefect_port}/api"
    try:
        for svc in services[:2]:
            print(f"starting {svc.name} ...", flush=True)
            start(svc, timeout_s)
        ensure_gpu_node_slot(prefect_api)
        if pool is not None:
            register_pool_deployments(pool, prefect_api, data_dir, nightly_cron, timezone, nightly_preset, timeout_s)
        for svc in services[2:]:
            start(svc, timeout_s)
        wait_for_deployments(prefect_api, ["nightly-comparison", "adhoc-comparison"], timeout_s)
        state_path.write_text(json.dumps({"pid": os.getpid(), "prefect": f"http://{host}:{prefect_port}",
                                          "mlflow": f"http://{host}:{mlflow_port}",
                                          "children": [{"pid": s.popen.pid, "start": process_start_time(s.popen.pid)}
                                                       for s in services]}))
        where = "" if pool is None else (f"; runs execute as Jobs in namespace {pool.settings.namespace}, "
                                         f"worker {'on this machine' if pool.worker == 'here' else 'in the cluster'}")
        print(f"Prefect UI: http://{host}:{prefect_port}  (deployments nightly-comparison, adhoc-comparison{where})")
        print(f"MLflow UI:  http://{host}:{mlflow_port}")
        print(f"state and logs under {data_dir}/; Ctrl-C or 'epdbench down' stops everything", flush=True)
        while all(s.popen.poll() is None for s in services):
            time.sleep(1)
        dead = [s.name for s in services if s.popen.poll() is not None]
        print(f"error: {', '.join(dead)} stopped; see {data_dir / 'logs'}", file=sys.stderr)
        return 3
    except KeyboardInterrupt:
        return 0
    except (RuntimeError, KubeApiError, subprocess.TimeoutExpired) as e:
        print(f"error: {e}", file=sys.stderr)
        return 3
    finally:
        for svc in reversed(services):
            stop(svc)
        if pool is not None and pool.worker == "cluster":
            stop_cluster_worker(pool)
        state_path.unlink(missing_ok=True)
        hold.release()
        print(f"stopped Prefect, MLflow and the {'deployments' if pool is None else 'worker'}", flush=True)


GPU_NODE_SLOT = "epdbench-gpu-node"   # Prefect global concurrency limit held by every comparison flow


def _alive(pid) -> bool:
    """Whether `pid` runs; a zombie (exited, not yet reaped by its parent) does not."""
    return bool(pid) and process_start_time(int(pid)) is not None


def down(data_dir: Path, timeout_s: float = 60) -> int:
    state_path = data_dir / STATE_FILE
    if not state_path.exists():
        print(f"nothing to stop: no {state_path}")
        return 0
    state = json.loads(state_path.read_text())
    pid = state.get("pid")
    if _alive(pid):
        os.kill(int(pid), signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
    for child in state.get("children", []):     # the up process died without cleaning up
        # by recorded pid and start time only: a pid reused by another process is left alone
        pid, start = (child.get("pid"), child.get("start")) if isinstance(child, dict) else (child, None)
        if pid and start is not None and process_start_time(int(pid)) == start:
            try:
                os.killpg(int(pid), signal.SIGKILL)
            except ProcessLookupError:
                pass
    end_leftovers(data_dir)     # what no state file named: started before `up` wrote it, or by a service
    state_path.unlink(missing_ok=True)
    print("stopped")
    return 0
