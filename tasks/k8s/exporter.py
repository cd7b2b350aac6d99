"""Where to read NVIDIA's DCGM exporter for a configuration (pure): from the exporter's Service and its
EndpointSlices, the exporter pod on each node the configuration's GPU pods run on, read through the API server's
pod proxy (`/api/v1/namespaces/NS/pods/POD:PORT/proxy/metrics`). The exporter is a DaemonSet, one pod per GPU
node, and a Service proxy would reach any one of them at random; only when the EndpointSlices cannot be read is
the Service's proxy used, and then said. The default reference is the GPU Operator's exporter (NVIDIA/gpu-operator,
assets/state-dcgm-exporter/0600_service.yaml: Service nvidia-dcgm-exporter, port gpu-metrics 9400, in the
operator's namespace, `gpu-operator` as its install guide has it). Functions of API dicts only; no client, no I/O."""
from __future__ import annotations

from dataclasses import dataclass

METRICS_PATH = "/metrics"
SERVICE_NAME_LABEL = "kubernetes.io/service-name"   # how EndpointSlices name their Service


class ExporterUnavailable(Exception):
    """The exporter cannot be read for this configuration; the message says why, in one line."""


@dataclass(frozen=True)
class ExporterRef:
    namespace: str
    service: str
    port: str   # number or name of the Service's port

    @classmethod
    def parse(cls, text: str) -> "ExporterRef":
        """`namespace/name:port` (specs' SERVICE_REF has already checked its form)."""
        namespace, _, rest = text.partition("/")
        service, _, port = rest.partition(":")
        return cls(namespace, service, port)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.service}:{self.port}"

    @property
    def slice_selector(self) -> str:
        return f"{SERVICE_NAME_LABEL}={self.service}"

    def service_proxy_path(self) -> str:
        return f"/api/v1/namespaces/{self.namespace}/services/{self.service}:{self.port}/proxy{METRICS_PATH}"

    def pod_proxy_path(self, pod: str, port: int) -> str:
        return f"/api/v1/namespaces/{self.namespace}/pods/{pod}:{port}/proxy{METRICS_PATH}"


@dataclass(frozen=True)
class ScrapeTarget:
    name: str    # the exporter pod (or the Service, for its proxy)
    node: str    # the node it reads ("" through the Service: any)
    path: str    # API server path of its /metrics


def service_port(ref: ExporterRef, service: dict) -> dict:
    """The Service's port `ref.port` names (by number or name), or ExporterUnavailable."""
    ports = service.get("spec", {}).get("ports") or []
    found = next((p for p in ports if str(p.get("port")) == ref.port or p.get("name") == ref.port), None)
    if found is None:
        have = ", ".join(f"{p.get('name') or '(unnamed)'} {p.get('port')}" for p in ports) or "none"
        raise ExporterUnavailable(f"Service {ref.namespace}/{ref.service} has no port {ref.port} (its ports: {have})")
    return found


def scrape_targets(ref: ExporterRef, service: dict, slices: list[dict] | None,
                   nodes: set[str]) -> tuple[list[ScrapeTarget], str | None]:
    """The exporter pods to read for GPU pods on `nodes`, and a note to say once (or None). `slices` are the
    Service's EndpointSlices, None when they could not be read (then the Service's proxy, with a note).
    ExporterUnavailable when the Service has no such port or no ready exporter pod on those nodes."""
    port = service_port(ref, service)
    if slices is None:
        return ([ScrapeTarget(ref.service, "", ref.service_proxy_path())],
                "the exporter's EndpointSlices could not be read: reading it through its Service, which picks one "
                "exporter pod at random; with GPU pods on several nodes, only the scrapes that reach their node "
                "see them")
    name = port.get("name") or ""
    targets: dict[str, ScrapeTarget] = {}
    elsewhere: set[str] = set()
    for piece in slices:
        number = next((p.get("port") for p in piece.get("ports") or [] if (p.get("name") or "") == name), None)
        if number is None:
            continue
        for endpoint in piece.get("endpoints") or []:
            pod, node = endpoint.get("targetRef") or {}, endpoint.get("nodeName") or ""
            if pod.get("kind") != "Pod" or (endpoint.get("conditions") or {}).get("ready") is False:
                continue
            if node in nodes:
                targets.setdefault(node, ScrapeTarget(pod["name"], node, ref.pod_proxy_path(pod["name"], number)))
            else:
                elsewhere.add(node)
    missing = sorted(nodes - set(targets))
    if not targets:
        where = f"; it runs on {', '.join(sorted(elsewhere))}" if elsewhere else ""
        raise ExporterUnavailable(f"no ready pod of {ref} on node(s) {', '.join(sorted(nodes))}{where}")
    note = (f"no ready pod of {ref} on node(s) {', '.join(missing)}: their GPUs are not read" if missing else None)
    return [targets[n] for n in sorted(targets)], note
