"""The load generator as a real Job next to a served configuration (its records back whole through pods/log, each
planned request once, the Job and its pod gone after; a Job that fails, reported with what it left), and the work
pool's objects applied and deleted (cluster-scoped ones included; the DCGM exporter's Role only where its namespace
is), against the real control plane. Moved here from the fake API server."""
from __future__ import annotations

import asyncio
import itertools

import pytest

from epdbench.manifests.workpool import PoolSettings, render_pool_objects
from epdbench.specs.models import KubernetesTargetSpec, spec_to_yaml
from epdbench.specs.workload import build_requests, plan_cells
from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.k8s.loadgen import run_loadgen_job
from epdbench.tasks.k8s.workpool import apply_pool_objects, delete_pool_objects
from epdbench.tasks.load.loadgen import LoadGenerator
from tests.cluster.space import RUN_ID

pytestmark = pytest.mark.cluster      # the tier runs apart (-m cluster), in its network namespace
VERSION = "1.37"
_dcgm = itertools.count()


def names(cp, ns: str, plural: str, root: str = "/api/v1") -> list[str]:
    status, body = cp.request("GET", f"{root}/namespaces/{ns}/{plural}")
    assert status == 200, body
    return sorted(o["metadata"]["name"] for o in body["items"])


def test_a_suite_measured_by_a_job_returns_every_planned_request_once(space):
    spec, dep = space.start("aggregated")
    try:
        config = spec.configuration("aggregated")
        result = run_loadgen_job(dep.api, spec, config, RUN_ID, "fixed", spec_to_yaml(spec), None, VERSION,
                                 timeout_s=120, poll_s=0.2)
        assert result.complete, result.problem
        planned = {c.cell_id: sorted(r.prompt_hash for r in build_requests(spec, c, 0))
                   for c in plan_cells(spec) if c.suite == "fixed"}
        seen: dict[str, list[str]] = {}
        for r in result.records:
            assert r["ok"], r["error"]
            seen.setdefault(r["cell"], []).append(r["prompt_hash"])
        assert {cell: sorted(h) for cell, h in seen.items()} == planned
        assert set(result.noise) == {(cell, 0) for cell in planned}
        assert names(space.cp, space.name, "jobs", "/apis/batch/v1") == []        # the Job went after the read ...
        assert space.player.wait(lambda: not any(n.startswith("aggregated-loadgen") for n in
                                                 names(space.cp, space.name, "pods")), 30)   # ... its pod by the GC
        assert names(space.cp, space.name, "configmaps") == ["aggregated-loadgen", "kube-root-ca.crt"]
        # the outside path (the runner through a port-forward) sends the very same requests
        outside = []
        for cell in (c for c in plan_cells(spec) if c.suite == "fixed"):
            async def go(cell=cell):
                async with LoadGenerator(dep.endpoint, spec.model.name, timeout_s=60) as lg:
                    return await lg.run_cell(build_requests(spec, cell, 0), cell.concurrency)
            outside += [(cell.cell_id, r.phase, r.prompt_hash) for r in asyncio.run(go())]
        inside = [(r["cell"], r["phase"], r["prompt_hash"]) for r in result.records]
        assert len(inside) == len(outside) and sorted(inside) == sorted(outside)
    finally:
        k8s_target.stop(dep)
    space.assert_nothing_left()


def test_a_job_whose_suite_is_unknown_fails_and_is_reported_with_no_records(space):
    spec, dep = space.start("aggregated")
    try:
        data_yaml = spec_to_yaml(spec).replace("name: fixed", "name: renamed")   # the Job's spec lacks its suite
        result = run_loadgen_job(dep.api, spec, spec.configuration("aggregated"), RUN_ID, "fixed", data_yaml, None,
                                 VERSION, timeout_s=60, poll_s=0.2)
        assert not result.complete and result.records == []
        assert "no end line after 0 records" in result.problem
        assert "(Job aggregated-loadgen-fixed failed)" in result.problem     # the Job controller's Failed condition
    finally:
        k8s_target.stop(dep)
    space.assert_nothing_left()


def settings(space, **kw) -> PoolSettings:
    return PoolSettings(image="registry.example/epdbench:0.1.0", namespace=space.name,
                        prefect_api="http://127.0.0.1:4200/api", mlflow_uri="http://127.0.0.1:5000", **kw)


def flows_objects(cp, ns: str) -> list[tuple[str, str]]:
    found = []
    for root, plural, kind, scoped in (("/api/v1", "serviceaccounts", "ServiceAccount", True),
                                       ("/apis/rbac.authorization.k8s.io/v1", "roles", "Role", True),
                                       ("/apis/rbac.authorization.k8s.io/v1", "rolebindings", "RoleBinding", True),
                                       ("/apis/apps/v1", "deployments", "Deployment", True),
                                       ("/apis/rbac.authorization.k8s.io/v1", "clusterroles", "ClusterRole", False),
                                       ("/apis/rbac.authorization.k8s.io/v1", "clusterrolebindings",
                                        "ClusterRoleBinding", False)):
        path = f"{root}/namespaces/{ns}/{plural}" if scoped else f"{root}/{plural}"
        _, body = cp.request("GET", f"{path}?labelSelector=epdbench/component%3Dflows")
        found += [(kind, o["metadata"]["name"]) for o in body["items"]
                  if scoped or o["metadata"]["name"].endswith(f"-{ns}")]
    return sorted(found)


def test_pool_objects_are_applied_and_the_worker_deleted_alone(space):
    target = KubernetesTargetSpec(kubeconfig=str(space.kubeconfig))
    objects = render_pool_objects(settings(space), worker_in_cluster=True)
    api = apply_pool_objects(target, objects)
    assert flows_objects(space.cp, space.name) == sorted((o["kind"], o["metadata"]["name"]) for o in objects)
    worker = [o for o in objects if o["kind"] == "Deployment"]
    assert delete_pool_objects(api, worker) == []
    left = flows_objects(space.cp, space.name)
    assert not [k for k, _ in left if k == "Deployment"] and ("ServiceAccount", "epdbench-flow") in left
    assert delete_pool_objects(api, [o for o in objects if o["kind"] != "Deployment"]) == []


def test_the_dcgm_exporters_rights_are_applied_in_its_namespace_or_skipped_without_it(space, capsys):
    target = KubernetesTargetSpec(kubeconfig=str(space.kubeconfig))
    dcgm_ns = f"gpu-operator-{next(_dcgm)}-{space.name}"[:63].rstrip("-")
    objects = render_pool_objects(settings(space, dcgm_exporter=f"{dcgm_ns}/dcgm:9400"))
    apply_pool_objects(target, objects)                              # no such namespace: said, skipped
    out = capsys.readouterr().out
    assert f"not applied: no namespace {dcgm_ns}" in out and "flow runs will have no GPU telemetry" in out
    assert ("Role", "epdbench-flow") in flows_objects(space.cp, space.name)      # the rest is applied
    space.cp.ensure_namespace(dcgm_ns)
    api = apply_pool_objects(target, objects)
    assert names(space.cp, dcgm_ns, "roles", "/apis/rbac.authorization.k8s.io/v1") == [f"epdbench-flow-{space.name}-dcgm"]
    ours = [o for o in objects if o["metadata"].get("namespace") == dcgm_ns]
    assert delete_pool_objects(api, ours) == []
    assert names(space.cp, dcgm_ns, "roles", "/apis/rbac.authorization.k8s.io/v1") == []
    assert delete_pool_objects(api, [o for o in objects if o["metadata"].get("namespace") != dcgm_ns]) == []
