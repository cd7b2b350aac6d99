"""tasks/k8s/exporter.py (pure): which DCGM exporter pod to read for a configuration's GPU nodes, from the
exporter's Service and EndpointSlices as the API returns them; the Service's proxy when the slices are unreadable."""
from __future__ import annotations

import pytest

from epdbench.tasks.k8s.exporter import ExporterRef, ExporterUnavailable, ScrapeTarget, scrape_targets

REF = ExporterRef.parse("gpu-operator/nvidia-dcgm-exporter:9400")
# The GPU Operator's Service (assets/state-dcgm-exporter/0600_service.yaml): port 9400 named gpu-metrics.
SERVICE = {"metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator"},
           "spec": {"selector": {"app": "nvidia-dcgm-exporter"},
                    "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}]}}


def endpoint(pod: str, node: str, ready: bool = True) -> dict:
    return {"addresses": ["10.0.0.1"], "conditions": {"ready": ready}, "nodeName": node,
            "targetRef": {"kind": "Pod", "name": pod, "namespace": "gpu-operator"}}


def slice_of(*endpoints: dict, port_name: str = "gpu-metrics", port: int = 9400) -> dict:
    return {"metadata": {"labels": {"kubernetes.io/service-name": "nvidia-dcgm-exporter"}},
            "addressType": "IPv4", "endpoints": list(endpoints),
            "ports": [{"name": port_name, "port": port, "protocol": "TCP"}]}


def test_the_reference_and_its_paths():
    assert (REF.namespace, REF.service, REF.port) == ("gpu-operator", "nvidia-dcgm-exporter", "9400")
    assert str(REF) == "gpu-operator/nvidia-dcgm-exporter:9400"
    assert REF.slice_selector == "kubernetes.io/service-name=nvidia-dcgm-exporter"
    assert REF.service_proxy_path() == ("/api/v1/namespaces/gpu-operator/services/nvidia-dcgm-exporter:9400"
                                        "/proxy/metrics")


def test_the_exporter_pod_on_each_gpu_node_is_read_through_its_pod_proxy_at_the_target_port():
    slices = [slice_of(endpoint("dcgm-a", "node-1"), endpoint("dcgm-b", "node-2"), endpoint("dcgm-c", "node-3"),
                       port=19400)]   # the slice carries the pod's port, whatever the Service's
    targets, note = scrape_targets(REF, SERVICE, slices, {"node-1", "node-3"})
    pods = "/api/v1/namespaces/gpu-operator/pods"
    assert targets == [ScrapeTarget("dcgm-a", "node-1", f"{pods}/dcgm-a:19400/proxy/metrics"),
                       ScrapeTarget("dcgm-c", "node-3", f"{pods}/dcgm-c:19400/proxy/metrics")]
    assert note is None
    by_name = ExporterRef.parse("gpu-operator/nvidia-dcgm-exporter:gpu-metrics")
    assert scrape_targets(by_name, SERVICE, slices, {"node-2"})[0][0].name == "dcgm-b"


def test_pods_not_ready_or_on_other_nodes_are_not_read_and_missing_nodes_are_said():
    slices = [slice_of(endpoint("dcgm-a", "node-1", ready=False)), slice_of(endpoint("dcgm-b", "node-2")),
              slice_of(endpoint("other-port", "node-1"), port_name="other")]
    targets, note = scrape_targets(REF, SERVICE, slices, {"node-1", "node-2"})
    assert [t.name for t in targets] == ["dcgm-b"]
    assert note == "no ready pod of gpu-operator/nvidia-dcgm-exporter:9400 on node(s) node-1: their GPUs are not read"
    with pytest.raises(ExporterUnavailable, match=r"no ready pod of .* on node\(s\) node-1; it runs on node-2"):
        scrape_targets(REF, SERVICE, slices, {"node-1"})
    with pytest.raises(ExporterUnavailable, match="on node"):
        scrape_targets(REF, SERVICE, [], {"node-1"})


def test_a_port_the_service_lacks_is_refused_and_unreadable_slices_fall_back_to_the_services_proxy():
    with pytest.raises(ExporterUnavailable, match=r"has no port 9500 \(its ports: gpu-metrics 9400\)"):
        scrape_targets(ExporterRef.parse("gpu-operator/nvidia-dcgm-exporter:9500"), SERVICE, [], {"node-1"})
    targets, note = scrape_targets(REF, SERVICE, None, {"node-1", "node-2"})
    assert targets == [ScrapeTarget("nvidia-dcgm-exporter", "", REF.service_proxy_path())]
    assert "picks one exporter pod at random" in note


def test_an_unnamed_single_port_matches_its_unnamed_slice_port():
    service = {"spec": {"ports": [{"port": 9400}]}}
    slices = [slice_of(endpoint("dcgm-a", "node-1"), port_name="")]
    slices[0]["ports"][0].pop("name")
    assert scrape_targets(REF, service, slices, {"node-1"})[0][0].path.endswith("pods/dcgm-a:9400/proxy/metrics")
