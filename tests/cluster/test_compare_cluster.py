"""`epdbench compare --target kubernetes` on the smoke spec against a real control plane, as the flows' own
ServiceAccount: the Role and ClusterRole the work pool's manifests render are all it holds, so every call the
run makes passes the real RBAC or the run fails. StatefulSets and Deployments → ReplicaSets → Pods scheduled by
kube-scheduler onto the kwok GPU node, readiness from the pods' status, the engines' logs read through the real
`pods/log` (kwok serving the player's CRI logs), every request through `pods/portforward`, the load generator as
a real Job whose completion the Job controller writes, results in MLflow, then teardown by label with the
garbage collector removing the pods: nothing labelled is left in etcd, no process the pods stood for runs.
Every connection stays on loopback: the tier runs in a network namespace with only `lo` (tests/cluster/netns.py),
and no component logged a dial to any other address."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from epdbench.manifests.workpool import FLOW_ACCOUNT, PoolSettings, render_pool_objects
from tests.cluster import netns
from tests.cluster.kubelet import PodPlayer
from tests.cluster.specs import cluster_spec
from tests.spanrows import tree_problems

pytestmark = pytest.mark.cluster      # the tier runs apart (-m cluster), in its network namespace
ROOT = Path(__file__).resolve().parents[2]
NAMESPACE = "epdbench"
FAST_METRICS = {"MC_TE_METRIC_INTERVAL_SECONDS": "0.5"}   # short cells still log Mooncake throughput windows
DIAL = re.compile(r"dial tcp (?P<addr>\[?[0-9a-f.:]+\]?):\d+")


def flow_account_kubeconfig(cp, path: Path) -> Path:
    """The work pool's objects applied as the admin; a token of the flows' ServiceAccount (TokenRequest)."""
    cp.ensure_namespace(NAMESPACE)
    settings = PoolSettings(image="epdbench:test", namespace=NAMESPACE, prefect_api="http://127.0.0.1:4200/api",
                            mlflow_uri="http://127.0.0.1:5000", port_forward=True)
    from epdbench.tasks.k8s.api import KINDS
    for obj in render_pool_objects(settings):
        meta = obj["metadata"]
        base = KINDS[obj["kind"]].collection_path(meta.get("namespace", NAMESPACE))
        status, body = cp.request("PATCH", f"{base}/{meta['name']}?fieldManager=epdbench-test&force=true",
                                  obj, content_type="application/apply-patch+yaml")
        assert status in (200, 201), body
    status, body = cp.request("POST", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{FLOW_ACCOUNT}/token",
                              {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                               "spec": {"expirationSeconds": 7200}})
    assert status == 201, body
    return cp.kubeconfig(path, token=body["status"]["token"], namespace=NAMESPACE), body["status"]["token"]


def off_loopback_dials(texts: dict[str, str]) -> list[str]:
    """Lines of Go's `dial tcp ADDR:PORT` (a component's connection attempt, failed or logged) to any address but
    loopback."""
    return [f"{name}: {line.strip()[:200]}" for name, text in texts.items() for line in text.splitlines()
            for m in DIAL.finditer(line) if not m.group("addr").strip("[]").startswith(("127.", "::1"))]


@pytest.fixture(scope="module")
def run(control_plane, tmp_path_factory):
    work = tmp_path_factory.mktemp("cluster-compare")
    spec = cluster_spec(work / "smoke-cluster.yaml", "smoke", NAMESPACE, lambda d: d.update(trials=1),
                        ready_timeout_s=120, teardown_timeout_s=60, poll_interval_s=0.5)
    kubeconfig, token = flow_account_kubeconfig(control_plane, work / "flow.kubeconfig")
    player = PodPlayer(control_plane, work / "pods", spec, NAMESPACE, env_overrides=FAST_METRICS).start()
    out = work / "results"
    try:
        proc = subprocess.run([sys.executable, "-m", "epdbench.cli", "compare", "--spec", str(spec),
                               "--kubeconfig", str(kubeconfig), "--out", str(out),
                               "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}"],
                              cwd=work, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                              timeout=900)
        player.ship_all()
        (work / "compare.out").write_text(proc.stdout + proc.stderr)
        yield {"proc": proc, "out": out, "work": work, "player": player, "cp": control_plane, "token": token}
    finally:
        player.stop()


def test_the_comparison_runs_through_the_real_control_plane(run):
    """Every configuration ran and its stages are verified; the exit code is 3 (unverified evidence) because the
    pods are the simulator, whose transport evidence says `emulated`, which a cluster run never counts as verified."""
    proc = run["proc"]
    outcome = json.loads((run["out"] / "outcome.json").read_text())
    assert proc.returncode == 3, (proc.stdout + proc.stderr)[-5000:]
    assert {c: (o["status"], o["stages"], o["transport"]) for c, o in outcome["configs"].items()} == {
        "aggregated": ("ok", "verified", "not-applicable"), "pd-tcp": ("ok", "verified", "emulated"),
        "pd-rdma": ("ok", "verified", "emulated"), "epd": ("ok", "verified", "emulated")}
    assert outcome["mlflow_pending"] == [], outcome["mlflow_pending"]
    records = pd.read_parquet(run["out"] / "records.parquet")
    assert set(records["config"]) == {"aggregated", "pd-tcp", "pd-rdma", "epd"}
    assert records["ok"].all(), records.loc[~records["ok"], ["config", "error"]].head().to_string()
    measured = records[records["phase"] == "measured"]
    assert measured.groupby(["config", "cell"])["prompt_hash"].nunique().equals(
        measured.groupby(["config", "cell"]).size())           # every planned request once


def test_evidence_is_read_from_the_pods_logs_through_the_api_server(run):
    for config in ("aggregated", "pd-tcp", "pd-rdma", "epd"):
        ev = run["out"] / "evidence" / config
        transport = json.loads((ev / "transport.json").read_text())
        stages = json.loads((ev / "stages.json").read_text())
        expected = "not-applicable" if config == "aggregated" else "emulated"
        assert transport["verdict"] == expected, (config, transport)
        assert all(v == 1.0 for v in stages["fraction_seen"].values()), (config, stages)
    assert (run["out"] / "evidence" / "pd-rdma" / "prefill-0.log").stat().st_size > 0


def test_every_traced_request_has_its_tree_from_the_collector_beside_the_router(run):
    """Engines and the router's proxy exported to the collector container in the router's pod; the runner took the
    spans back through a port-forward to that container and joined them with the load generator Job's records."""
    records = pd.read_parquet(run["out"] / "records.parquet")
    measured = records[(records["config"] == "epd") & (records["phase"] == "measured")]
    spans = pd.read_parquet(run["out"] / "traces" / "epd.parquet")
    assert set(spans["request_id"]) <= set(measured["request_id"]) and spans["trace_id"].nunique() >= 20
    for tid, trace in spans.groupby("trace_id"):
        assert tree_problems(trace) == [], tid
        engines = trace[trace["name"] == "llm_request"]
        roles = {"prefill-0", "decode-0"} | ({"encode-0"} if trace["suite"].iloc[0] == "mm-context" else set())
        assert set(engines["pod"]) == roles and (trace["name"] == "kv_transfer").sum() == 1, tid
    assert "traces:" not in run["proc"].stdout                            # no collector problem was said
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{run['work'] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("epdbench")
    traces = client.search_traces(locations=[exp.experiment_id], max_results=1000)
    assert set(spans["trace_id"]) <= {t.info.tags["epdbench.trace_id"] for t in traces}


def test_the_load_generator_ran_as_a_job_the_job_controller_completed(run):
    assert "measured by a load generator Job in the cluster" in run["proc"].stdout


def test_the_flow_account_is_refused_outside_its_rights(run):
    """The same token that ran the comparison: Secrets, another namespace and writing nodes answer 403."""
    cp, token = run["cp"], run["token"]
    other = "kube-system"
    node = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "gpu-node-1", "labels": {"x": "y"}}}
    calls = [("GET", f"/api/v1/namespaces/{NAMESPACE}/secrets", None, "application/json"),
             ("POST", f"/api/v1/namespaces/{NAMESPACE}/secrets",
              {"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "x"}}, "application/json"),
             ("GET", f"/api/v1/namespaces/{other}/pods", None, "application/json"),
             ("POST", f"/api/v1/namespaces/{other}/configmaps",
              {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "x"}}, "application/json"),
             ("PATCH", "/api/v1/nodes/gpu-node-1?fieldManager=x", node, "application/apply-patch+yaml"),
             ("DELETE", "/api/v1/nodes/gpu-node-1", None, "application/json")]
    answers = {f"{m} {p}": cp.request(m, p, body, token=token, content_type=ct)[0] for m, p, body, ct in calls}
    assert set(answers.values()) == {403}, answers
    # and what the run did is within them: its own namespace's pods, the GPU node read
    assert cp.request("GET", f"/api/v1/namespaces/{NAMESPACE}/pods", token=token)[0] == 200
    assert cp.request("GET", "/api/v1/nodes/gpu-node-1", token=token)[0] == 200


def test_teardown_leaves_nothing_labelled_and_no_process(run):
    cp, player = run["cp"], run["player"]
    assert cp.labelled(NAMESPACE, "epdbench/run") == []
    assert player.wait(lambda: player.running_processes() == [], 30), player.running_processes()
    assert player.errors == [] or all("status: HTTP 404" in e or "HTTP 409" in e for e in player.errors), \
        player.errors[:5]


def test_mlflow_holds_the_comparison(run):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(tracking_uri=f"sqlite:///{run['work'] / 'mlflow.db'}")
    exp = client.get_experiment_by_name("epdbench")
    runs = client.search_runs([exp.experiment_id], "tags.`epdbench.kind` = 'configuration'")
    assert {r.data.tags["epdbench.config"] for r in runs} == {"aggregated", "pd-tcp", "pd-rdma", "epd"}


def test_no_connection_left_loopback(run):
    """The namespace has no way off the machine, and no component, pod process or the run logged a dial to any
    address but loopback (the pods' private addresses included)."""
    if netns.interfaces() != ["lo"]:
        pytest.skip("no network namespace of its own here (needs root): loopback is kept by addresses alone")
    logs = [c.log for c in run["cp"].components] + sorted((run["work"] / "pods").glob("*.log"))
    texts = {p.name: p.read_text(errors="replace") for p in logs}
    texts["compare"] = run["proc"].stdout + run["proc"].stderr
    assert off_loopback_dials(texts) == []


def test_a_dial_off_loopback_is_caught():
    assert off_loopback_dials({"x": 'proxy error: dial tcp 10.244.0.7:8000: connect: network is unreachable'})
    assert not off_loopback_dials({"x": "dial tcp 127.0.0.1:6443: connect: connection refused"})
