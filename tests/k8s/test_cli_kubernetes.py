"""epdbench CLI for the Kubernetes target: bad input is one line and exit 2, before anything runs."""
from __future__ import annotations

import pytest
import yaml

from epdbench.cli import main
from tests.k8s.fake_apiserver import SPEC_PATH


@pytest.fixture
def kubeconfig(tmp_path):
    path = tmp_path / "kubeconfig"
    path.write_text("apiVersion: v1\nkind: Config\n")
    return str(path)


@pytest.fixture
def no_rdma_resource_spec(tmp_path):
    data = yaml.safe_load(SPEC_PATH.read_text())
    data["target"]["kubernetes"]["node"] = {"rdma_resource": None}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


@pytest.mark.parametrize("args,needle", [
    (["compare", "--spec", "pd-text", "--namespace", "bench"], "--namespace: applies to --target kubernetes only"),
    (["compare", "--spec", "pd-text", "--keep"], "--keep: applies to --target kubernetes only"),
    (["compare", "--spec", "pd-text", "--target", "kubernetes", "--kubeconfig", "/no/such/kubeconfig"],
     "--kubeconfig: /no/such/kubeconfig not found"),
    (["compare", "--spec", "pd-text", "--target", "kubernetes", "--keep", "--kubeconfig", "KUBECONFIG"],
     "--keep: the configurations kept side by side need 18 GPUs, the node has 8"),
    (["compare", "--spec", "pd-text", "--target", "kubernetes", "--namespace", "Not_A_Name"],
     "'target.kubernetes.namespace'"),
    (["compare", "--spec", "NO_RDMA", "--kubeconfig", "KUBECONFIG"],
     "'target.kubernetes.node.rdma_resource' is not set"),
    (["cleanup", "--run", "r", "--namespace", "Not_A_Name"], "cleanup: field 'namespace'"),
    (["cleanup"], "--run"),
], ids=["namespace-on-sim", "keep-on-sim", "kubeconfig", "keep-too-big", "namespace", "rdma", "cleanup-ns",
        "cleanup-run"])
def test_bad_kubernetes_input_is_one_line_and_exit_2(args, needle, kubeconfig, no_rdma_resource_spec, capsys):
    args = [{"KUBECONFIG": kubeconfig, "NO_RDMA": no_rdma_resource_spec}.get(a, a) for a in args]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and needle in err, err
