"""Genuine KV transport: the simulator moves real bytes through the real Mooncake transfer engine
(loopback TCP), and the verifier reads Mooncake's own lines: verified for TCP, mismatch for RDMA."""
import asyncio
import time

import pytest

from epdbench.analysis.mooncake_log import transport_of_pod
from epdbench.analysis.transport import verify_transport
from epdbench.specs.models import parse_spec
from epdbench.specs.workload import build_requests, plan_cells
from epdbench.tasks.sim import target as sim_target
from epdbench.tasks.evidence import iter_lines
from epdbench.tasks.load.loadgen import LoadGenerator

mooncake = pytest.importorskip("mooncake.engine", reason="needs the mooncake extra and Debian's libibverbs1",
                               exc_type=ImportError)


@pytest.mark.parametrize("config,verdict,reason", [
    ("pd-tcp", "verified", "installed TCP"),
    ("pd-rdma", "mismatch", "installed TCP (0 HCAs found"),
])
def test_genuine_transport_is_verified_from_mooncake_lines(tiny_spec, tmp_path, config, verdict, reason):
    data = tiny_spec.model_dump(mode="json")
    data["target"]["sim"]["kv_engine"] = "mooncake"
    spec = parse_spec(data)
    spec_path = tmp_path / "spec.yaml"
    from epdbench.specs.models import spec_to_yaml
    spec_path.write_text(spec_to_yaml(spec))
    dep = sim_target.start(spec, spec.configuration(config), spec_path, tmp_path / "logs")
    try:
        cell = next(c for c in plan_cells(spec) if c.kind == "fixed")

        async def go():
            async with LoadGenerator(dep.endpoint, spec.model.name, 60) as lg:
                return await lg.run_cell(build_requests(spec, cell)[:3], 3)
        assert all(r.ok for r in asyncio.run(go()))
        time.sleep(1.5)  # one Mooncake metrics window (MC_TE_METRIC_INTERVAL_SECONDS=1)
        pods = {p.name: transport_of_pod(iter_lines(p.log_path)) for p in dep.engines}
    finally:
        sim_target.stop(dep)
    result = verify_transport(spec.configuration(config).kv_transport, pods)
    assert result["verdict"] == verdict, result["reasons"]
    assert any(reason in r for r in result["reasons"]), result["reasons"]
    if verdict == "mismatch":   # one reason names each pod and worker (glog thread) that fell back alike
        assert any(r.startswith("expected rdma; 2 workers (decode-0 thread ") and "; prefill-0 thread " in r
                   for r in result["reasons"]), result["reasons"]
    assert not any(p["emulated"] for p in pods.values())
    assert result["throughput_mb_s_max"] and result["throughput_mb_s_max"] > 0
