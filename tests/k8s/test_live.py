"""Live tier: against a real cluster, only when EPDBENCH_KUBECONFIG names a kubeconfig (optionally
EPDBENCH_KUBE_CONTEXT, EPDBENCH_NAMESPACE). Read-only plus server-side dry-run applies: nothing persists.

    EPDBENCH_KUBECONFIG=~/.kube/config EPDBENCH_NAMESPACE=bench python -m pytest -q -m live tests/k8s
"""
from __future__ import annotations

import os

import pytest

from epdbench.manifests.render import render_manifests, schema_version_for, validate_manifests
from epdbench.specs.models import KubernetesTargetSpec, load_spec, parse_spec
from epdbench.tasks.k8s.api import FIELD_MANAGER, connect

pytestmark = [pytest.mark.live,
              pytest.mark.skipif(not os.environ.get("EPDBENCH_KUBECONFIG"),
                                 reason="live tier: set EPDBENCH_KUBECONFIG to a cluster's kubeconfig")]


@pytest.fixture(scope="module")
def target() -> KubernetesTargetSpec:
    return KubernetesTargetSpec(kubeconfig=os.environ.get("EPDBENCH_KUBECONFIG"),
                                context=os.environ.get("EPDBENCH_KUBE_CONTEXT"),
                                namespace=os.environ.get("EPDBENCH_NAMESPACE", "epdbench"))


def spec_on(preset: str, target: KubernetesTargetSpec):
    data = load_spec(preset).model_dump(mode="json")
    data["target"] = {"kind": "kubernetes", "kubernetes": target.model_dump(mode="json")}
    return parse_spec(data, preset)


def test_cluster_is_reachable_and_its_version_has_schemas(target):
    api = connect(target)
    assert schema_version_for(api.server_version())
    api.get("Namespace", target.namespace)


@pytest.mark.parametrize("preset", ["pd-text", "epd-multimodal"])
def test_every_configuration_passes_a_server_side_dry_run_apply(target, preset):
    """The API server's own validation and admission (quotas, pod security) accept every object."""
    api = connect(target)
    version = schema_version_for(api.server_version())
    spec = spec_on(preset, target)
    for config in spec.configurations:
        objects = render_manifests(spec, config, "live-dry-run")
        validate_manifests(objects, version)
        for obj in objects:
            api.call_json("PATCH", api.path_of(obj["kind"], obj["metadata"]["name"]), body=obj,
                          query=[("fieldManager", FIELD_MANAGER), ("force", "true"), ("dryRun", "All")],
                          content_type="application/apply-patch+yaml")
