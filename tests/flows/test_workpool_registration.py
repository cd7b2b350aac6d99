"""The work pool and the deployments on it, on a real (ephemeral) Prefect API: created, then updated with a
new template; a pool of that name with another worker type refused; both deployments target the pool by
module path, and the Job a run of each gets carries the image."""
from __future__ import annotations

import uuid

import pytest

from epdbench.flows import deployments
from epdbench.manifests.workpool import PoolSettings
from epdbench.tasks.k8s.workpool import ensure_work_pool, flow_run_job, pool_template


def test_pool_created_updated_refused_and_deployments_registered_on_it():
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    name = f"epdbench-test-{uuid.uuid4().hex[:8]}"
    settings = PoolSettings(image="registry.example/epdbench:0.1.0", namespace="bench",
                            prefect_api="http://10.0.0.5:4200/api", mlflow_uri="http://10.0.0.5:5000", pool=name)
    assert ensure_work_pool(name, pool_template(settings)) == "created"
    moved = PoolSettings(**{**settings.__dict__, "mlflow_uri": "http://10.0.0.6:5000"})
    assert ensure_work_pool(name, pool_template(moved)) == "updated"
    with get_client(sync_client=True) as client:
        template = client.read_work_pool(name).base_job_template
        assert template["variables"]["properties"]["env"]["default"]["MLFLOW_TRACKING_URI"] == moved.mlflow_uri
        client.create_work_pool(WorkPoolCreate(name=f"{name}-p", type="process"))
    with pytest.raises(RuntimeError, match="type process, not kubernetes"):
        ensure_work_pool(f"{name}-p", pool_template(settings))

    deployments.main(["--work-pool", name, "--image", "registry.example/epdbench:0.2.0", "--namespace", "bench",
                      "--nightly-preset", "pd-text"])
    with get_client(sync_client=True) as client:
        found = {d.name: d for d in client.read_deployments() if d.work_pool_name == name}
    assert set(found) == {"nightly-comparison", "adhoc-comparison"}
    nightly = found["nightly-comparison"]
    assert nightly.entrypoint == "epdbench.flows.deployments.nightly_comparison"
    assert nightly.parameters["request"] == {**nightly.parameters["request"], "preset": "pd-text",
                                             "target": "kubernetes", "namespace": "bench"}
    for d in found.values():
        job = flow_run_job(template, d.job_variables)
        (container,) = job["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example/epdbench:0.2.0" and job["metadata"]["namespace"] == "bench"
