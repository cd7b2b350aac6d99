"""End to end on the simulator: PD over NixlConnector (TCP and RDMA) and EPD's encoder outputs over NIXL, verified
per pod, worker and lane from the emulated UCX and NIXL lines, and shown in the report."""
import json

import pytest
import yaml

from tests.test_e2e_compare import epdbench

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def nixl_run(tmp_path_factory, tiny_spec_path):
    work = tmp_path_factory.mktemp("nixl")
    spec = yaml.safe_load(tiny_spec_path.read_text())
    pd = next(c for c in spec["configurations"] if c["name"] == "pd-tcp")
    rdma = next(c for c in spec["configurations"] if c["name"] == "pd-rdma")
    epd = next(c for c in spec["configurations"] if c["name"] == "epd")
    spec["configurations"] = [{**pd, "name": "pd-nixl-tcp", "kv_connector": "nixl"},
                              {**rdma, "name": "pd-nixl-rdma", "kv_connector": "nixl"}, epd]
    spec["suites"] = [s for s in spec["suites"] if s["kind"] in ("fixed", "multimodal")]
    (work / "nixl.yaml").write_text(yaml.safe_dump(spec))
    out = work / "results"
    proc = epdbench("compare", "--spec", str(work / "nixl.yaml"), "--out", str(out),
                    "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", cwd=work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out


@pytest.mark.parametrize("config,transport,lane", [("pd-nixl-tcp", "tcp", "tcp/eth0"),
                                                    ("pd-nixl-rdma", "rdma", "rc_mlx5/sim_mlx5_0:1")])
def test_nixl_kv_is_emulated_per_pod_worker_and_lane(nixl_run, config, transport, lane):
    t = json.loads((nixl_run / f"evidence/{config}/transport.json").read_text())
    assert t["verdict"] == "emulated" and t["connector"] == "nixl"
    for name, pod in t["pods"].items():
        assert pod["observed"] == transport, name
        lanes = {f"{x['tl']}/{x['device']}" for w in pod["workers"].values() for c in w["configs"]
                 if c["scope"] != "self" for x in c["lanes"]}
        assert lanes == {lane}, (name, lanes)
    # NixlConnector's decode reads the KV and counts it; the volume matches the prompts
    decode = next(p for n, p in t["pods"].items() if n.startswith("decode"))
    assert decode["successful_transfers"] > 0 and not t["kv_check"]["bytes"] is None
    report = (nixl_run / "report.md").read_text()
    assert f"| {config} | `emulated` |" in report
    assert any(line.startswith("  - worker decode-0 ") and f"UCX {transport} ({lane})" in line
               for line in report.splitlines()), report[-3000:]


def test_epd_report_shows_the_encoder_outputs_verdict_next_to_the_kv(nixl_run):
    report = (nixl_run / "report.md").read_text()
    assert "| epd | `emulated` | `emulated` |" in report
    assert "emulated; encoder outputs emulated" in report
    ec = json.loads((nixl_run / "evidence/epd/ec_transport.json").read_text())
    assert {n.split("-")[0] for n in ec["pods"]} == {"encode", "prefill"}
    assert all(p["observed"] == "tcp" for p in ec["pods"].values())
