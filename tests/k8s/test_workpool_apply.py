"""tasks/k8s/workpool.py: the worker's kubeconfig on this machine. The pool's objects are applied and deleted
against the real control plane: tests/cluster/test_jobs_pool_cluster.py."""
from __future__ import annotations

import stat

import pytest
import yaml

from epdbench.specs.models import KubernetesTargetSpec
from epdbench.tasks.k8s.workpool import worker_kubeconfig


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
