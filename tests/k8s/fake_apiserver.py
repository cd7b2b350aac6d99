"""An in-process fake Kubernetes API server for tests (HTTP or HTTPS on 127.0.0.1, free port, its own thread):
the API itself (auth, server-side apply, get/list/delete, tiny controllers) and the pytest fixtures around it."""
from __future__ import annotations

import asyncio
import base64
import datetime as dt
import json
import re
import ssl
import subprocess
import threading
import time
import uuid
from pathlib import Path
from typing import Callable

import aiohttp
import pytest
import yaml
from aiohttp import web

from tests.k8s.fake_kubelet import (CRASH_LOG, CRASH_LOOP, IMAGE_PULL, NODE, NOT_READY, READY, RUN, UNSCHEDULABLE,
                                    Kubelet)
from tests.k8s.fake_objects import PLURAL_OF, RESOURCES, Key, ObjectStore, now_stamp, status_body
from tests.k8s.fake_proxy import PodProxy

__all__ = ["FakeApiServer", "cluster", "k8s_spec", "wait_until", "SPEC_PATH", "TOKEN",
           "RUN", "READY", "UNSCHEDULABLE", "IMAGE_PULL", "CRASH_LOOP", "NOT_READY", "CRASH_LOG"]

TOKEN = "fake-token"
SPEC_PATH = Path(__file__).parent / "data" / "k8s-tiny.yaml"
PATH = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))"
                  r"(?:/namespaces/(?P<ns>[^/]+)(?=/))?/(?P<plural>[a-z]+)(?:/(?P<name>[^/]+))?"
                  r"(?:/(?P<sub>log|portforward|proxy)(?P<tail>/.*)?)?$")


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


class FakeApiServer:
    """Answers the calls epdbench makes the way the real server does: bearer-token auth (401), server-side apply
    PATCH (415 without the apply content type, 409 on a conflict without force), GET/LIST with label selectors,
    DELETE (404 when gone; pods terminate after termination_s) with garbage collection of dependents, events,
    nodes, version. StatefulSets and Deployments get pods, which its Kubelet runs by the test's `behaviour`
    script; pod logs go to the kubelet, the proxy and port-forward subresources to its PodProxy."""

    def __init__(self, work_dir: Path, spec_path: Path | None = None,
                 behaviour: Callable[[dict], str] = lambda pod: RUN, version: tuple[str, str] = ("1", "31"),
                 node_gpus: int = 8, node_rdma: int = 16, termination_s: float = 0.2,
                 env_overrides: dict[str, str] | None = None, tls: bool = False):
        self.work_dir, self.spec_path = Path(work_dir), spec_path
        self.work_dir.mkdir(parents=True, exist_ok=True)
        self.cert_pem = self_signed_certificate(self.work_dir) if tls else None
        self.version, self.termination_s = version, termination_s
        self.store = ObjectStore()
        self.kubelet = Kubelet(self.store, self.work_dir, spec_path, behaviour, env_overrides or {})
        self.requests: list[tuple[str, str]] = []
        self.proxied: dict[tuple[str, str, str], Callable[[], tuple[int, str]]] = {}
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
        self.kubelet.kill_all()

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
        self.proxy = PodProxy(self.store, self.kubelet, self._session)
        self._kubelet_task = asyncio.ensure_future(self.kubelet.run(self._session))

    async def _shutdown(self) -> None:
        self._kubelet_task.cancel()
        await self._session.close()
        await self._runner.cleanup()

    # --- test helpers ----------------------------------------------------------------------------
    def put(self, obj: dict, manager: str = "kubectl") -> dict:
        """Create an object directly (as another client would), e.g. a leftover or a PVC."""
        with self.store.lock:
            return self.store.write(obj, manager)

    def serve_proxy(self, plural: str, namespace: str, name: str, respond: Callable[[], tuple[int, str]]) -> None:
        """Answer the proxy subresource of `plural/name` (e.g. pods, "exporter-x:9400") with respond()'s
        (status, text) at every request, whatever the tail: a process outside the fake kubelet, e.g. a DaemonSet's
        pod in another namespace."""
        self.proxied[(plural, namespace, name)] = respond

    def remove(self, kind: str, name: str, namespace: str = "epdbench") -> None:
        with self.store.lock:
            self.store.pop((PLURAL_OF[kind], namespace, name))

    def objects(self, kind: str | None = None, selector: str | None = None) -> list[dict]:
        return self.store.find(kind=kind, selector=selector)

    def labelled(self, selector: str) -> list[str]:
        """kind/name of every object matching the selector (events and nodes excluded)."""
        return sorted(f"{o['kind']}/{o['metadata']['name']}" for o in self.objects(selector=selector)
                      if o["kind"] not in ("Event", "Node"))

    def running_processes(self) -> list[subprocess.Popen]:
        return self.kubelet.running_processes()

    def _seed(self, node_gpus: int, node_rdma: int) -> None:
        for ns in ("default", "epdbench"):
            self.store.write({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}, "kube")
        self.store.write({"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": NODE, "labels": {"kubernetes.io/hostname": NODE, "nvidia.com/gpu.present": "true",
                                     "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}},
            "status": {"allocatable": {"nvidia.com/gpu": str(node_gpus), "rdma/rdma_shared_device_a": str(node_rdma),
                                       "cpu": "192", "memory": "2Ti"}}}, "kube")
        self.store.write({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
                          "metadata": {"name": "hf-cache", "namespace": "epdbench"},
                          "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "500Gi"}}}},
                         "kubectl")

    # --- HTTP ------------------------------------------------------------------------------------
    @web.middleware
    async def _auth(self, request: web.Request, handler):
        with self.store.lock:
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
        if sub == "proxy" and (plural, ns, name) in self.proxied:
            code, text = self.proxied[(plural, ns, name)]()
            return web.Response(status=code, text=text, content_type="text/plain")
        if sub == "proxy":
            return await self.proxy.proxy(request, plural, ns, name, m["tail"] or "/")
        if sub == "portforward":
            return await self.proxy.portforward(request, ns, name)
        if sub == "log":
            return self.kubelet.log(request, ns, name)
        handler = {("GET", False): self._list, ("GET", True): self._get, ("PATCH", True): self._apply,
                   ("DELETE", True): self._delete, ("POST", False): self._create}.get((request.method, name is not None))
        if handler is None:
            return status_body(405, "MethodNotAllowed", f"{request.method} is not supported here")
        return await handler(request, plural, ns, name)

    async def _list(self, request: web.Request, plural: str, ns: str, name: None) -> web.Response:
        api_version, kind, _ = RESOURCES[plural]
        with self.store.lock:
            items = self.store.find(plural, ns, selector=request.query.get("labelSelector"))
            return web.json_response({"apiVersion": api_version, "kind": f"{kind}List", "items": items,
                                      "metadata": {"resourceVersion": self.store.next_version()}})

    async def _get(self, request: web.Request, plural: str, ns: str, name: str) -> web.Response:
        with self.store.lock:
            obj = self.store.get(plural, ns, name)
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
        with self.store.lock:
            if ns and self.store.get("namespaces", "", ns) is None:
                return status_body(404, "NotFound", f'namespaces "{ns}" not found')
            old = self.store.get(plural, ns, name)
            owners = {f["manager"] for f in (old or {}).get("metadata", {}).get("managedFields", [])}
            if old and manager not in owners and request.query.get("force") != "true":
                return status_body(409, "Conflict", f'Apply failed with 1 conflict: conflict with "{owners.pop()}"')
            obj = self.store.write(obj, manager)
            self._reconcile(obj)
        return web.json_response(obj, status=200 if old else 201)

    async def _create(self, request: web.Request, plural: str, ns: str, name: None) -> web.Response:
        """POST to a collection (as client libraries create objects): metadata.generateName gets a suffix."""
        obj = json.loads(await request.text())
        meta = obj.setdefault("metadata", {})
        if obj.get("kind") != RESOURCES[plural][1]:
            return status_body(400, "BadRequest", "the kind of the object does not match the URL")
        if "name" not in meta:
            if "generateName" not in meta:
                return status_body(422, "Invalid", "name or generateName is required")
            meta["name"] = meta["generateName"] + uuid.uuid4().hex[:5]
        if meta.setdefault("namespace", ns) != ns:
            return status_body(400, "BadRequest", "the namespace of the object does not match the URL")
        with self.store.lock:
            if self.store.get(plural, ns, meta["name"]) is not None:
                return status_body(409, "AlreadyExists", f'{plural} "{meta["name"]}" already exists')
            obj = self.store.write(obj, request.query.get("fieldManager", "client"))
            self._reconcile(obj)
        return web.json_response(obj, status=201)

    async def _delete(self, request: web.Request, plural: str, ns: str, name: str) -> web.Response:
        with self.store.lock:
            obj = self.store.get(plural, ns, name)
            if obj is None:
                return status_body(404, "NotFound", f'{plural} "{name}" not found')
            self._delete_object(obj)
        return web.json_response(obj)

    # --- controllers -----------------------------------------------------------------------------
    def _reconcile(self, obj: dict) -> None:
        if obj["kind"] == "StatefulSet":
            self.store.write(self._owned(obj, "ControllerRevision", f"{obj['metadata']['name']}-1",
                                         obj["spec"]["template"]["metadata"]["labels"], extra={"revision": 1}), "sts")
            for i in range(obj["spec"].get("replicas", 1)):
                self._ensure_pod(obj, f"{obj['metadata']['name']}-{i}")
        elif obj["kind"] == "Deployment":
            labels = {**obj["spec"]["template"]["metadata"]["labels"], "pod-template-hash": "5d8f9c7b6"}
            rs = self.store.write(self._owned(obj, "ReplicaSet", f"{obj['metadata']['name']}-5d8f9c7b6", labels,
                                              extra={"spec": {"replicas": obj["spec"].get("replicas", 1)}}), "rs")
            for i in range(obj["spec"].get("replicas", 1)):
                self._ensure_pod(rs, f"{rs['metadata']['name']}-x{i:04d}", template=obj["spec"]["template"])
        elif obj["kind"] == "Job" and not self.store.find("pods", obj["metadata"]["namespace"],
                                                           selector=f"job-name={obj['metadata']['name']}"):
            obj["status"] = {"active": 1}
            template = json.loads(json.dumps(obj["spec"]["template"]))
            template["metadata"]["labels"]["job-name"] = obj["metadata"]["name"]
            self._ensure_pod(obj, f"{obj['metadata']['name']}-j7k2q", template=template)

    @staticmethod
    def _owned(owner: dict, kind: str, name: str, labels: dict, extra: dict | None = None) -> dict:
        api_version = RESOURCES[PLURAL_OF[kind]][0]
        return {"apiVersion": api_version, "kind": kind, **(extra or {}),
                "metadata": {"name": name, "namespace": owner["metadata"]["namespace"], "labels": dict(labels),
                             "ownerReferences": [{"kind": owner["kind"], "name": owner["metadata"]["name"],
                                                  "uid": owner["metadata"]["uid"]}]}}

    def _ensure_pod(self, owner: dict, name: str, template: dict | None = None) -> None:
        if self.store.get("pods", owner["metadata"]["namespace"], name) is not None:
            return
        template = template or owner["spec"]["template"]
        pod = self._owned(owner, "Pod", name, template["metadata"]["labels"])
        pod["spec"] = json.loads(json.dumps(template["spec"]))
        pod["status"] = {"phase": "Pending", "conditions": []}
        self.kubelet.admit(self.store.write(pod, "controller"))

    def _delete_object(self, obj: dict) -> None:
        """Delete now, or mark a pod terminating; dependents go too (background propagation)."""
        if obj["kind"] == "Pod":
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = now_stamp()
                self._loop.call_later(self.termination_s, self._reap, self.store.key(obj))
        else:
            self.store.pop(self.store.key(obj))
        for dependent in list(self.store.objects.values()):
            owners = dependent["metadata"].get("ownerReferences", [])
            if any(o["uid"] == obj["metadata"]["uid"] for o in owners):
                self._delete_object(dependent)

    def _reap(self, key: Key) -> None:
        with self.store.lock:
            pod = self.store.pop(key)
        if pod:
            self.kubelet.release(key[2])


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
