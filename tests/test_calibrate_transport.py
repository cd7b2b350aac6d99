"""`epdbench calibrate --transport`: the KV link fitted to the connector's own transfer timings, on the GPU lane's
real H100 run (benchmarks/data/h100-2026-12-06/lane-*: vLLM 0.26, NIXL over UCX held to TCP on one host), checked
on that run's client figures; bad input is one line and exit 2."""
from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import pytest

from epdbench.cli import main
from epdbench.specs.models import load_spec
from epdbench.specs.profile import apply_profile, error_bar, load_profile, profile_origin

DATA = Path(__file__).resolve().parents[1] / "benchmarks/data/h100-2026-12-06"
PD = DATA / "lane-pd-nixl-tcp"
ENGINE = DATA / "profile-engine-steps.yaml"


def one_line_error(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: "), err
    return err


def test_the_lanes_lone_transfers_set_the_tcp_link_and_the_client_figures_check_it(tmp_path, capsys):
    out = tmp_path / "link.yaml"
    assert main(["calibrate", "--transport", str(PD), "--config", "pd-nixl-tcp", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "pd-nixl-tcp (nixl over tcp): 27 windows of transfers (decode-0 27), 20 of one transfer" in printed
    assert "7 windows of several transfers left out" in printed
    profile = load_profile(out)
    assert profile["fitted_figures"] == "transfers" and profile["source_target"] == "local"
    assert set(profile["hardware"]) == {"tcp_gb_s"} and 0.42 < profile["hardware"]["tcp_gb_s"] < 0.51
    assert profile["left_as_in_spec"] == ["tcp_latency_ms"]
    # the check: the run's four cells, TTFT far closer with the link measured than with the spec's 3 GB/s
    assert set(profile["cells_fitted"]) == {"pd-nixl-tcp|text", "pd-nixl-tcp|image"}
    assert profile["holdout_error"]["ttft_p50_ms"] < profile["holdout_spec_error"]["ttft_p50_ms"] / 2
    assert profile["holdout_verdict"]["ttft_p50_ms"] == "too few cells"
    assert profile["holdout_tail"]["ttft_p50_ms"]["worst_cell"].startswith("pd-nixl-tcp ")
    spec = load_spec("gpu-qwen25vl")
    assert apply_profile(spec, profile).hardware.tcp_gb_s == profile["hardware"]["tcp_gb_s"]
    assert error_bar(profile, spec).startswith("the KV link fitted to the connector's own transfer timings: its "
                                               "predictions' measured error")
    assert "the KV transfer timings of a run of spec gpu-qwen25vl" in profile_origin(profile)


def test_on_an_engine_step_profile_the_written_profile_carries_both(tmp_path, capsys):
    out = tmp_path / "both.yaml"
    assert main(["calibrate", "--transport", str(DATA / "lane-epd"), "--config", "epd", "--profile", str(ENGINE),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "spec's constants     profile's constants   profile + fitted link" in printed
    engine, profile = load_profile(ENGINE), load_profile(out)
    assert profile["hardware"] == {**engine["hardware"], "tcp_gb_s": profile["hardware"]["tcp_gb_s"]}
    assert profile["op_laws"] == engine["op_laws"] and 0.38 < profile["hardware"]["tcp_gb_s"] < 0.45
    assert profile["source"].endswith(f"on profile {ENGINE}")


def test_a_results_folder_reads_evidence_of_each_pd_configuration(tmp_path, capsys):
    """A compare run's layout: spec.yaml and records.parquet at the top, the logs under evidence/<config>/ (plain
    text); a folder of logs without records is fitted without the check."""
    run = tmp_path / "run"
    (run / "evidence" / "pd-nixl-tcp").mkdir(parents=True)
    (run / "evidence" / "aggregated").mkdir()
    shutil.copy(PD / "spec.yaml", run / "spec.yaml")
    shutil.copy(PD / "records.parquet", run / "records.parquet")
    with gzip.open(PD / "decode-0.log.gz", "rb") as src:
        (run / "evidence" / "pd-nixl-tcp" / "decode-0.log").write_bytes(src.read())
    assert main(["calibrate", "--transport", str(run), "--out", str(tmp_path / "a.yaml")]) == 0
    assert load_profile(tmp_path / "a.yaml")["holdout_error"]
    (run / "records.parquet").unlink()
    assert main(["calibrate", "--transport", str(run / "evidence" / "pd-nixl-tcp"),
                 "--out", str(tmp_path / "b.yaml")]) == 0
    assert "no records.parquet beside the logs: no check" in capsys.readouterr().out
    b = load_profile(tmp_path / "b.yaml")
    assert b["hardware"] == load_profile(tmp_path / "a.yaml")["hardware"] and b["holdout_error"] == {}
    assert error_bar(b).startswith("the KV link fitted to the connector's own transfer timings: no hold-out check")


def test_calibrate_from_a_local_targets_run_records_where_it_ran(tmp_path, capsys):
    """`calibrate --from` on the same lane's records: the profile says the run was on the local target (it once
    ended in a validation traceback after the whole fit)."""
    out = tmp_path / "client.yaml"
    assert main(["calibrate", "--from", str(PD / "records.parquet"), "--out", str(out), "--evaluations", "20"]) == 0
    assert load_profile(out)["source_target"] == "local"


def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys):
    out = ["--out", str(tmp_path / "p.yaml")]
    assert "no such folder" in one_line_error(capsys, ["calibrate", "--transport", str(tmp_path / "none"), *out])
    assert "say which configuration's logs these are with --config (epd, pd-nixl-tcp)" in one_line_error(
        capsys, ["calibrate", "--transport", str(PD), *out])
    assert "--config aggregated: not a PD or EPD configuration" in one_line_error(
        capsys, ["calibrate", "--transport", str(PD), "--config", "aggregated", *out])
    assert "--config: it goes with --transport" in one_line_error(
        capsys, ["calibrate", "--from", str(PD / "records.parquet"), "--config", "epd", *out])
    assert "--from and --transport: give one" in one_line_error(
        capsys, ["calibrate", "--from", str(PD / "records.parquet"), "--transport", str(PD), *out])
    assert "--spec vllm-truth is not the spec the run used" in one_line_error(
        capsys, ["calibrate", "--transport", str(PD), "--spec", "vllm-truth", *out])
    # logs without a timed window (MooncakeConnector's lines carry no transfer time)
    folder = tmp_path / "pd-tcp"
    folder.mkdir()
    (folder / "prefill-0.log").write_text(
        "(APIServer pid=1) INFO 10-01 12:00:00 [metrics.py:103] KV Transfer metrics: Num successful transfers=3, "
        "Avg MB per transfer=28.0, Num failed transfers=0, Num failed recvs=0, Num KV expired reqs=0\n")
    assert "spec vllm-truth has no PD or EPD configuration" in one_line_error(
        capsys, ["calibrate", "--transport", str(folder), "--spec", "vllm-truth", *out])
    err = one_line_error(capsys, ["calibrate", "--transport", str(folder), "--spec", "smoke", *out])
    assert "0 lone tcp transfer window(s)" in err and "calibrate --from" in err
    assert "neither a results folder" in one_line_error(
        capsys, ["calibrate", "--transport", str(tmp_path), "--spec", "smoke", *out])
    assert not (tmp_path / "p.yaml").exists()


def test_rdma_configurations_with_different_nic_counts_are_pooled_per_nic(tmp_path, capsys):
    """pd-nixl-rdma on one NIC and a copy of it on two, each sender at 60 % of its line rate: one rdma_efficiency
    of 0.6 (pooling their rates and dividing by the last configuration's NICs gave a figure for neither)."""
    import yaml
    from epdbench.analysis.ucx import MIB
    spec = load_spec("pd-nixl").model_dump(mode="json")
    one = next(c for c in spec["configurations"] if c["name"] == "pd-nixl-rdma")
    two = {**one, "name": "pd-nixl-rdma-2nic", "roles": [{**r, "rdma_interfaces": 2} for r in one["roles"]]}
    spec["configurations"] = [one, two]
    run = tmp_path / "run"
    run.mkdir()
    (run / "spec.yaml").write_text(yaml.safe_dump(spec))
    hw = load_spec("pd-nixl").hardware
    size = 40 * MIB
    for config, nics in (("pd-nixl-rdma", 1), ("pd-nixl-rdma-2nic", 2)):
        rate = 0.6 * hw.rdma_nic_gbit_s / 8 * 1e9 * nics
        ms = (size / rate + hw.rdma_latency_ms / 1e3) * 1e3
        lines = [("(APIServer pid=9) INFO 12-06 08:55:%02d [metrics.py:103] KV Transfer metrics: Num successful "
                  "transfers=1, Avg xfer time (ms)=%.4f, P90 xfer time (ms)=%.4f, Avg post time (ms)=0.0, P90 post "
                  "time (ms)=0.0, Avg MB per transfer=40.0, Throughput (MB/s)=1.0, Avg number of descriptors=28.0\n")
                 % (s, ms, ms) for s in range(6)]
        (run / "evidence" / config).mkdir(parents=True)
        (run / "evidence" / config / "decode-0.log").write_text("".join(lines))
    out = tmp_path / "rdma.yaml"
    assert main(["calibrate", "--transport", str(run), "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "12 lone transfers" in printed and "MB/s per NIC" in printed
    assert load_profile(out)["hardware"]["rdma_efficiency"] == pytest.approx(0.6, rel=1e-3)
