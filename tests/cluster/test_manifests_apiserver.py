"""Every manifest of every preset, for every configuration (so every topology), and the in-cluster load generator
and the Prefect work pool's objects, sent to a real kube-apiserver as a server-side apply with field validation
`Strict` and `dryRun=All`: the server's own schema, defaulting, validation and admission, nothing stored. A
manifest it rejects is a bug of the templates."""
from __future__ import annotations

import pytest

from epdbench.manifests.render import render_loadgen, render_manifests
from epdbench.manifests.workpool import PoolSettings, render_pool_objects
from epdbench.specs.models import load_spec, parse_spec, spec_to_yaml
from epdbench.tasks.k8s.api import KINDS
from epdbench.tasks.k8s.workpool import flow_run_job, pool_template

pytestmark = pytest.mark.cluster
PRESETS = ("smoke", "pd-text", "epd-multimodal", "epd-reuse", "pd-nixl", "vllm-truth", "cpu-tiny", "gpu-qwen25vl")
NAMESPACE = "epdbench"


def on_kubernetes(preset: str):
    data = load_spec(preset).model_dump(mode="json")
    data["target"]["kind"] = "kubernetes"
    data["target"]["kubernetes"]["namespace"] = NAMESPACE
    return parse_spec(data, preset)


def cases() -> list[tuple[str, str]]:
    return [(p, c.name) for p in PRESETS for c in load_spec(p).configurations]


@pytest.fixture(scope="module")
def namespace(control_plane):
    control_plane.ensure_namespace("gpu-operator")     # where the pool's DCGM exporter Role goes
    return control_plane.ensure_namespace(NAMESPACE)


def dry_run_apply(cp, obj: dict) -> tuple[int, dict]:
    meta = obj["metadata"]
    path = KINDS[obj["kind"]].collection_path(meta.get("namespace", NAMESPACE))
    return cp.request("PATCH", f"{path}/{meta['name']}?fieldManager=epdbench&force=true&dryRun=All"
                               f"&fieldValidation=Strict", obj, content_type="application/apply-patch+yaml")


def rejected(cp, objects: list[dict]) -> list[str]:
    out = []
    for obj in objects:
        status, body = dry_run_apply(cp, obj)
        if status not in (200, 201):
            out.append(f"{obj['kind']}/{obj['metadata']['name']}: HTTP {status} {body.get('message')}")
    return out


@pytest.mark.parametrize("preset,config", cases())
def test_every_configuration_of_every_preset_is_accepted_strictly(control_plane, namespace, preset, config):
    spec = on_kubernetes(preset)
    cfg = spec.configuration(config)
    objects = render_manifests(spec, cfg, "strict-check") + \
        render_loadgen(spec, cfg, "strict-check", spec_to_yaml(spec), {"chars_per_token": 4.0})
    assert {o["kind"] for o in objects} >= {"StatefulSet", "Service", "Deployment", "Job", "ConfigMap"}
    assert rejected(control_plane, objects) == []


def pool_settings(**kw) -> PoolSettings:
    return PoolSettings(image="epdbench:test", namespace=NAMESPACE, prefect_api="http://127.0.0.1:4200/api",
                        mlflow_uri="http://127.0.0.1:5000", **kw)


@pytest.mark.parametrize("port_forward,claim", [(False, None), (True, "results")])
def test_the_work_pool_objects_and_a_flow_runs_job_are_accepted_strictly(control_plane, namespace, port_forward,
                                                                         claim):
    s = pool_settings(port_forward=port_forward, results_claim=claim, dcgm_exporter="gpu-operator/dcgm:9400")
    objects = render_pool_objects(s, worker_in_cluster=True)
    job = flow_run_job(pool_template(s), {"image": s.image})
    job["metadata"].setdefault("name", "flow-run-check")
    assert rejected(control_plane, objects + [job]) == []


def test_strict_validation_is_on(control_plane, namespace):
    """The check can fail: an unknown field is refused, not dropped."""
    spec = on_kubernetes("smoke")
    obj = next(o for o in render_manifests(spec, spec.configurations[0], "strict-check") if o["kind"] == "Service")
    obj = {**obj, "spec": {**obj["spec"], "portz": []}}
    status, body = dry_run_apply(control_plane, obj)
    # A server-side apply is typed against the schema: an undeclared field fails the patch's conversion, which the
    # API server answers with 500, not 400 (Kubernetes 1.37.2).
    assert status == 500 and ".spec.portz: field not declared in schema" in body["message"], body
