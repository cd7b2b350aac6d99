"""An in-process fake Kubernetes API server for tests (HTTP on 127.0.0.1, free port, its own thread).

It answers the calls epdbench makes the way the real server does — bearer-token auth (401),
server-side apply PATCH (415 without the apply content type, 409 on a conflict without force),
GET/LIST with label selectors, DELETE (404 when gone) with garbage collection of dependents,
pod logs (timestamps, sinceTime, previous), events, nodes, version — and runs a tiny controller
and kubelet: StatefulSets and Deployments get pods, and each pod follows a script chosen by the
test (run, unschedulable, image-pull, crash-loop, not-ready, ready). A `run` pod fronts the
simulator: an engine pod is a `python -m sim.server` process, a router pod a `python -m sim.proxy`
process in front of its configuration's engines, reached through the service/pod proxy paths or a
port-forward websocket (v4.channel.k8s.io). Everything listens on loopback; every wait is bounded.
"""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import itertools
import json
import os
import re
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import aiohttp
import pytest
import yaml
from aiohttp import web

from epdbench.relay import stream_back

ROOT = Path(__file__).resolve().parents[2]
TOKEN = "fake-token"
NODE = "gpu-node-1"
TICK_S = 0.05
HEALTH_TIMEOUT_S = 0.5
HOP_HEADERS = {"host", "content-length", "transfer-encoding", "connection", "authorization", "accept-encoding",
               "content-encoding", "keep-alive"}
RESOURCES = {  # plural -> (apiVersion, kind, namespaced)
    "namespaces": ("v1", "Namespace", False), "nodes": ("v1", "Node", False),
    "pods": ("v1", "Pod", True), "services": ("v1", "Service", True), "events": ("v1", "Event", True),
    "serviceaccounts": ("v1", "ServiceAccount", True), "persistentvolumeclaims": ("v1", "PersistentVolumeClaim", True),
    "statefulsets": ("apps/v1", "StatefulSet", True), "deployments": ("apps/v1", "Deployment", True),
    "replicasets": ("apps/v1", "ReplicaSet", True), "controllerrevisions": ("apps/v1", "ControllerRevision", True),
    "roles": ("rbac.authorization.k8s.io/v1", "Role", True),
    "rolebindings": ("rbac.authorization.k8s.io/v1", "RoleBinding", True),
}
PLURAL_OF = {kind: plural for plural, (_, kind, _) in RESOURCES.items()}
PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                  r"(?:/namespaces/(?P<ns>[^/]+)(?=/))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?"
                  r"(?:/(?P<sub>log|portforward|proxy)(?P<tail>/.*)?)?$")

RUN, READY, UNSCHEDULABLE, IMAGE_PULL, CRASH_LOOP, NOT_READY = (
    "run", "ready", "unschedulable", "image-pull", "crash-loop", "not-ready")
CRASH_LOG = "ValueError: invalid model configuration (scripted crash)\n"


def self_signed_certificate(directory: Path) -> bytes:
    """A certificate for 127.0.0.1 (tls.crt, tls.key in directory); returns the PEM, its own CA."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "fake-apiserver")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (directory / "tls.crt").write_bytes(pem)
    (directory / "tls.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                          serialization.PrivateFormat.PKCS8,
                                                          serialization.NoEncryption()))
    return pem


def now_stamp() -> str:
    return dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def matches(labels: dict, selector: str | None) -> bool:
    """Equality-based label selectors: a=b, a!=b, a (exists), comma-separated."""
    for term in filter(None, (selector or "").split(",")):
        if "!=" in term:
            key, value = term.split("!=", 1)
            if labels.get(key) == value:
                return False
        elif "=" in term:
            key, value = term.split("=", 1)
            if labels.get(key) != value.lstrip("="):
                return False
        elif term not in labels:
            return False
    return True


def status_body(code: int, reason: str, message: str) -> web.Response:
    return web.json_response({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                              "message": message, "reason": reason, "code": code}, status=code)


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


class FakeApiServer:
    def __init__(self, work_dir: Path, spec_path: Path | None = None,
                 behaviour: Callable[[dict], str] = lambda pod: RUN, version: tuple[str, str] = ("1", "31"),
                 node_gpus: int = 8, node_rdma: int = 16, termination_s: float = 0.2,
                 env_overrides: dict[str, str] | None = None, tls: bool = False):
        self.work_dir, self.spec_path, self.behaviour = Path(work_dir), spec_path, behaviour
        self.env_overrides = env_overrides or {}
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.cert_pem = self_signed_certificate(self.work_dir) if tls else None
        self.version, self.termination_s = version, termination_s
        self.store: dict[tuple[str, str, str], dict] = {}
        self.lives: dict[str, PodLife] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.RLock()
        self._rv = itertools.count(1)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fake-apiserver", daemon=True)
        self.port = 0
        self._seed(node_gpus, node_rdma)

    # --- lifecycle -------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"{'https' if self.cert_pem else 'http'}://127.0.0.1:{self.port}"

    def start(self) -> "FakeApiServer":
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._serve(), self._loop).result(timeout=10)
        return self

    def stop(self) -> None:
        asyncio.run_coroutine_threadsafe(self._shutdown(), self._loop).result(timeout=20)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        for life in self.lives.values():
            self._kill(life)

    def kubeconfig(self, path: Path, namespace: str = "epdbench") -> Path:
        cluster = {"server": self.url}
        if self.cert_pem:
            cluster["certificate-authority-data"] = base64.b64encode(self.cert_pem).decode()
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "fake",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": "fake", "user": {"token": TOKEN}}],
            "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "fake", "namespace": namespace}}]}))
        return path

    async def _serve(self) -> None:
        app = web.Application(client_max_size=256 * 1024 ** 2, middlewares=[self._auth])
        app.router.add_get("/version", self._version)
        app.router.add_route("*", "/{tail:.*}", self._dispatch)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        tls = None
        if self.cert_pem:
            tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            tls.load_cert_chain(self.work_dir / "tls.crt", self.work_dir / "tls.key")
        site = web.TCPSite(self._runner, "127.0.0.1", 0, ssl_context=tls)
        await site.start()
        self.port = self._runner.addresses[0][1]
        self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600))
        self._kubelet = asyncio.ensure_future(self._kubelet_loop())

    async def _shutdown(self) -> None:
        self._kubelet.cancel()
        await self._session.close()
        await self._runner.cleanup()

    # --- test helpers ----------------------------------------------------------------------------
    def put(self, obj: dict, manager: str = "kubectl") -> dict:
        """Create an object directly (as another client would), e.g. a leftover or a PVC."""
        with self.lock:
            return self._write(obj, manager)

    def remove(self, kind: str, name: str, namespace: str = "epdbench") -> None:
        with self.lock:
            self.store.pop((PLURAL_OF[kind], namespace, name), None)

    def objects(self, kind: str | None = None, selector: str | None = None) -> list[dict]:
        with self.lock:
            return [o for (plural, _, _), o in self.store.items()
                    if (kind is None or o["kind"] == kind) and matches(o["metadata"].get("labels", {}), selector)]

    def labelled(self, selector: str) -> list[str]:
        """kind/name of every object matching the selector (events and nodes excluded)."""
        return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in self.objects(selector=selector)
                      if o["kind"] not in ("Event", "Node"))

    def running_processes(self) -> list[subprocess.Popen]:
        return [life.process for life in self.lives.values() if life.process and life.process.poll() is None]

    # --- storage ---------------------------------------------------------------------------------
    def _seed(self, node_gpus: int, node_rdma: int) -> None:
        for ns in ("default", "epdbench"):
            self._write({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, "kube")
        self._write({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true",
                                     "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(node_gpus), "rdma/rdma_shared_device_a": str(node_rdma),
                                       "cpu": "192", "memory": "2Ti"}}}, "kube")
        self._write({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                     "metadata": {"name": "hf-cache", "namespace": "epdbench"},
                     "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "500Gi"}}}},
                    "kubectl")

    def _key(self, obj: dict) -> tuple[str, str, str]:
        plural = PLURAL_OF[obj["kind"]]
        namespaced = RESOURCES[plural][2]
        return plural, obj["metadata"].get("namespace", "") if namespaced else "", obj["metadata"]["name"]

    def _write(self, obj: dict, manager: str) -> dict:
        key = self._key(obj)
        old = self.store.get(key)
        meta = obj.setdefault("metadata", {})
        if old:
            meta.update({k: old["metadata"][k] for k in ("uid", "creationTimestamp")})
            obj.setdefault("status", old.get("status", {}))
        else:
            meta.update(uid=str(uuid.uuid4()), creationTimestamp=now_stamp())
        meta["resourceVersion"] = str(next(self._rv))
        meta["managedFields"] = [{"manager": manager, "operation": "Apply"}]
        self.store[key] = obj
        return obj

    def _event(self, obj: dict, reason: str, message: str, kind: str = "Warning") -> None:
        ns = obj["metadata"]["namespace"]
        self._write({"apiVersion": "v1", "kind": "Event", "type": kind, "reason": reason, "message": message,
                     "lastTimestamp": now_stamp(),
                     "metadata": {"name": f"{obj['metadata']['name']}.{uuid.uuid4().hex[:12]}", "namespace": ns},
                     "involvedObject": {"kind": obj["kind"], "name": obj["metadata"]["name"], "namespace": ns,
                                        "uid": obj["metadata"]["uid"]}}, "kubelet")

    # --- HTTP ------------------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler):
        with self.lock:
            self.requests.append((request.method, request.path_qs))
        if request.headers.get("Authorization") != f"Bearer {TOKEN}":
            return status_body(401, "Unauthorized", "Unauthorized")
        return await handler(request)

    async def _version(self, request: web.Request) -> web.Response:
        major, minor = self.version
        return web.json_response({"major": major, "minor": minor, "gitVersion": f"v{major}.{minor}.0"})

    async def _dispatch(self, request: web.Request) -> web.StreamResponse:
        m = PATH.match(request.path)
        if not m or m["plural"] not in RESOURCES:
            return status_body(404, "NotFound", "the server could not find the requested resource")
        plural, ns, name, sub = m["plural"], m["ns"] or "", m["name"], m["sub"]
        if sub == "proxy":
            return await self._proxy(request, plural, ns, name, m["tail"] or "/")
        if sub == "portforward":
            return await self._portforward(request, ns, name)
        if sub == "log":
            return self._log(request, ns, name)
        handler = {("GET", False): self._list, ("GET", True): self._get, ("PATCH", True): self._apply,
                   ("DELETE", True): self._delete}.get((request.method, name is not None))
        if handler is None:
            return status_body(405, "MethodNotAllowed", f"{request.method} is not supported here")
        return await handler(request, plural, ns, name)

    async def _list(self, request: web.Request, plural: str, ns: str, name: None) -> web.Response:
        api_version, kind, _ = RESOURCES[plural]
        selector = request.query.get("labelSelector")
        with self.lock:
            items = [o for (p, n, _), o in self.store.items()
                     if p == plural and (not ns or n == ns) and matches(o["metadata"].get("labels", {}), selector)]
            return web.json_response({"apiVersion": api_version, "kind": f"{kind}List", "items": items,
                                      "metadata": {"resourceVersion": str(next(self._rv))}})

    async def _get(self, request: web.Request, plural: str, ns: str, name: str) -> web.Response:
        with self.lock:
            obj = self.store.get((plural, ns, name))
        if obj is None:
            return status_body(404, "NotFound", f'{plural} "{name}" not found')
        return web.json_response(obj)

    async def _apply(self, request: web.Request, plural: str, ns: str, name: str) -> web.Response:
        if request.content_type != "application/apply-patch+yaml":
            return status_body(415, "UnsupportedMediaType", "the body of the request was in an unknown format")
        manager = request.query.get("fieldManager")
        if not manager:
            return status_body(400, "BadRequest", "fieldManager is required for apply requests")
        obj = yaml.safe_load(await request.text())
        if obj.get("kind") != RESOURCES[plural][1] or obj.get("metadata", {}).get("name") != name:
            return status_body(400, "BadRequest", "the name or kind of the object does not match the URL")
        if obj["metadata"].setdefault("namespace", ns) != ns:
            return status_body(400, "BadRequest", "the namespace of the object does not match the URL")
        with self.lock:
            old = self.store.get((plural, ns, name))
            owners = {f["manager"] for f in (old or {}).get("metadata", {}).get("managedFields", [])}
            if old and manager not in owners and request.query.get("force") != "true":
                return status_body(409, "Conflict", f'Apply failed with 1 conflict: conflict with "{owners.pop()}"')
            obj = self._write(obj, manager)
            self._reconcile(obj)
        return web.json_response(obj, status=200 if old else 201)

    async def _delete(self, request: web.Request, plural: str, ns: str, name: str) -> web.Response:
        with self.lock:
            obj = self.store.get((plural, ns, name))
            if obj is None:
                return status_body(404, "NotFound", f'{plural} "{name}" not found')
            self._delete_object(obj)
        return web.json_response(obj)

    # --- controllers -----------------------------------------------------------------------------
    def _reconcile(self, obj: dict) -> None:
        if obj["kind"] == "StatefulSet":
            self._write(self._owned(obj, "ControllerRevision", f"{obj['metadata']['name']}-1",
                                    obj["spec"]["template"]["metadata"]["labels"], extra={"revision": 1}), "sts")
            for i in range(obj["spec"].get("replicas", 1)):
                self._ensure_pod(obj, f"{obj['metadata']['name']}-{i}")
        elif obj["kind"] == "Deployment":
            labels = {**obj["spec"]["template"]["metadata"]["labels"], "pod-template-hash": "5d8f9c7b6"}
            rs = self._write(self._owned(obj, "ReplicaSet", f"{obj['metadata']['name']}-5d8f9c7b6", labels,
                                         extra={"spec": {"replicas": obj["spec"].get("replicas", 1)}}), "rs")
            for i in range(obj["spec"].get("replicas", 1)):
                self._ensure_pod(rs, f"{rs['metadata']['name']}-x{i:04d}", template=obj["spec"]["template"])

    def _owned(self, owner: dict, kind: str, name: str, labels: dict, extra: dict | None = None) -> dict:
        api_version = RESOURCES[PLURAL_OF[kind]][0]
        return {"apiVersion": api_version, "kind": kind, **(extra or {}),
                "metadata": {"name": name, "namespace": owner["metadata"]["namespace"], "labels": dict(labels),
                             "ownerReferences": [{"kind": owner["kind"], "name": owner["metadata"]["name"],
                                                  "uid": owner["metadata"]["uid"]}]}}

    def _ensure_pod(self, owner: dict, name: str, template: dict | None = None) -> None:
        if ("pods", owner["metadata"]["namespace"], name) in self.store:
            return
        template = template or owner["spec"]["template"]
        pod = self._owned(owner, "Pod", name, template["metadata"]["labels"])
        pod["spec"] = json.loads(json.dumps(template["spec"]))
        pod["status"] = {"phase": "Pending", "conditions": []}
        pod = self._write(pod, "controller")
        self.lives[name] = PodLife(script=self.behaviour(pod))

    def _delete_object(self, obj: dict) -> None:
        """Delete now, or mark a pod terminating; dependents go too (background propagation)."""
        if obj["kind"] == "Pod":
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = now_stamp()
                self._loop.call_later(self.termination_s, self._reap, self._key(obj))
        else:
            self.store.pop(self._key(obj), None)
        for dependent in list(self.store.values()):
            owners = dependent["metadata"].get("ownerReferences", [])
            if any(o["uid"] == obj["metadata"]["uid"] for o in owners):
                self._delete_object(dependent)

    def _reap(self, key: tuple[str, str, str]) -> None:
        with self.lock:
            pod = self.store.pop(key, None)
        life = self.lives.pop(key[2], None) if pod else None
        if life:
            self._loop.run_in_executor(None, self._kill, life)

    @staticmethod
    def _kill(life: PodLife) -> None:
        if life.process and life.process.poll() is None:
            os.killpg(life.process.pid, signal.SIGTERM)
            try:
                life.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(life.process.pid, signal.SIGKILL)
                life.process.wait(timeout=5)

    # --- kubelet ---------------------------------------------------------------------------------
    async def _kubelet_loop(self) -> None:
        while True:
            with self.lock:
                pods = [o for (p, _, _), o in self.store.items() if p == "pods"
                        and not o["metadata"].get("deletionTimestamp")]
            for pod in pods:
                life = self.lives.get(pod["metadata"]["name"])
                if life and not life.ready:
                    await self._step(pod, life)
            await asyncio.sleep(TICK_S)

    async def _step(self, pod: dict, life: PodLife) -> None:
        if not life.started:
            with self.lock:
                self._begin(pod, life)
            return
        if life.script == RUN and life.port and await self._healthy(life.port):
            with self.lock:
                life.ready = True
                self._set_status(pod, "Running", ready=True)

    def _begin(self, pod: dict, life: PodLife) -> None:
        """First kubelet pass over a pod: schedule it (or not) and start its container (or fail)."""
        script = life.script
        if script == UNSCHEDULABLE:
            message = "0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available."
            pod["status"] = {"phase": "Pending", "conditions": [
                {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}]}
            self._event(pod, "FailedScheduling", message)
            life.started = True
            return
        pod["spec"]["nodeName"] = NODE
        if script == IMAGE_PULL:
            image = pod["spec"]["containers"][0]["image"]
            self._set_status(pod, "Pending", waiting=("ImagePullBackOff", f'Back-off pulling image "{image}"'))
            self._event(pod, "Failed", f'Failed to pull image "{image}": manifest unknown')
        elif script == CRASH_LOOP:
            life.lines = [(now_stamp(), CRASH_LOG.strip())]
            self._set_status(pod, "Running", waiting=("CrashLoopBackOff", "back-off 40s restarting failed container"),
                             restarts=3)
            self._event(pod, "BackOff", "Back-off restarting failed container")
        elif script == NOT_READY:
            self._set_status(pod, "Running")
            self._event(pod, "Unhealthy", "Readiness probe failed: connect: connection refused")
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
        pod["metadata"]["resourceVersion"] = str(next(self._rv))

    def _start_process(self, pod: dict, life: PodLife) -> bool:
        labels = pod["metadata"]["labels"]
        config, role = labels["epdbench/config"], labels["epdbench/role"]
        if role == "router":
            cmd = self._router_command(pod, config)
            if cmd is None:
                return False
        else:
            ordinal = pod["metadata"]["name"].rsplit("-", 1)[1]
            life.port = free_port()
            cmd = [sys.executable, "-m", "epdbench.sim.server", "--spec", str(self.spec_path), "--config", config,
                   "--role", role, "--replica", ordinal, "--port", str(life.port)]
            if role == "prefill":
                cmd += ["--bootstrap-port", str(free_port())]
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT),
               **{e["name"]: e["value"] for e in pod["spec"]["containers"][0].get("env", []) if "value" in e},
               **self.env_overrides}
        life.log_path = self.work_dir / f"{pod['metadata']['name']}.log"
        with open(life.log_path, "ab") as fh:
            life.process = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env=env, cwd=ROOT, start_new_session=True)
        self._set_status(pod, "Running")
        return True

    def _router_command(self, pod: dict, config: str) -> list[str] | None:
        """sim.proxy in front of the configuration's engines, once every engine process exists."""
        engines = [o for (p, _, _), o in self.store.items() if p == "pods"
                   and o["metadata"]["labels"].get("epdbench/config") == config
                   and o["metadata"]["labels"].get("epdbench/role") != "router"]
        lives = [self.lives.get(o["metadata"]["name"]) for o in engines]
        if not engines or any(life is None or life.port is None for life in lives):
            return None
        self.lives[pod["metadata"]["name"]].port = port = free_port()
        cmd = [sys.executable, "-m", "epdbench.sim.proxy", "--port", str(port)]
        for engine, life in sorted(zip(engines, lives), key=lambda e: e[0]["metadata"]["name"]):
            cmd += [f"--{engine['metadata']['labels']['epdbench/role']}", f"http://127.0.0.1:{life.port}"]
        return cmd

    async def _healthy(self, port: int) -> bool:
        try:
            async with self._session.get(f"http://127.0.0.1:{port}/health",
                                         timeout=aiohttp.ClientTimeout(total=HEALTH_TIMEOUT_S)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
            return False

    # --- subresources ----------------------------------------------------------------------------
    def _pod_and_life(self, ns: str, name: str) -> tuple[dict | None, PodLife | None]:
        with self.lock:
            return self.store.get(("pods", ns, name)), self.lives.get(name)

    def _log(self, request: web.Request, ns: str, name: str) -> web.Response:
        pod, life = self._pod_and_life(ns, name)
        if pod is None:
            return status_body(404, "NotFound", f'pods "{name}" not found')
        containers = [c["name"] for c in pod["spec"]["containers"]]
        container = request.query.get("container", containers[0])
        if container not in containers:
            return status_body(400, "BadRequest", f"container {container} is not valid for pod {name}")
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

    def _backend_port(self, plural: str, ns: str, name: str) -> int | None:
        """Port of the process behind a pod (pods/NAME:PORT) or a ready pod of a service (services/NAME:PORT)."""
        name = name.split(":", 1)[0]
        with self.lock:
            if plural == "pods":
                life = self.lives.get(name)
                return life.port if life and life.ready else None
            service = self.store.get(("services", ns, name))
            if service is None:
                return None
            for (p, n, pod_name), pod in self.store.items():
                life = self.lives.get(pod_name)
                if p == "pods" and n == ns and matches(pod["metadata"]["labels"], ",".join(
                        f"{k}={v}" for k, v in service["spec"]["selector"].items())) and life and life.ready:
                    return life.port
        return None

    async def _proxy(self, request: web.Request, plural: str, ns: str, name: str, tail: str) -> web.StreamResponse:
        port = self._backend_port(plural, ns, name)
        if port is None:
            return status_body(503, "ServiceUnavailable", f'no endpoints available for {plural[:-1]} "{name}"')
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        query = f"?{request.query_string}" if request.query_string else ""
        async with self._session.request(request.method, f"http://127.0.0.1:{port}{tail}{query}", headers=headers,
                                         data=await request.read()) as upstream:
            return await stream_back(request, upstream, HOP_HEADERS)

    async def _portforward(self, request: web.Request, ns: str, name: str) -> web.StreamResponse:
        """v4.channel.k8s.io: per port a data channel (0) and an error channel (1), each opened with
        a frame carrying the port number (little endian); then data frames prefixed by their channel."""
        port = int(request.query.get("ports", "0"))
        backend = self._backend_port("pods", ns, name)
        ws = web.WebSocketResponse(protocols=("v4.channel.k8s.io",))
        await ws.prepare(request)
        await ws.send_bytes(bytes([0]) + port.to_bytes(2, "little"))
        await ws.send_bytes(bytes([1]) + port.to_bytes(2, "little"))
        if backend is None:
            await ws.send_bytes(bytes([1]) + f"pod {name} is not running".encode())
            await ws.close()
            return ws
        reader, writer = await asyncio.open_connection("127.0.0.1", backend)

        async def to_pod() -> None:
            async for msg in ws:
                if msg.type == aiohttp.WSMsgType.BINARY and msg.data[:1] == b"\x00":
                    writer.write(msg.data[1:])
                    await writer.drain()
            writer.close()

        async def from_pod() -> None:
            while data := await reader.read(65536):
                await ws.send_bytes(b"\x00" + data)
            await ws.close()

        await asyncio.gather(to_pod(), from_pod(), return_exceptions=True)
        return ws


SPEC_PATH = Path(__file__).parent / "data" / "k8s-tiny.yaml"


@pytest.fixture
def cluster(tmp_path):
    """Factory of fake API servers fronting the simulator with SPEC_PATH; all stopped after the test."""
    started: list[FakeApiServer] = []

    def start(**options) -> FakeApiServer:
        fake = FakeApiServer(tmp_path / f"cluster-{len(started)}", SPEC_PATH, **options).start()
        started.append(fake)
        return fake

    yield start
    for fake in started:
        fake.stop()


def k8s_spec(kubeconfig: Path, **kube):
    """The tiny Kubernetes spec, pointed at a fake's kubeconfig, with target overrides."""
    from epdbench.specs.models import load_spec, parse_spec
    data = load_spec(str(SPEC_PATH)).model_dump(mode="json")
    data["target"]["kubernetes"].update(kubeconfig=str(kubeconfig), **kube)
    return parse_spec(data, "k8s-tiny")


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.05) -> bool:
    """Poll a condition from a test, bounded in time."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval_s)
    return predicate()
