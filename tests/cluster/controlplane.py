"""A whole Kubernetes control plane on loopback, from the binaries tests/cluster/build.py made: etcd, then
kube-apiserver (its own serving certificate from --cert-dir, a token file, RBAC, service-account keys made at
start), kube-controller-manager, kube-scheduler and kwok, each started after the one before answers its
readiness endpoint. kwok keeps the Node objects this module creates (the GPU node's labels, capacity and
allocatable) initialised and heart-beating, finalises deleted pods, and serves the kubelet API (pods/log,
pods/portforward) the API server proxies to, from the per-pod Logs and PortForward objects the pod player
(tests/cluster/kubelet.py) writes.

Every address is loopback: the API server, etcd, the controllers' and kwok's own servers; the node's InternalIP
is 127.0.0.1 (the API server dials the kubelet API there). Pod IPs are the player's, in a private range where
nothing listens, and nothing is ever sent to them: the runs reach pods through the API server's port-forward.
"""
from __future__ import annotations

import base64
import datetime as dt
import json
import os
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from epdbench.tasks.proc.processes import free_port, spawn, stop_process

ADMIN_TOKEN = "epdbench-cluster-admin"
NODE = "gpu-node-1"
START_TIMEOUT_S = 120
SERVICE_CIDR = "10.96.0.0/16"     # Services' cluster IPs: allocated, never dialled (no kube-proxy, no DNS)
# The stages kwok runs: nodes ready and heart-beating, deleted pods finalised. Not kwok's pod-ready or
# pod-complete: they would mark every pod Ready (or a Job's pod done) the moment it is scheduled, before the
# process it stands for serves; the pod player writes those states from the process, as a kubelet does.
# Every namespaced kind a run creates or makes (the controllers' ReplicaSets, ControllerRevisions, EndpointSlices
# included): what `labelled` lists.
NAMESPACED = [("/api/v1", "pods"), ("/api/v1", "services"), ("/api/v1", "configmaps"), ("/api/v1", "serviceaccounts"),
              ("/apis/apps/v1", "statefulsets"), ("/apis/apps/v1", "deployments"), ("/apis/apps/v1", "replicasets"),
              ("/apis/apps/v1", "controllerrevisions"), ("/apis/batch/v1", "jobs"),
              ("/apis/rbac.authorization.k8s.io/v1", "roles"), ("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
              ("/apis/discovery.k8s.io/v1", "endpointslices")]
KWOK_STAGES = ("node-initialize.yaml", "node-heartbeat-with-lease.yaml", "pod-delete.yaml")


def _cert(directory: Path, name: str) -> tuple[Path, Path]:
    """A self-signed serving certificate for 127.0.0.1 and localhost (kwok's kubelet API)."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                                        x509.DNSName("localhost")]), False)
            .sign(key, hashes.SHA256()))
    crt, pem = directory / f"{name}.crt", directory / f"{name}.key"
    crt.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pem.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return crt, pem


def _service_account_key(path: Path) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))
    return path


@dataclass
class Component:
    name: str
    process: subprocess.Popen
    log: Path
    ready_url: str

    def tail(self, n: int = 8) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


@dataclass
class ControlPlane:
    bin_dir: Path
    work_dir: Path
    node_gpus: int = 8
    node_rdma: dict[str, int] = field(default_factory=dict)     # RDMA resources the node offers, by name
    node_labels: dict[str, str] = field(default_factory=dict)
    components: list[Component] = field(default_factory=list)
    api_port: int = 0
    kwok_port: int = 0

    # --- addresses and credentials ----------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def ca_file(self) -> Path:
        """The API server's self-signed serving certificate and its CA, as --cert-dir wrote them."""
        return self.work_dir / "apiserver-certs" / "apiserver.crt"

    def kubeconfig(self, path: Path, token: str = ADMIN_TOKEN, namespace: str = "epdbench") -> Path:
        path.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": "cluster",
            "clusters": [{"name": "cluster", "cluster": {
                "server": self.url, "certificate-authority-data": base64.b64encode(self.ca_file.read_bytes()).decode()}}],
            "users": [{"name": "user", "user": {"token": token}}],
            "contexts": [{"name": "cluster", "context": {"cluster": "cluster", "user": "user",
                                                          "namespace": namespace}}]}))
        return path

    def request(self, method: str, path: str, body=None, token: str = ADMIN_TOKEN,
                content_type: str = "application/json", timeout_s: float = 30) -> tuple[int, dict]:
        """One API call as the given token: (HTTP status, JSON body)."""
        data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
        req = urllib.request.Request(self.url + path, data=data, method=method, headers={
            "Authorization": f"Bearer {token}", "Content-Type": content_type, "Accept": "application/json"})
        ctx = ssl.create_default_context(cafile=str(self.ca_file))
        try:
            with urllib.request.urlopen(req, context=ctx, timeout=timeout_s) as r:
                return r.status, json.loads(r.read() or b"{}")
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                return e.code, json.loads(raw or b"{}")
            except ValueError:
                return e.code, {"message": raw.decode(errors="replace")}

    def labelled(self, namespace: str, selector: str) -> list[str]:
        """`plural/name` of every object of the kinds a run creates or makes (NAMESPACED) that the selector matches
        in the namespace: what must be gone after a teardown."""
        out = []
        for root, plural in NAMESPACED:
            status, body = self.request("GET", f"{root}/namespaces/{namespace}/{plural}?labelSelector={selector}")
            if status != 200:
                raise RuntimeError(f"list {plural} in {namespace}: HTTP {status} {body.get('message')}")
            out += [f"{plural}/{o['metadata']['name']}" for o in body.get("items", [])]
        return sorted(out)

    def ensure_namespace(self, name: str) -> str:
        status, body = self.request("POST", "/api/v1/namespaces",
                                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if status not in (201, 409):
            raise RuntimeError(f"namespace {name}: HTTP {status} {body.get('message')}")
        return name

    # --- start and stop ---------------------------------------------------------------------------------------
    def start(self) -> "ControlPlane":
        self.work_dir.mkdir(parents=True, exist_ok=True)
        try:
            self._start_etcd()
            self._start_apiserver()
            self._start_controllers()
            self._apply_kwok_crds()
            self._start_kwok()
            self.add_node(NODE)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        for c in reversed(self.components):
            stop_process(c.process, grace_s=5)
        self.components.clear()

    def _spawn(self, name: str, cmd: list[str], ready_url: str, token: str | None = None,
               verify: Path | None | bool = False) -> Component:
        log = self.work_dir / f"{name}.log"
        comp = Component(name, spawn(cmd, log, dict(os.environ), f"cluster {name}"), log, ready_url)
        self.components.append(comp)
        self._wait_ready(comp, token, verify)
        return comp

    def _wait_ready(self, comp: Component, token: str | None, verify) -> None:
        if verify is False:
            ctx = ssl._create_unverified_context()
        else:
            ctx = ssl.create_default_context(cafile=str(verify)) if verify else None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if comp.process.poll() is not None:
                raise RuntimeError(f"{comp.name} exited ({comp.process.returncode}) at start:\n{comp.tail()}")
            try:
                req = urllib.request.Request(comp.ready_url, headers=headers)
                with urllib.request.urlopen(req, timeout=2, context=ctx if comp.ready_url.startswith("https")
                                            else None) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError, ssl.SSLError) as e:
                last = str(e)
            time.sleep(0.2)
        raise RuntimeError(f"{comp.name} not ready at {comp.ready_url} after {START_TIMEOUT_S} s ({last}):\n"
                           f"{comp.tail()}")

    def _start_etcd(self) -> None:
        client, peer = free_port("127.0.0.1"), free_port("127.0.0.1")
        self.etcd_url = f"http://127.0.0.1:{client}"
        self._spawn("etcd", [str(self.bin_dir / "etcd"), "--name", "epdbench", "--data-dir",
                             str(self.work_dir / "etcd-data"), "--listen-client-urls", self.etcd_url,
                             "--advertise-client-urls", self.etcd_url,
                             "--listen-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
                             "--initial-cluster", f"epdbench=http://127.0.0.1:{peer}",
                             "--listen-metrics-urls", f"http://127.0.0.1:{free_port('127.0.0.1')}",
                             "--unsafe-no-fsync", "--log-level", "warn"],
                    f"{self.etcd_url}/readyz")

    def _start_apiserver(self, restart: bool = False) -> None:
        if not restart:
            self.api_port = free_port("127.0.0.1")
            (self.work_dir / "tokens.csv").write_text(f'{ADMIN_TOKEN},cluster-admin,cluster-admin,"system:masters"\n')
            self.sa_key = _service_account_key(self.work_dir / "service-account.key")
        self._spawn("kube-apiserver", [
            str(self.bin_dir / "kube-apiserver"), "--etcd-servers", self.etcd_url,
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(self.api_port),
            "--cert-dir", str(self.work_dir / "apiserver-certs"),
            "--token-auth-file", str(self.work_dir / "tokens.csv"), "--authorization-mode", "Node,RBAC",
            "--service-account-key-file", str(self.sa_key), "--service-account-signing-key-file", str(self.sa_key),
            "--service-account-issuer", "https://kubernetes.default.svc.cluster.local",
            "--service-cluster-ip-range", SERVICE_CIDR, "--kubelet-preferred-address-types", "InternalIP",
            "--allow-privileged=true", "--endpoint-reconciler-type", "none",
            "--enable-priority-and-fairness=false"],
            f"{self.url}/readyz", token=ADMIN_TOKEN, verify=False)

    def restart_apiserver(self, down_s: float = 0.0) -> None:
        """Stop kube-apiserver, wait `down_s`, start it again on the same port, certificate and etcd."""
        comp = next(c for c in self.components if c.name == "kube-apiserver")
        stop_process(comp.process, grace_s=5)
        self.components.remove(comp)
        time.sleep(down_s)
        self._start_apiserver(restart=True)

    def _start_controllers(self) -> None:
        kubeconfig = self.kubeconfig(self.work_dir / "admin.kubeconfig", namespace="default")
        kcm = free_port("127.0.0.1")
        self._spawn("kube-controller-manager", [
            str(self.bin_dir / "kube-controller-manager"), "--kubeconfig", str(kubeconfig),
            "--authentication-kubeconfig", str(kubeconfig), "--authorization-kubeconfig", str(kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(kcm), "--leader-elect=false",
            "--use-service-account-credentials", "--service-account-private-key-file", str(self.sa_key),
            "--root-ca-file", str(self.ca_file), "--controllers", "*",
            "--concurrent-gc-syncs", "4", "--node-monitor-grace-period", "60s"],
            f"https://127.0.0.1:{kcm}/healthz")
        sched = free_port("127.0.0.1")
        self._spawn("kube-scheduler", [
            str(self.bin_dir / "kube-scheduler"), "--kubeconfig", str(kubeconfig),
            "--authentication-kubeconfig", str(kubeconfig), "--authorization-kubeconfig", str(kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(sched), "--leader-elect=false"],
            f"https://127.0.0.1:{sched}/readyz")

    def _apply_kwok_crds(self) -> None:
        for crd_file in sorted((self.bin_dir / "crds").glob("*.yaml")):
            crd = yaml.safe_load(crd_file.read_text())
            status, body = self.request("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", crd)
            if status not in (201, 409):
                raise RuntimeError(f"CRD {crd_file.name}: HTTP {status} {body.get('message')}")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:      # established: the kinds are served
            status, body = self.request("GET", "/apis/kwok.x-k8s.io/v1alpha1")
            names = {r["kind"] for r in body.get("resources", [])} if status == 200 else set()
            if {"Logs", "PortForward"} <= names:
                return
            time.sleep(0.2)
        raise RuntimeError("kwok's CRDs were not served after 30 s")

    def _start_kwok(self) -> None:
        self.kwok_port = free_port("127.0.0.1")
        crt, key = _cert(self.work_dir, "kwok")
        stages = [(self.bin_dir / "stages" / s).read_text() for s in KWOK_STAGES]
        config = self.work_dir / "kwok.yaml"
        config.write_text("---\n".join(stages))
        kubeconfig = self.work_dir / "admin.kubeconfig"
        self._spawn("kwok", [
            str(self.bin_dir / "kwok"), "--kubeconfig", str(kubeconfig), "--config", str(config),
            "--manage-all-nodes=true", "--node-ip", "127.0.0.1", "--node-port", str(self.kwok_port),
            "--server-address", f"127.0.0.1:{self.kwok_port}", "--tls-cert-file", str(crt),
            "--tls-private-key-file", str(key), "--node-lease-duration-seconds", "40",
            "--enable-crds", "Logs,PortForward"],
            f"https://127.0.0.1:{self.kwok_port}/healthz")

    def add_node(self, name: str) -> None:
        """A Node as the GPU node of a cluster offers it: its labels, GPUs and RDMA resources in capacity and
        allocatable (kwok's node-initialize keeps them and writes the rest of the status)."""
        resources = {"cpu": "192", "memory": "2Ti", "pods": "110", "ephemeral-storage": "4Ti",
                     "nvidia.com/gpu": str(self.node_gpus), **{k: str(v) for k, v in self.node_rdma.items()}}
        node = {"apiVersion": "v1", "kind": "Node", "metadata": {
            "name": name, "annotations": {"kwok.x-k8s.io/node": "fake"},
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64",
                       "type": "kwok", **self.node_labels}},
            "status": {"capacity": resources, "allocatable": resources}}
        status, body = self.request("POST", "/api/v1/nodes", node)
        if status not in (201, 409):
            raise RuntimeError(f"node {name}: HTTP {status} {body.get('message')}")
        # Ready (kwok's node-initialize), and without the not-ready taint the node lifecycle controller puts on a node
        # it first sees unready: until it lifts it the scheduler places nothing there, and retries with back-off.
        deadline, clear_since = time.monotonic() + 60, None
        while time.monotonic() < deadline:
            status, body = self.request("GET", f"/api/v1/nodes/{name}")
            ready = [c for c in body.get("status", {}).get("conditions", []) if c["type"] == "Ready"]
            if ready and ready[0]["status"] == "True" and not body.get("spec", {}).get("taints"):
                clear_since = clear_since or time.monotonic()
                if time.monotonic() - clear_since >= 1.0:
                    return
            else:
                clear_since = None
            time.sleep(0.2)
        raise RuntimeError(f"node {name} not Ready and untainted after 60 s (kwok, node lifecycle controller): "
                           f"{body.get('spec', {}).get('taints')}\n{self.components[-1].tail()}")
