"""The fake cluster's kubelet: runs each pod by the script its test chose (a `run` pod is a local simulator
process), reports its status and health, stops it when the pod goes, and serves its logs."""
from __future__ import annotations

import asyncio
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp
from aiohttp import web

from epdbench.tasks.sim import target as sim_target
from tests.k8s.fake_objects import ObjectStore, now_stamp, status_body

ROOT = Path(__file__).resolve().parents[2]
NODE = "gpu-node-1"
TICK_S = 0.05
HEALTH_TIMEOUT_S = 0.5

RUN, READY, UNSCHEDULABLE, IMAGE_PULL, CRASH_LOOP, NOT_READY = (
    "run", "ready", "unschedulable", "image-pull", "crash-loop", "not-ready")
CRASH_LOG = "ValueError: invalid model configuration (scripted crash)\n"


def free_port() -> int:
    """Never one this process handed out before (sim_target.free_port): a pod's port is picked before its
    process binds it, and bind(0) can meanwhile give it to the next pod again."""
    return sim_target.free_port("127.0.0.1")


@dataclass
class PodLife:
    """The kubelet's view of one pod: its script, its simulator process and its stamped log lines."""
    script: str
    port: int | None = None
    process: subprocess.Popen | None = None
    log_path: Path | None = None
    lines: list[tuple[str, str]] = field(default_factory=list)
    read_bytes: int = 0
    started: bool = False
    ready: bool = False
    job: str | None = None          # the Job a load generator pod belongs to
    ports: dict[int, int] = field(default_factory=dict)          # a container port -> the local port behind it
    sidecars: dict[str, "PodLife"] = field(default_factory=dict)  # the pod's other containers, by name


class Kubelet:
    """Pod lives by pod name: `run` starts `python -m epdbench.sim.server` for an engine pod and
    `python -m epdbench.sim.proxy` for a router pod (once its configuration's engines have ports)."""

    def __init__(self, store: ObjectStore, work_dir: Path, spec_path: Path | None,
                 behaviour: Callable[[dict], str], env_overrides: dict[str, str]):
        self.store, self.work_dir, self.spec_path = store, work_dir, spec_path
        self.behaviour, self.env_overrides = behaviour, env_overrides
        self.lives: dict[str, PodLife] = {}
        self.service_ports: dict[tuple[str, str, int], int] = {}   # (namespace, Service, port) -> a local port
        self._session: aiohttp.ClientSession | None = None

    # --- pods coming and going -------------------------------------------------------------------
    def admit(self, pod: dict) -> None:
        """A new pod: ask the test's behaviour for its script."""
        self.lives[pod["metadata"]["name"]] = PodLife(script=self.behaviour(pod))

    def ready_life(self, name: str) -> PodLife | None:
        life = self.lives.get(name)
        return life if life and life.ready else None

    def release(self, name: str) -> None:
        """Forget a deleted pod and stop its process, off the event loop (stopping can take seconds)."""
        life = self.lives.pop(name, None)
        if life:
            asyncio.get_running_loop().run_in_executor(None, self.kill, life)

    def kill_all(self) -> None:
        for life in self.lives.values():
            self.kill(life)

    def running_processes(self) -> list[subprocess.Popen]:
        lives = [x for life in self.lives.values() for x in (life, *life.sidecars.values())]
        return [life.process for life in lives if life.process and life.process.poll() is None]

    @classmethod
    def kill(cls, life: PodLife) -> None:
        for sidecar in life.sidecars.values():
            cls.kill(sidecar)
        if life.process and life.process.poll() is None:
            os.killpg(life.process.pid, signal.SIGTERM)
            try:
                life.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(life.process.pid, signal.SIGKILL)
                life.process.wait(timeout=5)

    # --- the loop --------------------------------------------------------------------------------
    async def run(self, session: aiohttp.ClientSession) -> None:
        """Every tick, take each live pod that is not ready yet one step further."""
        self._session = session
        while True:
            with self.store.lock:
                pods = [o for o in self.store.find("pods") if not o["metadata"].get("deletionTimestamp")]
            for pod in pods:
                life = self.lives.get(pod["metadata"]["name"])
                if life and not life.ready:
                    await self._step(pod, life)
            await asyncio.sleep(TICK_S)

    async def _step(self, pod: dict, life: PodLife) -> None:
        if not life.started:
            with self.store.lock:
                self._begin(pod, life)
            return
        if life.job and life.process and life.process.poll() is not None:
            with self.store.lock:
                self._finish_job_pod(pod, life)
            return
        if (life.script == RUN and life.port and await self._healthy(life.port)
                and all([await self._healthy(x.port) for x in life.sidecars.values()])):
            with self.store.lock:
                life.ready = True
                self._set_status(pod, "Running", ready=True)

    def _begin(self, pod: dict, life: PodLife) -> None:
        """First kubelet pass over a pod: schedule it (or not) and start its container (or fail)."""
        script = life.script
        if script == UNSCHEDULABLE:
            message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available."
            pod["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}
            self.store.event(pod, "FailedScheduling", message)
            life.started = True
            return
        pod["spec"]["nodeName"] = NODE
        if script == IMAGE_PULL:
            image = pod["spec"]["containers"][0]["image"]
            self._set_status(pod, "Pending", waiting=("ImagePullBackOff", f'Back-off pulling image "{image}"'))
            self.store.event(pod, "Failed", f'Failed to pull image "{image}": manifest unknown')
        elif script == CRASH_LOOP:
            life.lines = [(now_stamp(), CRASH_LOG.strip())]
            self._set_status(pod, "Running", waiting=("CrashLoopBackOff", "back-off 40s restarting failed container"),
                             restarts=3)
            self.store.event(pod, "BackOff", "Back-off restarting failed container")
        elif script == NOT_READY:
            self._set_status(pod, "Running")
            self.store.event(pod, "Unhealthy", "Readiness probe failed: connect: connection refused")
        elif script == READY:
            self._set_status(pod, "Running", ready=True)
            life.ready = True
        elif not self._start_process(pod, life):
            return   # a router waits for its engines
        life.started = True

    def _set_status(self, pod: dict, phase: str, ready: bool = False, waiting: tuple[str, str] | None = None,
                    restarts: int = 0) -> None:
        name = pod["spec"]["containers"][0]["name"]
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}} if waiting else \
            {"running": {"startedAt": now_stamp()}}
        status = {"name": name, "ready": ready, "restartCount": restarts, "state": state,
                  "image": pod["spec"]["containers"][0]["image"]}
        if restarts:
            status["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error"}}
        pod["status"] = {"phase": phase, "podIP": "10.0.0.1", "containerStatuses": [status], "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Ready", "status": "True" if ready else "False"}]}
        pod["metadata"]["resourceVersion"] = self.store.next_version()

    def _start_process(self, pod: dict, life: PodLife) -> bool:
        labels = pod["metadata"]["labels"]
        mounts: dict[str, str] = {}
        if "prefect.io/flow-run-id" in labels:       # a Prefect worker's flow-run Job
            cmd, mounts = self._flow_run_command(pod)
            life.job = labels.get("job-name")
        else:
            cmd = self._epdbench_command(pod, life, labels)
            if cmd is None:
                return False
        ns = pod["metadata"]["namespace"]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
               **{e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", []) if "value" in e},
               **self.otlp_env(ns, pod["spec"]["containers"][0]), **self.env_overrides}
        for name, value in env.items():       # a path inside a mounted volume: the volume's local folder
            for mount, local in mounts.items():
                if value == mount or value.startswith(mount + "/"):
                    env[name] = local + value[len(mount):]
        life.log_path = self.work_dir / f"{pod['metadata']['name']}.log"
        with open(life.log_path, "ab") as fh:
            life.process = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, cwd=ROOT, start_new_session=True)
        self._start_sidecars(pod, life, env)
        self._set_status(pod, "Running")
        return True

    # --- tracing: the collector beside the router, and the pods that export to it -----------------
    def service_loopback(self, ns: str, url: str) -> str:
        """http://SERVICE:PORT/path as the local URL of the process that serves it (a port chosen on first sight,
        bound by the collector when its pod starts)."""
        m = re.match(r"^http://([a-z0-9-]+):(\d+)(/.*)?$", url)
        if not m:
            return url
        port = self.service_ports.setdefault((ns, m.group(1), int(m.group(2))), free_port())
        return f"http://127.0.0.1:{port}{m.group(3) or ''}"

    def otlp_env(self, ns: str, container: dict) -> dict[str, str]:
        """The simulator's export address for a pod that traces: vLLM's --otlp-traces-endpoint argument or the
        standard variable of the manifest, resolved to the collector's local port."""
        args = container.get("args", [])
        url = next((args[i + 1] for i, a in enumerate(args[:-1]) if a == "--otlp-traces-endpoint"), None)
        url = url or next((e["value"] for e in container.get("env", [])
                           if e["name"] == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"), None)
        return {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": self.service_loopback(ns, url)} if url else {}

    def _start_sidecars(self, pod: dict, life: PodLife, env: dict[str, str]) -> None:
        """The trace collector container (`epdbench collect-traces`) on the port its Service's pods export to."""
        ns = pod["metadata"]["namespace"]
        for container in pod["spec"]["containers"][1:]:
            if container.get("command") != ["epdbench", "collect-traces"]:
                continue
            port = container["ports"][0]["containerPort"]
            service = next(svc["metadata"]["name"] for svc in self.store.find("services", ns)
                           if all(pod["metadata"]["labels"].get(k) == v for k, v in svc["spec"]["selector"].items())
                           and any(p["port"] == port for p in svc["spec"]["ports"]))
            local = int(self.service_loopback(ns, f"http://{service}:{port}").rsplit(":", 1)[1])
            side = PodLife(script=RUN, port=local, started=True,
                           log_path=self.work_dir / f"{pod['metadata']['name']}.{container['name']}.log")
            with open(side.log_path, "ab") as fh:
                side.process = subprocess.Popen(
                    [sys.executable, "-m", "epdbench.cli", "collect-traces", "--host", "127.0.0.1", "--port",
                     str(local)], stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env, cwd=ROOT,
                    start_new_session=True)
            life.sidecars[container["name"]] = side
            life.ports[port] = local

    def _epdbench_command(self, pod: dict, life: PodLife, labels: dict) -> list[str] | None:
        """An engine pod runs the simulator, a router pod sim.proxy (once its engines have ports: None until
        then), a load generator pod `epdbench loadgen`."""
        config, role = labels["epdbench/config"], labels["epdbench/role"]
        if role == "router":
            return self._router_command(pod, config)
        if role == "loadgen":
            life.job = labels.get("job-name")
            return self._loadgen_command(pod)
        ordinal = pod["metadata"]["name"].rsplit("-", 1)[1]
        life.port = free_port()
        cmd = [sys.executable, "-m", "epdbench.sim.server", "--spec", str(self.spec_path), "--config", config,
               "--role", role, "--replica", ordinal, "--port", str(life.port)]
        if role == "prefill":
            cmd += ["--bootstrap-port", str(free_port())]
        return cmd

    def _router_command(self, pod: dict, config: str) -> list[str] | None:
        """sim.proxy in front of the configuration's engines, once every engine process exists."""
        engines = self.store.find("pods", selector=f"epdbench/config={config},epdbench/role!=router")
        lives = [self.lives.get(o["metadata"]["name"]) for o in engines]
        if not engines or any(life is None or life.port is None for life in lives):
            return None
        self.lives[pod["metadata"]["name"]].port = port = free_port()
        cmd = [sys.executable, "-m", "epdbench.sim.proxy", "--port", str(port)]
        for engine, life in sorted(zip(engines, lives), key=lambda e: e[0]["metadata"]["name"]):
            cmd += [f"--{engine['metadata']['labels']['epdbench/role']}", f"http://127.0.0.1:{life.port}"]
        return cmd

    def _loadgen_command(self, pod: dict) -> list[str] | None:
        """`epdbench loadgen` as the Job's container runs it: its ConfigMap's files in a local directory in
        place of the mount, and a Service's DNS name resolved to the ready pod behind it (None: not yet)."""
        ns, container = pod["metadata"]["namespace"], pod["spec"]["containers"][0]
        inputs = self.work_dir / pod["metadata"]["name"]
        inputs.mkdir(parents=True, exist_ok=True)
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        replace = {}
        for volume in pod["spec"].get("volumes", []):
            if "configMap" in volume:
                cm = self.store.get("configmaps", ns, volume["configMap"]["name"])
                if cm is None:
                    return None
                for key, value in (cm.get("data") or {}).items():
                    (inputs / key).write_text(value)
                replace[mounts[volume["name"]]] = str(inputs)
        args = []
        for arg in container.get("args", []):
            for mount, local in replace.items():
                arg = arg.replace(mount, local)
            m = re.match(r"^http://([a-z0-9-]+):\d+$", arg)
            if m:
                port = self._service_port(ns, m.group(1))
                if port is None:
                    return None
                arg = f"http://127.0.0.1:{port}"
            args.append(arg)
        return [sys.executable, "-m", "epdbench.cli", *container["command"][1:], *args]

    def _flow_run_command(self, pod: dict) -> tuple[list[str], dict[str, str]]:
        """The container's command and arguments as given (the image's programs are this environment's),
        each volume mount a local folder."""
        container = pod["spec"]["containers"][0]
        base = self.work_dir / pod["metadata"]["name"]
        mounts = {}
        for m in container.get("volumeMounts", []):
            local = base / m["name"]
            local.mkdir(parents=True, exist_ok=True)
            mounts[m["mountPath"]] = str(local)
        cmd = [*container.get("command", []), *container.get("args", [])]
        programs = Path(sys.executable).parent
        return [str(programs / c) if (programs / c).exists() else c for c in cmd], mounts

    def _service_port(self, ns: str, service: str) -> int | None:
        svc = self.store.get("services", ns, service)
        if svc is None:
            return None
        selector = ",".join(f"{k}={v}" for k, v in svc["spec"]["selector"].items())
        for backend in self.store.find("pods", ns, selector=selector):
            life = self.ready_life(backend["metadata"]["name"])
            if life and life.port:
                return life.port
        return None

    def _finish_job_pod(self, pod: dict, life: PodLife) -> None:
        """The load generator exited: its pod Succeeded or Failed, and its Job says so."""
        code = life.process.returncode
        life.ready = True     # nothing left to step
        container = pod["spec"]["containers"][0]
        pod["status"] = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [{
            "name": container["name"], "ready": False, "restartCount": 0, "image": container["image"],
            "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error"}}}]}
        pod["metadata"]["resourceVersion"] = self.store.next_version()
        job = self.store.get("jobs", pod["metadata"]["namespace"], life.job)
        if job is not None:
            job["status"] = ({"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]} if code == 0
                             else {"failed": 1, "conditions": [{"type": "Failed", "status": "True",
                                                                "reason": "BackoffLimitExceeded",
                                                                "message": "Job has reached the specified backoff limit"}]})
            job["metadata"]["resourceVersion"] = self.store.next_version()

    async def _healthy(self, port: int) -> bool:
        try:
            async with self._session.get(f"http://127.0.0.1:{port}/health",
                                         timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    # --- logs ------------------------------------------------------------------------------------
    def log(self, request: web.Request, ns: str, name: str) -> web.Response:
        """pods/NAME/log: container, previous, sinceTime and timestamps as the real server reads them."""
        with self.store.lock:
            pod, life = self.store.get("pods", ns, name), self.lives.get(name)
        if pod is None:
            return status_body(404, "NotFound", f'pods "{name}" not found')
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = request.query.get("container", containers[0])
        if container not in containers:
            return status_body(400, "BadRequest", f"container {container} is not valid for pod {name}")
        if life is not None and container in life.sidecars:
            life = life.sidecars[container]
        if request.query.get("previous") == "true":
            if life is None or life.script != CRASH_LOOP:
                return status_body(400, "BadRequest", f'previous terminated container "{container}" not found')
            return web.Response(text=CRASH_LOG)
        if life is None or not (life.process or life.lines):
            return status_body(400, "BadRequest", f'container "{container}" in pod "{name}" is waiting to start')
        self._read_new_lines(life)
        since = request.query.get("sinceTime")
        lines = [(stamp, text) for stamp, text in life.lines if not since or stamp[:19] >= since[:19]]
        stamped = request.query.get("timestamps") == "true"
        return web.Response(text="".join(f"{stamp} {text}\n" if stamped else f"{text}\n" for stamp, text in lines))

    @staticmethod
    def _read_new_lines(life: PodLife) -> None:
        """Stamp the complete lines the process wrote since the last read, as the container runtime does."""
        if life.log_path is None or not life.log_path.exists():
            return
        with open(life.log_path, "rb") as fh:
            fh.seek(life.read_bytes)
            data = fh.read()
        complete = data[:data.rfind(b"\n") + 1]
        life.read_bytes += len(complete)
        stamp = now_stamp()
        life.lines += [(stamp, line) for line in complete.decode("utf-8", "replace").splitlines()]
