"""tasks/k8s/workpool.py against the fake API server: the flow rights (cluster-scoped ones included) and the
in-cluster worker applied and deleted; the worker's kubeconfig on this machine."""
from __future__ import annotations

import stat

import pytest
import yaml

from epdbench.manifests.workpool import PoolSettings, render_pool_objects
from epdbench.specs.models import KubernetesTargetSpec
from epdbench.tasks.k8s.workpool import apply_pool_objects, delete_pool_objects, worker_kubeconfig
from tests.k8s.fake_apiserver import cluster  # noqa: F401

SETTINGS = PoolSettings(image="registry.example/epdbench:0.1.0", namespace="epdbench",
                        prefect_api="http://10.0.0.5:4200/api", mlflow_uri="http://10.0.0.5:5000")


def test_pool_objects_are_applied_and_the_worker_deleted_alone(cluster, tmp_path):  # noqa: F811
    fake = cluster()
    target = KubernetesTargetSpec(kubeconfig=str(fake.kubeconfig(tmp_path / "kubeconfig")))
    objects = render_pool_objects(SETTINGS, worker_in_cluster=True)
    api = apply_pool_objects(target, objects)
    kinds = sorted((o["kind"], o["metadata"]["name"]) for o in fake.objects()
                   if o["metadata"].get("labels", {}).get("epdbench/component") == "flows")
    assert kinds == sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    assert next(o for o in fake.objects("ClusterRole"))["metadata"].get("namespace", "") == ""
    worker = [o for o in objects if o["kind"] == "Deployment"]
    assert delete_pool_objects(api, worker) == []
    assert not fake.objects("Deployment") and fake.objects("ServiceAccount")      # the flow rights stay


def write_kubeconfig(path, current: str) -> None:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": current,
        "clusters": [{"name": "a", "cluster": {"server": "https://127.0.0.1:1", "certificate-authority": "ca.crt"}},
                     {"name": "b", "cluster": {"server": "https://127.0.0.1:2"}}],
        "users": [{"name": "u", "user": {"client-certificate": "/abs/u.crt", "client-key": "keys/u.key"}}],
        "contexts": [{"name": "ctx-a", "context": {"cluster": "a", "user": "u"}},
                     {"name": "ctx-b", "context": {"cluster": "b", "user": "u"}}]}))


def test_the_local_worker_gets_the_chosen_context_with_absolute_paths_owner_only(tmp_path):
    source = tmp_path / "kube" / "config"
    source.parent.mkdir()
    write_kubeconfig(source, "ctx-a")
    out = worker_kubeconfig(KubernetesTargetSpec(kubeconfig=str(source), context="ctx-b"), tmp_path / "w.yaml")
    doc = yaml.safe_load(out.read_text())
    assert doc["current-context"] == "ctx-b"
    clusters = {c["name"]: c["cluster"] for c in doc["clusters"]}
    assert clusters["a"]["certificate-authority"] == str(tmp_path / "kube" / "ca.crt")
    user = doc["users"][0]["user"]
    assert user["client-certificate"] == "/abs/u.crt" and user["client-key"] == str(tmp_path / "kube" / "keys/u.key")
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert yaml.safe_load(worker_kubeconfig(KubernetesTargetSpec(kubeconfig=str(source)),
                                            tmp_path / "v.yaml").read_text())["current-context"] == "ctx-a"
    with pytest.raises(RuntimeError, match="context 'nope' not found"):
        worker_kubeconfig(KubernetesTargetSpec(kubeconfig=str(source), context="nope"), tmp_path / "x.yaml")
    with pytest.raises(RuntimeError, match="not found: give --kubeconfig"):
        worker_kubeconfig(KubernetesTargetSpec(kubeconfig=str(tmp_path / "missing")), tmp_path / "y.yaml")


def test_the_dcgm_exporters_rights_are_applied_in_its_namespace_or_skipped_without_it(cluster, tmp_path,  # noqa: F811
                                                                                       capsys):
    fake = cluster()
    target = KubernetesTargetSpec(kubeconfig=str(fake.kubeconfig(tmp_path / "kubeconfig")))
    objects = render_pool_objects(PoolSettings(**{**SETTINGS.__dict__, "dcgm_exporter": "gpu-operator/dcgm:9400"}))
    apply_pool_objects(target, objects)                              # no namespace gpu-operator: said, skipped
    out = capsys.readouterr().out
    assert "Role epdbench-flow-epdbench-dcgm not applied: no namespace gpu-operator" in out
    assert "flow runs will have no GPU telemetry" in out
    assert not [o for o in fake.objects() if o["metadata"].get("namespace") == "gpu-operator"]
    assert fake.objects("Role") and fake.objects("ClusterRole")      # the rest is applied
    fake.put({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gpu-operator"}})
    api = apply_pool_objects(target, objects)
    assert sorted(o["kind"] for o in fake.objects() if o["metadata"].get("namespace") == "gpu-operator") == [
        "Role", "RoleBinding"]
    assert delete_pool_objects(api, [o for o in objects if o["metadata"].get("namespace") == "gpu-operator"]) == []
    assert not [o for o in fake.objects() if o["metadata"].get("namespace") == "gpu-operator"]
