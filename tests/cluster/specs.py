"""The specs the cluster tier runs: a preset or a spec file on the Kubernetes target, in a namespace of the tier,
reached through port-forwards (the only way to pods here: tests/cluster/netns.py), with an emptyDir model cache
(no storage provisioner makes a claim's volume)."""
from __future__ import annotations

from pathlib import Path
from typing import Callable

from epdbench.specs.models import load_spec, parse_spec, spec_to_yaml

TINY = Path(__file__).resolve().parents[1] / "k8s" / "data" / "k8s-tiny.yaml"


def cluster_spec(path: Path, base: str | Path, namespace: str, edit: Callable[[dict], None] | None = None,
                 **kube) -> Path:
    data = load_spec(str(base)).model_dump(mode="json")
    data["target"]["kind"] = "kubernetes"
    data["target"]["kubernetes"].update(namespace=namespace, access="port-forward",
                                        model_cache={"kind": "empty-dir"}, **kube)
    if edit:
        edit(data)
    path.write_text(spec_to_yaml(parse_spec(data, path.stem)))
    return path
