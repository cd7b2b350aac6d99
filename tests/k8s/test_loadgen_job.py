"""The load generator as a Job in the (fake) cluster: applied next to a served configuration, it runs
`epdbench loadgen` against the router's Service, and its records come back whole through pods/log — the
planned requests, each once — before the Job goes; a Job that fails is reported with what it left."""
from __future__ import annotations

import asyncio

import pytest

from epdbench.specs.models import spec_to_yaml
from epdbench.specs.workload import build_requests, plan_cells
from epdbench.tasks.k8s import target as k8s_target
from epdbench.tasks.k8s.loadgen import job_state, run_loadgen_job
from epdbench.tasks.load.loadgen import LoadGenerator
from tests.k8s.fake_apiserver import cluster  # noqa: F401
from tests.tasks.k8s.test_k8s_target import assert_nothing_left, start_config


def test_a_suite_measured_by_a_job_returns_every_planned_request_once(cluster, tmp_path):  # noqa: F811
    fake = cluster()
    spec, dep = start_config(fake, tmp_path, "aggregated")
    try:
        config = spec.configuration("aggregated")
        result = run_loadgen_job(dep.api, spec, config, "run-1", "fixed", spec_to_yaml(spec), None, "1.31",
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
        assert not fake.objects("Job")                                   # the Job and its pod went after the read
        assert [o["metadata"]["name"] for o in fake.objects("ConfigMap")] == ["aggregated-loadgen"]
        # the outside path (the runner through the API server's proxy) sends the very same requests
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
    assert_nothing_left(fake)


def test_a_job_whose_suite_is_unknown_fails_and_is_reported_with_no_records(cluster, tmp_path):  # noqa: F811
    fake = cluster()
    spec, dep = start_config(fake, tmp_path, "aggregated")
    try:
        data_yaml = spec_to_yaml(spec).replace("name: fixed", "name: renamed")   # the Job's spec lacks its suite
        result = run_loadgen_job(dep.api, spec, spec.configuration("aggregated"), "run-1", "fixed", data_yaml, None,
                                 "1.31", timeout_s=60, poll_s=0.2)
        assert not result.complete and result.records == []
        assert "no end line after 0 records" in result.problem and "(Job aggregated-loadgen-fixed failed)" in result.problem
    finally:
        k8s_target.stop(dep)
    assert_nothing_left(fake)


@pytest.mark.parametrize("status,state", [({"active": 1}, None), ({"succeeded": 1}, "complete"),
                                          ({"conditions": [{"type": "Failed", "status": "True"}]}, "failed")])
def test_job_state(status, state):
    assert job_state({"status": status}) == state
