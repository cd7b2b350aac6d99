"""Flows in the cluster: the work pool's base job template (through prefect-kubernetes's own configuration
class, as the worker fills it), the flow-run rights against every call the flow makes, and the worker."""
from __future__ import annotations

import json

import pytest
import yaml

from epdbench.cli import main as cli_main
from epdbench.manifests.podsecurity import pod_templates, violations
from epdbench.manifests.render import render_loadgen, render_manifests, validate_manifests
from epdbench.manifests.workpool import FLOW_ACCOUNT, WORKER_ACCOUNT, PoolSettings, render_pool_objects
from epdbench.specs.models import load_spec, parse_spec, spec_to_yaml
from epdbench.tasks.k8s.api import LABELLED_KINDS, KINDS
from epdbench.tasks.k8s.workpool import flow_run_job, pool_template

SETTINGS = PoolSettings(image="registry.example/epdbench:0.1.0", namespace="gpu-bench",
                        prefect_api="http://10.0.0.5:4200/api", mlflow_uri="http://10.0.0.5:5000")


def container_of(job: dict) -> dict:
    (c,) = job["spec"]["template"]["spec"]["containers"]
    return c


def test_a_flow_run_gets_a_schema_valid_least_privilege_job_in_the_namespace():
    job = flow_run_job(pool_template(SETTINGS), {"image": SETTINGS.image})
    validate_manifests([job], "1.31")
    pod = job["spec"]["template"]["spec"]
    c = container_of(job)
    assert job["metadata"]["namespace"] == "gpu-bench" and pod["serviceAccountName"] == FLOW_ACCOUNT
    assert c["image"] == SETTINGS.image
    # the image's entrypoint is epdbench: `env` runs the worker's command unchanged
    assert c["command"] == ["env"] and c["args"] == ["prefect", "flow-run", "execute"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["PREFECT_API_URL"] == SETTINGS.prefect_api and env["MLFLOW_TRACKING_URI"] == SETTINGS.mlflow_uri
    assert env["PREFECT__FLOW_RUN_ID"] == "00000000-0000-0000-0000-000000000000"
    assert env["PREFECT_SERVER_EPHEMERAL_ENABLED"] == "false" and env["EPDBENCH_RESULTS_DIR"] == "/results"
    assert c["resources"]["requests"] == c["resources"]["limits"] == {"cpu": "2", "memory": "4Gi"}
    assert pod["securityContext"]["runAsNonRoot"] and c["securityContext"]["readOnlyRootFilesystem"]
    assert c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "completions" not in pod and "parallelism" not in pod
    assert violations(pod, "restricted") == []        # admitted by the strictest Pod Security level
    assert {v["name"]: next(k for k in v if k != "name") for v in pod["volumes"]} == {"results": "emptyDir",
                                                                                       "tmp": "emptyDir"}


def test_a_deployments_job_variables_and_a_results_claim_reach_the_job():
    settings = PoolSettings(**{**SETTINGS.__dict__, "results_claim": "epdbench-results"})
    job = flow_run_job(pool_template(settings), {"image": "registry.example/epdbench:0.2.0",
                                                 "env": {"EXTRA": "1"}})
    validate_manifests([job], "1.31")
    c = container_of(job)
    env = {e["name"]: e["value"] for e in c["env"]}
    assert c["image"] == "registry.example/epdbench:0.2.0"
    assert env["EXTRA"] == "1" and env["MLFLOW_TRACKING_URI"] == SETTINGS.mlflow_uri   # merged, not replaced
    volumes = {v["name"]: v for v in job["spec"]["template"]["spec"]["volumes"]}
    assert volumes["results"]["persistentVolumeClaim"] == {"claimName": "epdbench-results"}
    assert {"name": "results", "mountPath": "/results"} in c["volumeMounts"]


def rules_of(objects: list[dict], kind: str, name: str) -> list[dict]:
    return next(o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name)["rules"]


def allows(rules: list[dict], group: str, resource: str, verb: str) -> bool:
    return any(group in r["apiGroups"] and resource in r["resources"] and verb in r["verbs"] for r in rules)


def group_and_plural(kind: str) -> tuple[str, str]:
    k = KINDS[kind]
    return ("" if k.group_version == "v1" else k.group_version.split("/")[0]), k.plural


@pytest.mark.parametrize("preset", ["pd-text", "epd-multimodal"])
def test_the_flow_account_may_do_every_call_the_flow_makes_and_grant_the_router_role(preset):
    objects = render_pool_objects(SETTINGS)
    role = rules_of(objects, "Role", FLOW_ACCOUNT)
    data = load_spec(preset).model_dump(mode="json")
    data["target"]["kind"] = "kubernetes"
    data["target"]["kubernetes"].update(namespace="gpu-bench")
    data["target"]["kubernetes"]["router"]["discovery"] = True
    spec = parse_spec(data, preset)
    applied = set()
    for config in spec.configurations:
        rendered = render_manifests(spec, config, "r1") + render_loadgen(spec, config, "r1", spec_to_yaml(spec))
        applied |= {o["kind"] for o in rendered}
        # Kubernetes refuses a Role granting what its creator lacks: the router's rules must be ours
        for rule in rules_of(rendered, "Role", f"epdbench-{config.name}"):
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert allows(role, group, resource, verb), (group, resource, verb)
    for kind in applied:                                    # server-side apply creates or patches
        assert all(allows(role, *group_and_plural(kind), v) for v in ("create", "patch", "get")), kind
    for kind in LABELLED_KINDS:                             # teardown lists and deletes by label
        assert all(allows(role, *group_and_plural(kind), v) for v in ("list", "delete")), kind
    assert allows(role, "", "pods/log", "get") and allows(role, "", "events", "list")
    assert allows(role, "", "services/proxy", "create") and allows(role, "", "pods/proxy", "get")
    assert not allows(role, "", "pods/portforward", "create")       # service-proxy access needs none
    assert not allows(role, "", "secrets", "get") and not any("*" in r["verbs"] for r in role)
    cluster = rules_of(objects, "ClusterRole", f"{FLOW_ACCOUNT}-gpu-bench")
    assert allows(cluster, "", "nodes", "list") and not allows(cluster, "", "pods", "list")
    assert next(r for r in cluster if "namespaces" in r["resources"])["resourceNames"] == ["gpu-bench"]


def test_port_forward_access_adds_its_right_and_the_worker_is_namespaced_and_valid():
    forward = rules_of(render_pool_objects(PoolSettings(**{**SETTINGS.__dict__, "port_forward": True})), "Role",
                       FLOW_ACCOUNT)
    assert allows(forward, "", "pods/portforward", "create")
    assert not any(o["kind"] == "Deployment" for o in render_pool_objects(SETTINGS))
    objects = render_pool_objects(SETTINGS, worker_in_cluster=True)
    validate_manifests(objects, "1.31")
    worker = next(o for o in objects if o["kind"] == "Deployment")
    c = worker["spec"]["template"]["spec"]["containers"][0]
    assert c["command"][:5] == ["prefect", "worker", "start", "--pool", "epdbench-kubernetes"]
    env = {e["name"]: e["value"] for e in c["env"]}
    assert env["PREFECT_INTEGRATIONS_KUBERNETES_OBSERVER_NAMESPACES"] == "gpu-bench"
    assert env["PREFECT_API_URL"] == SETTINGS.prefect_api
    assert allows(rules_of(objects, "Role", WORKER_ACCOUNT), "batch", "jobs", "create")
    assert not any(o["kind"].startswith("Cluster") and WORKER_ACCOUNT in o["metadata"]["name"] for o in objects)
    assert [violations(pod, "restricted") for _, pod in pod_templates(objects)] == [[]]


def test_manifests_work_pool_writes_the_pool_objects_template_and_a_flow_run_job(tmp_path, capsys):
    out = tmp_path / "m"
    assert cli_main(["manifests", "--spec", "pd-text", "--config", "pd-tcp", "--out", str(out), "--work-pool",
                     "--advertise", "10.0.0.5", "--image", SETTINGS.image, "--namespace", "gpu-bench"]) == 0
    pool = out / "work-pool"
    template = json.loads((pool / "base-job-template.json").read_text())
    assert template["variables"]["properties"]["image"]["default"] == SETTINGS.image
    assert (pool / "flow-run-job.yaml").read_text().count("serviceAccountName: epdbench-flow") == 1
    assert len(list(pool.glob("[01][0-9]-*.yaml"))) == 11     # with the DCGM exporter's Role and binding
    assert "work-pool/: 11 objects" in capsys.readouterr().out
    dcgm = yaml.safe_load((pool / "05-role-epdbench-flow-gpu-bench-dcgm.yaml").read_text())
    assert dcgm["metadata"]["namespace"] == "gpu-operator"        # the spec's default, the GPU Operator's


@pytest.mark.parametrize("argv, message", [
    (["--image", "x"], "--image: applies with --work-pool only"),
    (["--work-pool"], "--work-pool needs --advertise"),
    (["--work-pool", "--advertise", "127.0.0.1"], "loopback"),
    (["--work-pool", "--advertise", "http://10.0.0.5:4200"], "without scheme or port"),
    (["--work-pool", "--advertise", "10.0.0.5", "--results-claim", "Bad_Name"], "--results-claim"),
])
def test_work_pool_flags_are_checked(tmp_path, capsys, argv, message):
    assert cli_main(["manifests", "--out", str(tmp_path / "m"), *argv]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("argv, message", [
    (["--namespace", "bench"], "--namespace: applies with --work-pool only"),
    (["--worker", "cluster"], "--worker: applies with --work-pool only"),
    (["--work-pool", "kubernetes", "--image", "x"], "--work-pool needs --advertise"),
])
def test_up_refuses_work_pool_flags_out_of_place(tmp_path, capsys, argv, message):
    assert cli_main(["up", "--data-dir", str(tmp_path / "d"), *argv]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "d").exists()                          # refused before anything started


def test_reading_the_dcgm_exporter_is_granted_in_its_namespace_only_and_by_name():
    objects = render_pool_objects(PoolSettings(**{**SETTINGS.__dict__,
                                                  "dcgm_exporter": "gpu-operator/nvidia-dcgm-exporter:9400"}))
    validate_manifests(objects, "1.31")
    validate_manifests(objects, "1.37")
    role = next(o for o in objects if o["kind"] == "Role" and o["metadata"]["namespace"] == "gpu-operator")
    rules = role["rules"]
    # what tasks/k8s/telemetry.py calls: the Service by name, its EndpointSlices, GET through the pods' proxy
    assert allows(rules, "", "services", "get") and allows(rules, "discovery.k8s.io", "endpointslices", "list")
    assert allows(rules, "", "pods/proxy", "get") and allows(rules, "", "services/proxy", "get")
    by_resource = {res: r for r in rules for res in r["resources"]}
    assert by_resource["services"]["resourceNames"] == ["nvidia-dcgm-exporter"]
    assert by_resource["services/proxy"]["resourceNames"] == ["nvidia-dcgm-exporter", "nvidia-dcgm-exporter:9400"]
    assert all(r["verbs"] in (["get"], ["list"]) for r in rules)           # reads only
    assert not allows(rules, "", "pods", "list") and not allows(rules, "", "pods/proxy", "create")
    binding = next(o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["namespace"] == "gpu-operator")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": FLOW_ACCOUNT, "namespace": "gpu-bench"}]
    assert len(objects) == len(render_pool_objects(SETTINGS)) + 2           # none without an exporter
