"""The kubelet's part for the kwok node, on loopback: what a pod stands for runs as a local process.

kwok keeps the node and finalises deleted pods; it writes no pod status here (tests/cluster/controlplane.py says
why). This player reads the pods scheduled onto the node through the real API server and, for each:
- starts the process the pod stands for (an engine pod: the simulator engine of that role with that pod's
  arguments; a router pod: the simulator's proxy in front of its configuration's engines; a load generator pod:
  `epdbench loadgen` with its ConfigMap's files; a Prefect flow-run pod: its command) — the commands are those of
  the fake kubelet (tests/k8s/fake_kubelet.py), which this class extends;
- writes its output as the container runtime does, in the CRI log format, and a kwok `Logs` object naming that
  file, so `pods/log` through the API server reads it (timestamps, sinceTime, previous as the kubelet serves them);
- a kwok `PortForward` object mapping each container port to the process's loopback port, so `pods/portforward`
  through the API server reaches it;
- writes the pod's status as a kubelet does: Running when started, Ready when its readiness endpoint answers,
  Succeeded or Failed with the exit code when a Job's process ends;
- ends the process and its objects when the pod is being deleted (kwok then removes the pod).

Pod IPs are written from a private range where nothing listens; nothing here or in the runs dials them.
"""
from __future__ import annotations

import datetime as dt
import ipaddress
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from tests.cluster.controlplane import NODE, ControlPlane
from tests.k8s.fake_kubelet import CRASH_LOG, CRASH_LOOP, IMAGE_PULL, NOT_READY, READY, RUN, Kubelet, PodLife
from tests.k8s.fake_objects import matches

TICK_S = 0.1
POD_CIDR = ipaddress.ip_network("10.244.0.0/16")   # written into pod status only; never dialled
KWOK = "/apis/kwok.x-k8s.io/v1alpha1"
PLURAL_PATH = {"pods": "/api/v1", "services": "/api/v1", "configmaps": "/api/v1", "events": "/api/v1"}


def stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f000Z")


class ApiStore:
    """What the fake kubelet reads of its store (`get`, `find`), read from the real API server."""

    def __init__(self, cp: ControlPlane, namespace: str):
        self.cp, self.namespace = cp, namespace      # "any namespace" means the player's: it sees no other
        self.lock = threading.RLock()

    def get(self, plural: str, ns: str, name: str) -> dict | None:
        status, body = self.cp.request("GET", f"{PLURAL_PATH[plural]}/namespaces/{ns}/{plural}/{name}")
        return body if status == 200 else None

    def find(self, plural: str, ns: str = "", kind: str | None = None, selector: str | None = None) -> list[dict]:
        path = f"{PLURAL_PATH[plural]}/namespaces/{ns or self.namespace}/{plural}"
        status, body = self.cp.request("GET", path)
        items = body.get("items", []) if status == 200 else []
        return [o for o in items if matches(o["metadata"].get("labels", {}), selector)]


class PodPlayer(Kubelet):
    def __init__(self, cp: ControlPlane, work_dir: Path, spec_path: Path | None, namespace: str,
                 behaviour: Callable[[dict], str] = lambda pod: RUN, env_overrides: dict[str, str] | None = None):
        """Plays the node's pods of `namespace` only: a test's player leaves other tests' pods alone."""
        work_dir.mkdir(parents=True, exist_ok=True)
        super().__init__(ApiStore(cp, namespace), work_dir, spec_path, behaviour, env_overrides or {})
        self.cp, self.namespace = cp, namespace
        self.uids: dict[str, str] = {}          # pod name -> the uid its life belongs to
        self.ips = iter(POD_CIDR.hosts())
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="pod-player", daemon=True)
        self._shippers: dict[str, tuple[Path, Path, int]] = {}     # pod/container -> (raw log, CRI log, offset)
        # A StatefulSet pod's name is its address in a cluster (its DNS name): one made again after a delete is
        # reached where the old one was. Here: its engine binds the loopback port of the pod's first life, once
        # the old process is gone.
        self.stable_ports: dict[str, int] = {}
        self.dying: dict[str, PodLife] = {}

    def start(self) -> "PodPlayer":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        self.kill_all()
        for life in self.dying.values():
            self.kill(life)

    def running_processes(self) -> list:
        lives = [x for life in (*self.lives.values(), *self.dying.values()) for x in (life, *life.sidecars.values())]
        return [life.process for life in lives if life.process and life.process.poll() is None]

    # --- the loop ---------------------------------------------------------------------------------------------
    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self._tick()
            except Exception as e:       # the API server restarting: keep playing
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(TICK_S)

    def _tick(self) -> None:
        status, body = self.cp.request("GET", f"/api/v1/namespaces/{self.namespace}/pods?fieldSelector="
                                              f"spec.nodeName%3D{NODE}", timeout_s=5)
        if status != 200:
            return
        pods = body.get("items", [])
        seen = set()
        for pod in pods:
            key = self._key(pod)
            seen.add(key)
            life = self.lives.get(key)
            if pod["metadata"].get("deletionTimestamp"):
                if life:
                    self._end(key, pod)
                continue
            if life is None or self.uids.get(key) != pod["metadata"]["uid"]:
                if life:
                    self._end(key, pod)
                self.lives[key] = PodLife(script=self.behaviour(pod))
                self.uids[key] = pod["metadata"]["uid"]
                life = self.lives[key]
            try:
                self._ship_logs(key)
                if not life.ready:
                    self._step(pod, life)
            except Exception as e:     # one pod's trouble (a command it cannot make) stops no other
                self.errors.append(f"pod {key}: {type(e).__name__}: {e}")
        for key in [k for k in self.lives if k not in seen]:
            self._end(key, None)

    def _epdbench_command(self, pod: dict, life: PodLife, labels: dict) -> list[str] | None:
        cmd = super()._epdbench_command(pod, life, labels)
        if cmd and labels.get("epdbench/role") not in ("router", "loadgen") and "--port" in cmd:
            port = self.stable_ports.setdefault(self._key(pod), life.port)
            cmd[cmd.index("--port") + 1] = str(port)
            life.port = port
        return cmd

    @staticmethod
    def _key(pod: dict) -> str:
        return pod["metadata"]["name"]

    def _step(self, pod: dict, life: PodLife) -> None:
        if not life.started:
            self._begin(pod, life)
            return
        if life.job and life.process and life.process.poll() is not None:
            self._ship_logs(self._key(pod))
            self._finish_job_pod(pod, life)
            return
        if life.script == RUN and life.port and self._healthy_sync(life.port) and \
                all(self._healthy_sync(x.port) for x in life.sidecars.values()):
            life.ready = True
            self._set_status(pod, "Running", ready=True)

    def _begin(self, pod: dict, life: PodLife) -> None:
        old = self.dying.get(self._key(pod))
        if old is not None:
            if any(p.poll() is None for p in (old.process, *[s.process for s in old.sidecars.values()]) if p):
                return        # its port is the old process's until it has ended
            del self.dying[self._key(pod)]
        name = pod["metadata"]["name"]
        if life.script == CRASH_LOOP:       # three exits behind it, the fourth start backing off
            life.log_path = self.work_dir / f"{name}.log"
            life.log_path.write_text("")
            (self.work_dir / f"{name}.previous.log").write_text(CRASH_LOG)
            self._publish(pod, life, previous=self.work_dir / f"{name}.previous.log")
            self._set_status(pod, "Running", waiting=("CrashLoopBackOff", "back-off 40s restarting failed container"),
                             restarts=3)
            self._event(pod, "BackOff", "Back-off restarting failed container")
        elif life.script == NOT_READY:      # running, its readiness probe failing
            self._set_status(pod, "Running")
            self._event(pod, "Unhealthy", "Readiness probe failed: connect: connection refused")
        elif life.script == IMAGE_PULL:
            image = pod["spec"]["containers"][0]["image"]
            self._set_status(pod, "Pending", waiting=("ImagePullBackOff", f'Back-off pulling image "{image}"'))
            self._event(pod, "Failed", f'Failed to pull image "{image}": manifest unknown')
        elif life.script == READY:          # ready, with no process behind it
            life.ready = True
            self._set_status(pod, "Running", ready=True)
        elif life.script == RUN:
            if not self._start_process(pod, life):
                return        # a router waits for its engines; a load generator for its Service
            self._publish(pod, life)
        else:
            raise ValueError(f"the pod player plays {RUN}, {READY}, {NOT_READY}, {IMAGE_PULL} and {CRASH_LOOP}, "
                             f"not {life.script}")
        life.started = True

    def _end(self, key: str, pod: dict | None) -> None:
        life = self.lives.pop(key, None)
        self.uids.pop(key, None)
        if life:
            self.dying[key] = life
            threading.Thread(target=self.kill, args=(life,), daemon=True).start()
        if pod is not None:
            ns = pod["metadata"]["namespace"]
            for plural in ("logs", "portforwards"):
                self.cp.request("DELETE", f"{KWOK}/namespaces/{ns}/{plural}/{key}")

    # --- status, logs and ports through the API server ---------------------------------------------------------
    def _set_status(self, pod: dict, phase: str, ready: bool = False, waiting: tuple[str, str] | None = None,
                    restarts: int = 0) -> None:
        containers = pod["spec"]["containers"]
        now = stamp()[:19] + "Z"
        statuses = []
        for c in containers:
            state = {"waiting": {"reason": waiting[0], "message": waiting[1]}} if waiting else \
                {"running": {"startedAt": now}}
            s = {"name": c["name"], "image": c["image"], "imageID": "", "ready": ready, "restartCount": restarts,
                 "started": not waiting, "state": state}
            if restarts:
                s["lastState"] = {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": now,
                                                 "finishedAt": now}}
            statuses.append(s)
        ip = pod.get("status", {}).get("podIP") or str(next(self.ips))
        condition = "True" if ready else "False"
        status = {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}], "hostIP": "127.0.0.1",
                  "hostIPs": [{"ip": "127.0.0.1"}], "startTime": pod.get("status", {}).get("startTime") or now,
                  "containerStatuses": statuses, "conditions": [
                      {"type": "PodScheduled", "status": "True", "lastTransitionTime": now},
                      {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                      {"type": "ContainersReady", "status": condition, "lastTransitionTime": now},
                      {"type": "Ready", "status": condition, "lastTransitionTime": now}]}
        self._patch_status(pod, status)

    def _finish_job_pod(self, pod: dict, life: PodLife) -> None:
        code = life.process.returncode
        life.ready = True     # nothing left to step
        now = stamp()[:19] + "Z"
        c = pod["spec"]["containers"][0]
        status = {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [{
            "name": c["name"], "image": c["image"], "imageID": "", "ready": False, "restartCount": 0,
            "started": False, "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                                       "startedAt": now, "finishedAt": now}}}],
            "conditions": [{"type": "Ready", "status": "False", "reason": "PodCompleted", "lastTransitionTime": now},
                           {"type": "ContainersReady", "status": "False", "reason": "PodCompleted",
                            "lastTransitionTime": now}]}
        self._patch_status(pod, status)

    def _patch_status(self, pod: dict, status: dict) -> None:
        meta = pod["metadata"]
        code, body = self.cp.request("PATCH", f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}/status",
                                     {"status": status}, content_type="application/strategic-merge-patch+json")
        if code != 200:
            self.errors.append(f"pod {meta['name']} status: HTTP {code} {body.get('message')}")
        else:
            pod["status"] = body.get("status", status)

    def _event(self, pod: dict, reason: str, message: str) -> None:
        """A Warning event about the pod, as the kubelet records one."""
        meta = pod["metadata"]
        now = stamp()[:19] + "Z"
        event = {"apiVersion": "v1", "kind": "Event", "type": "Warning", "reason": reason, "message": message,
                 "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
                 "involvedObject": {"apiVersion": "v1", "kind": "Pod", "name": meta["name"],
                                    "namespace": meta["namespace"], "uid": meta["uid"]},
                 "source": {"component": "kubelet", "host": NODE}, "firstTimestamp": now, "lastTimestamp": now,
                 "count": 1}
        code, body = self.cp.request("POST", f"/api/v1/namespaces/{meta['namespace']}/events", event)
        if code != 201:
            self.errors.append(f"event {reason} of {meta['name']}: HTTP {code} {body.get('message')}")

    def _publish(self, pod: dict, life: PodLife, previous: Path | None = None) -> None:
        """The kwok Logs and PortForward objects of a started pod: each container's CRI log, each port's target."""
        meta = pod["metadata"]
        ns, name = meta["namespace"], meta["name"]
        owner = [{"apiVersion": "v1", "kind": "Pod", "name": name, "uid": meta["uid"]}]
        logs = []
        containers = pod["spec"]["containers"]
        for i, c in enumerate(containers):
            source = life.log_path if i == 0 else (life.sidecars.get(c["name"]).log_path
                                                   if c["name"] in life.sidecars else None)
            if source is None:
                continue
            cri = self.work_dir / "cri" / f"{name}_{c['name']}.log"
            cri.parent.mkdir(exist_ok=True)
            cri.touch()
            self._shippers[f"{name}/{c['name']}"] = (source, cri, 0)
            entry = {"containers": [c["name"]], "logsFile": str(cri), "follow": False}
            if previous is not None and i == 0:
                prev = self.work_dir / "cri" / f"{name}_{c['name']}.previous.log"
                prev.write_text("".join(f"{stamp()} stdout F {line}\n" for line in previous.read_text().splitlines()))
                entry["previousLogsFile"] = str(prev)
            logs.append(entry)
        forwards = []
        for c in containers:
            for p in c.get("ports", []):
                local = life.ports.get(p["containerPort"]) or (life.port if c is containers[0] else None)
                if local:
                    forwards.append({"ports": [p["containerPort"]], "target": {"address": "127.0.0.1",
                                                                               "port": local}})
        for kind, plural, spec in (("Logs", "logs", {"logs": logs}),
                                   ("PortForward", "portforwards", {"forwards": forwards})):
            if not next(iter(spec.values())):
                continue
            obj = {"apiVersion": "kwok.x-k8s.io/v1alpha1", "kind": kind,
                   "metadata": {"name": name, "namespace": ns, "ownerReferences": owner}, "spec": spec}
            code, body = self.cp.request("POST", f"{KWOK}/namespaces/{ns}/{plural}", obj)
            if code == 409:
                code, body = self.cp.request("PUT", f"{KWOK}/namespaces/{ns}/{plural}/{name}",
                                             {**obj, "metadata": {**obj["metadata"], "resourceVersion":
                                                                  self._rv(ns, plural, name)}})
            if code not in (200, 201):
                self.errors.append(f"{kind} {name}: HTTP {code} {body.get('message')}")

    def _rv(self, ns: str, plural: str, name: str) -> str:
        _, body = self.cp.request("GET", f"{KWOK}/namespaces/{ns}/{plural}/{name}")
        return body.get("metadata", {}).get("resourceVersion", "")

    def _ship_logs(self, pod_name: str) -> None:
        """New complete lines of each container's output, appended to its CRI log (`<RFC3339Nano> stdout F line`)."""
        for key, (source, cri, offset) in list(self._shippers.items()):
            if not key.startswith(pod_name + "/") or not source.exists():
                continue
            with open(source, "rb") as fh:
                fh.seek(offset)
                data = fh.read()
            complete = data[:data.rfind(b"\n") + 1]
            if not complete:
                continue
            now = stamp()
            with open(cri, "ab") as out:
                for line in complete.decode("utf-8", "replace").splitlines():
                    out.write(f"{now} stdout F {line}\n".encode())
            self._shippers[key] = (source, cri, offset + len(complete))

    @staticmethod
    def _healthy_sync(port: int | None) -> bool:
        if not port:
            return False
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=0.5) as r:
                return r.status == 200
        except (urllib.error.URLError, OSError):
            return False

    def ship_all(self) -> None:
        for key in {k.split("/")[0] for k in self._shippers}:
            self._ship_logs(key)

    def wait(self, predicate: Callable[[], bool], timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if predicate():
                return True
            time.sleep(0.1)
        return False
