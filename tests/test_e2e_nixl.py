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


@pytest.fixture(scope="module")
def lone_transfers_run(tmp_path_factory, tiny_spec_path):
    """PD over NIXL, TCP and RDMA, one request at a time, each longer than vLLM's 1-second stats interval: every
    stats window holds one transfer."""
    work = tmp_path_factory.mktemp("link")
    spec = yaml.safe_load(tiny_spec_path.read_text())
    pd = next(c for c in spec["configurations"] if c["name"] == "pd-tcp")
    rdma = next(c for c in spec["configurations"] if c["name"] == "pd-rdma")
    spec["configurations"] = [{**pd, "name": "pd-nixl-tcp", "kv_connector": "nixl"},
                              {**rdma, "name": "pd-nixl-rdma", "kv_connector": "nixl"}]
    spec["suites"] = [{"kind": "fixed", "name": "long", "shapes": [{"input_tokens": 8192, "output_tokens": 128}],
                       "concurrencies": [1], "n_warmup": 0, "n_measured": 7}]
    (work / "link.yaml").write_text(yaml.safe_dump(spec))
    out = work / "results"
    proc = epdbench("compare", "--spec", str(work / "link.yaml"), "--out", str(out),
                    "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}", cwd=work)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return out, spec["hardware"]


def test_calibrate_transport_reads_the_link_back_from_the_emulated_windows(lone_transfers_run, tmp_path):
    """`calibrate --transport` on the simulator's own run gives back the spec's link: the emulated NixlConnector
    windows time the READ on the link (not the HTTP exchange around it). The HTTP simulator's timers wake up to
    about a millisecond late per wait, so an RDMA transfer of 13 ms reads up to about 15 % slow."""
    from epdbench.specs.profile import error_bar, load_profile
    results, hardware = lone_transfers_run
    proc = epdbench("calibrate", "--transport", str(results), "--out", str(tmp_path / "link.yaml"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "note: the run was made by the simulator" in proc.stdout
    profile = load_profile(tmp_path / "link.yaml")
    assert profile["source_target"] == "sim" and error_bar(profile).startswith("fitted to a simulator run")
    assert profile["hardware"]["tcp_gb_s"] == pytest.approx(hardware["tcp_gb_s"], rel=0.1)
    assert profile["hardware"]["rdma_efficiency"] == pytest.approx(0.73, rel=0.2)      # the spec's default
    assert "rdma_efficiency" not in hardware
