"""tasks/k8s/telemetry.py against the in-process fake API server (loopback): the DCGM exporter found through its
Service and EndpointSlices, its pod on the configuration's node read through the pod proxy as its page changes,
readings kept per pod in the neutral CSV (a repeated reading once), the energy counters beside it; an absent
exporter said in one line; failing reads said once and never failing the configuration; wired into the
Kubernetes target's start and stop. On the fake, not the real control plane (tests/cluster/): a real API
server's pod proxy dials the exporter pod's own address, which there lies where nothing listens, off loopback."""
from __future__ import annotations

import itertools
import threading
from pathlib import Path

import pytest

from epdbench.analysis.gpu_telemetry import CSV_HEADER, parse_samples_csv
from epdbench.manifests.render import LABEL_ROLE
from epdbench.specs.models import KubernetesTargetSpec
from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.k8s import telemetry
from epdbench.tasks.k8s.api import connect
from tests.k8s.fake_apiserver import cluster, wait_until  # noqa: F401
from tests.k8s.fake_kubelet import NODE
from tests.tasks.k8s.test_k8s_target import assert_nothing_left, chat, start_config

EXPORTER_POD, OTHER_NODES_POD = "nvidia-dcgm-exporter-7xk2p", "nvidia-dcgm-exporter-q9z4m"
LABELS = ('{gpu="%d",UUID="GPU-0000000%d",pci_bus_id="00000000:1%d:00.0",device="nvidia%d",'
          'modelName="NVIDIA H100 80GB HBM3",Hostname="%s",DCGM_FI_DRIVER_VERSION="570.172.08"%s}')


def exporter_page(holders: list[str], reading: int, node: str = NODE) -> str:
    """The exporter's page in dcgm-exporter 4.5.3-4.8.2's form after its `reading`-th collection: GPU i held by
    holders[i] in namespace epdbench, one more GPU held by another namespace's pod, one by none."""
    gpus = [f',container="engine",namespace="epdbench",pod="{p}"' for p in holders]
    gpus += [',container="main",namespace="team-a",pod="trainer-0"', ""]
    lines = []
    for name, value in (("DCGM_FI_DEV_GPU_UTIL", lambda i: f"{50 + i}"), ("DCGM_FI_DEV_FB_USED", lambda i: "72806"),
                        ("DCGM_FI_DEV_POWER_USAGE", lambda i: f"{300 + 10 * reading + i:f}"),
                        ("DCGM_FI_DEV_SM_CLOCK", lambda i: "1980"),
                        ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", lambda i: f"{10**9 * (i + 1) + 300_000 * reading}")):
        lines += [f"# HELP {name} .", f"# TYPE {name} gauge"]
        lines += [f"{name}{LABELS % (i, i, i, i, node, extra)} {value(i)}" for i, extra in enumerate(gpus)]
    return "\n".join(lines) + "\n"


class Exporter:
    """The exporter pod behind the fake's pod proxy: each request gets the page of collection n // repeats (the
    exporter serves one collection until its next), or a 500 for the request numbers in `failing`."""

    def __init__(self, holders, repeats: int = 1, failing: set[int] = frozenset()):
        self.holders, self.repeats, self.failing = holders, repeats, failing
        self.requests = itertools.count()
        self.served = 0
        self.lock = threading.Lock()

    def __call__(self) -> tuple[int, str]:
        n = next(self.requests)
        with self.lock:
            self.served = n + 1
        if n in self.failing:
            return 500, "dcgm: failed to gather metrics\n"
        holders = self.holders() if callable(self.holders) else self.holders
        return 200, exporter_page(holders, n // self.repeats)


def install_exporter(fake, respond, node: str = NODE) -> None:
    """The GPU Operator's exporter objects: namespace, Service, an EndpointSlice with a ready pod on `node` and one
    on another node (whose reads would fail loudly)."""
    fake.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}})
    fake.put({"apiVersion": "v1", "kind": "Service",
              "metadata": {"name": "nvidia-dcgm-exporter", "namespace": "gpu-operator",
                           "labels": {"app": "nvidia-dcgm-exporter"}},
              "spec": {"selector": {"app": "nvidia-dcgm-exporter"},
                       "ports": [{"name": "gpu-metrics", "port": 9400, "targetPort": 9400, "protocol": "TCP"}]}})
    fake.put({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
              "metadata": {"name": "nvidia-dcgm-exporter-abcde", "namespace": "gpu-operator",
                           "labels": {"kubernetes.io/service-name": "nvidia-dcgm-exporter"}},
              "ports": [{"name": "gpu-metrics", "port": 9400, "protocol": "TCP"}],
              "endpoints": [{"addresses": ["10.1.0.7"], "conditions": {"ready": True}, "nodeName": n,
                             "targetRef": {"kind": "Pod", "name": pod, "namespace": "gpu-operator"}}
                            for pod, n in ((EXPORTER_POD, node), (OTHER_NODES_POD, "gpu-node-2"))]})
    fake.serve_proxy("pods", "gpu-operator", f"{EXPORTER_POD}:9400", respond)
    fake.serve_proxy("pods", "gpu-operator", f"{OTHER_NODES_POD}:9400", lambda: (500, "the wrong node\n"))


def pod(name: str, role: str, node: str = NODE) -> dict:
    return {"metadata": {"name": name, "labels": {LABEL_ROLE: role}}, "spec": {"nodeName": node}}


PODS = [pod("pd-tcp-prefill-0", "prefill"), pod("pd-tcp-decode-0", "decode"), pod("pd-tcp-router-x0000", "router",
                                                                                   node="cpu-node-1")]


@pytest.fixture
def fast(monkeypatch):
    monkeypatch.setattr(telemetry, "INTERVAL_S", 0.05)


def sample(fake, tmp_path: Path, exporter: Exporter, reads: int, **target) -> tuple[list[str], Path]:
    """Start the sampler for PODS, wait (bounded) until the exporter has answered `reads` requests, stop it."""
    said: list[str] = []
    spec = KubernetesTargetSpec(kubeconfig=str(fake.kubeconfig(tmp_path / "kubeconfig")), **target)
    out = tmp_path / "results" / "evidence" / "pd-tcp" / "gpu-telemetry.csv"
    sampler = telemetry.start_telemetry(connect(spec), spec, out, "pd-tcp", PODS, said.append)
    assert sampler is not None, said
    try:
        assert wait_until(lambda: exporter.served >= reads, timeout_s=20)
    finally:
        sampler.stop()
    assert not sampler._thread.is_alive()
    SAMPLERS.append(sampler)
    return said, out


SAMPLERS: list = []   # each test's sampler, for the figures it keeps in memory


def test_the_exporter_on_the_pods_node_is_read_every_tick_into_the_neutral_csv(cluster, tmp_path, fast):  # noqa: F811
    fake = cluster()
    exporter = Exporter(["pd-tcp-prefill-0", "pd-tcp-decode-0"])
    install_exporter(fake, exporter)
    said, out = sample(fake, tmp_path, exporter, reads=4)
    text = out.read_text()
    assert text.startswith(",".join(CSV_HEADER) + "\n") and text.count("t,host") == 1   # the header once
    by_pod = parse_samples_csv(text)
    assert set(by_pod) == {"pd-tcp-prefill-0", "pd-tcp-decode-0"}          # not the other namespace's, nor the free
    prefill, decode = by_pod["pd-tcp-prefill-0"], by_pod["pd-tcp-decode-0"]
    n = len(prefill)
    assert n >= 4 and len(decode) == n and all(s.gpu == 0 for s in prefill) and all(s.gpu == 1 for s in decode)
    assert [s.power_w for s in prefill] == [300.0 + 10 * k for k in range(n)]   # the page changed every read
    assert all(a.t < b.t for a, b in zip(prefill, prefill[1:])) and decode[0].util_pct == 51.0
    assert all(line.endswith(",dcgm") for line in text.splitlines()[1:])
    assert [s.energy_mj for s in decode] == [2e9 + 300_000 * k for k in range(n)]     # each reading's counter
    # a cell's figures from the readings kept in memory: both pods' GPUs over the cell's measured window
    kept = list(SAMPLERS[-1]._kept["pd-tcp-prefill-0"])      # the readings' own instants (the CSV's are to the ms)
    span = kept[-2].t - kept[1].t
    rows = [{"phase": "measured", "ok": True, "send_wall_s": kept[1].t, "e2e_ms": span * 1000 + 1e-3,
             "output_tokens": 10}]
    figures = SAMPLERS[-1].cell(rows)
    assert figures["gpu_samples"] == 2 * (n - 2)
    assert figures["gpu_energy_j"] == pytest.approx(2 * 300 * (n - 3), rel=1e-3)   # both counters rise 300 J a read
    assert figures["energy_j_per_token"] == pytest.approx(figures["gpu_energy_j"] / 10)
    assert said[0] == f"[pd-tcp] GPU telemetry: reading {EXPORTER_POD} (gpu-operator/nvidia-dcgm-exporter:9400) " \
                      f"every 0.05 s"
    unattributed = [line for line in said if "no pod label" in line]
    assert unattributed == ["[pd-tcp] GPU telemetry: GPU 3 (GPU-00000003) on gpu-node-1 carries no pod label: not "
                            "attributed to any pod, not sampled (said once)"]
    assert said[-1].startswith(f"[pd-tcp] GPU telemetry: {2 * n} samples from ") and "failed" not in said[-1]
    assert not any("the wrong node" in line for line in said)       # the other node's exporter was never read


def test_a_reading_served_again_is_kept_once(cluster, tmp_path, fast):  # noqa: F811
    fake = cluster()
    exporter = Exporter(["pd-tcp-prefill-0", "pd-tcp-decode-0"], repeats=3)    # a collection every third read
    install_exporter(fake, exporter)
    _, out = sample(fake, tmp_path, exporter, reads=7)
    prefill = parse_samples_csv(out.read_text())["pd-tcp-prefill-0"]
    collections = (exporter.served + 2) // 3
    assert len(prefill) in (collections - 1, collections)   # one row per collection (the last may be unread)
    assert [s.power_w for s in prefill] == [300.0 + 10 * k for k in range(len(prefill))]


def test_failing_reads_are_said_once_and_reading_goes_on(cluster, tmp_path, fast):  # noqa: F811
    fake = cluster()
    exporter = Exporter(["pd-tcp-prefill-0"], failing={1, 2, 3})
    install_exporter(fake, exporter)
    said, out = sample(fake, tmp_path, exporter, reads=6)
    failures = [line for line in said if "failed" in line and "reading" in line]
    assert len(failures) == 1 and f"reading {EXPORTER_POD} failed" in failures[0] and "HTTP 500" in failures[0]
    assert "3 failed" in said[-1]
    powers = [s.power_w for s in parse_samples_csv(out.read_text())["pd-tcp-prefill-0"]]
    assert powers[:3] == [300.0, 340.0, 350.0]        # read 0, then 4 and 5 once the exporter answers again


def test_an_exporter_that_maps_none_of_the_pods_says_so_once(cluster, tmp_path, fast):  # noqa: F811
    fake = cluster()
    exporter = Exporter([])
    install_exporter(fake, exporter)
    said, out = sample(fake, tmp_path, exporter, reads=3)
    none = [line for line in said if "shows no GPU" in line]
    assert none == [f"[pd-tcp] GPU telemetry: {EXPORTER_POD} shows no GPU of this configuration's pods (1 carry no "
                    "pod label: is its Kubernetes mapping on, DCGM_EXPORTER_KUBERNETES?)"]
    assert not out.exists() and said[-1].startswith("[pd-tcp] GPU telemetry: 0 samples")


def test_a_cluster_without_the_exporter_says_so_in_one_line_and_samples_nothing(cluster, tmp_path):  # noqa: F811
    fake = cluster()
    spec = KubernetesTargetSpec(kubeconfig=str(fake.kubeconfig(tmp_path / "kubeconfig")))
    said: list[str] = []
    out = tmp_path / "evidence" / "pd-tcp" / "gpu-telemetry.csv"
    assert telemetry.start_telemetry(connect(spec), spec, out, "pd-tcp", PODS, said.append) is None
    assert said == ["[pd-tcp] GPU telemetry unavailable: no Service gpu-operator/nvidia-dcgm-exporter on this "
                    "cluster (no DCGM exporter there; or name yours in target.kubernetes.dcgm_exporter); nothing "
                    "is sampled"]
    exporter = Exporter(["pd-tcp-prefill-0"])
    install_exporter(fake, exporter, node="gpu-node-3")               # there, but not on the pods' node
    said.clear()
    assert telemetry.start_telemetry(connect(spec), spec, out, "pd-tcp", PODS, said.append) is None
    assert said == [f"[pd-tcp] GPU telemetry unavailable: no ready pod of gpu-operator/nvidia-dcgm-exporter:9400 on "
                    f"node(s) {NODE}; it runs on gpu-node-2, gpu-node-3; nothing is sampled"]
    off = KubernetesTargetSpec(kubeconfig=spec.kubeconfig, dcgm_exporter=None)
    said.clear()
    assert telemetry.start_telemetry(connect(off), off, out, "pd-tcp", PODS, said.append) is None and said == []
    assert exporter.served == 0 and not out.parent.exists()


def test_the_kubernetes_target_samples_while_deployed_and_a_failing_exporter_fails_nothing(cluster, tmp_path,  # noqa: F811
                                                                                           fast, capsys):
    fake = cluster()

    def holders() -> list[str]:   # the configuration's engine pods, as the exporter's pod mapping would see them
        return sorted(p["metadata"]["name"] for p in fake.objects("Pod")
                      if p["metadata"]["labels"].get(LABEL_ROLE) not in (None, "router"))
    exporter = Exporter(holders, failing=set(range(2, 6)))
    install_exporter(fake, exporter)
    spec, dep = start_config(fake, tmp_path, "aggregated")
    try:
        assert wait_until(lambda: exporter.served >= 8, timeout_s=20)
        assert chat(dep.endpoint, spec.model.name)["choices"]             # serving, while reads failed and resumed
    finally:
        k8s_target.stop(dep)
    assert not dep.telemetry._thread.is_alive()
    served = exporter.served
    rows = parse_samples_csv(next(tmp_path.rglob("evidence/aggregated/gpu-telemetry.csv")).read_text())
    assert list(rows) == ["aggregated-server-0"] and len(rows["aggregated-server-0"]) >= 4
    out = capsys.readouterr().out
    assert out.count("GPU telemetry: reading nvidia-dcgm-exporter-7xk2p failed") == 1
    assert "[aggregated] GPU telemetry: " in out and "4 failed in" in out
    assert exporter.served <= served + 1                              # not read after stop
    assert_nothing_left(fake)
